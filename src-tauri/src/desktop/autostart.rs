//! Launch at login, the way each desktop does it: a LaunchAgent property list on macOS, an XDG
//! autostart entry on Linux. The app starts hidden (`fastmlx app --hidden`): only the menu-bar
//! icon appears.

use std::path::{Path, PathBuf};

/// Where the login entry lives, and what it says.
pub struct Autostart {
    entry: PathBuf,
    contents: String,
}

impl Autostart {
    /// The entry for this user and this executable; `None` where the platform has no such thing.
    pub fn for_current_user() -> Option<Autostart> {
        let exe = std::env::current_exe().ok()?;
        let home = directories::BaseDirs::new()?;
        Autostart::new(home.home_dir(), std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).as_deref(), &exe)
    }

    #[cfg(target_vendor = "apple")]
    pub fn new(home: &Path, _xdg_config: Option<&Path>, exe: &Path) -> Option<Autostart> {
        let exe = xml_escape(&exe.display().to_string());
        let contents = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>dev.fastmlx.app</string>
  <key>ProgramArguments</key><array><string>{exe}</string><string>app</string><string>--hidden</string></array>
  <key>RunAtLoad</key><true/>
  <key>ProcessType</key><string>Interactive</string>
</dict>
</plist>
"#
        );
        Some(Autostart { entry: home.join("Library/LaunchAgents/dev.fastmlx.app.plist"), contents })
    }

    #[cfg(all(unix, not(target_vendor = "apple")))]
    pub fn new(home: &Path, xdg_config: Option<&Path>, exe: &Path) -> Option<Autostart> {
        let config = xdg_config.map_or_else(|| home.join(".config"), Path::to_path_buf);
        // Desktop-entry Exec quoting: the path in double quotes, with `"`, `` ` ``, `$` and `\` escaped.
        let quoted: String = exe
            .display()
            .to_string()
            .chars()
            .flat_map(|c| if "\"`$\\".contains(c) { vec!['\\', c] } else { vec![c] })
            .collect();
        let contents = format!(
            "[Desktop Entry]\nType=Application\nName=FastMLX\nComment=Local LLM server\nExec=\"{quoted}\" app --hidden\nTerminal=false\nX-GNOME-Autostart-enabled=true\n"
        );
        Some(Autostart { entry: config.join("autostart/fastmlx.desktop"), contents })
    }

    #[cfg(not(unix))]
    pub fn new(_home: &Path, _xdg_config: Option<&Path>, _exe: &Path) -> Option<Autostart> {
        None
    }

    pub fn entry(&self) -> &Path {
        &self.entry
    }

    pub fn is_enabled(&self) -> bool {
        self.entry.is_file()
    }

    pub fn set_enabled(&self, enabled: bool) -> std::io::Result<()> {
        if enabled {
            if let Some(dir) = self.entry.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&self.entry, &self.contents)
        } else {
            match std::fs::remove_file(&self.entry) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

#[cfg(target_vendor = "apple")]
fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn enable_writes_the_entry_and_disable_removes_it() {
        let home = tempfile::tempdir().unwrap();
        let a = Autostart::new(home.path(), None, Path::new("/opt/Fast MLX/fastmlx")).unwrap();
        assert!(!a.is_enabled());
        a.set_enabled(true).unwrap();
        assert!(a.is_enabled());
        let text = std::fs::read_to_string(a.entry()).unwrap();
        assert!(text.contains("/opt/Fast MLX/fastmlx") && text.contains("--hidden"), "{text}");
        #[cfg(not(target_vendor = "apple"))]
        {
            assert!(a.entry().ends_with(".config/autostart/fastmlx.desktop"));
            assert!(text.contains("Exec=\"/opt/Fast MLX/fastmlx\" app --hidden"), "{text}");
        }
        a.set_enabled(false).unwrap();
        assert!(!a.is_enabled());
        a.set_enabled(false).unwrap();
    }

    #[cfg(not(target_vendor = "apple"))]
    #[test]
    fn xdg_config_home_is_honoured_and_paths_are_quoted() {
        let home = tempfile::tempdir().unwrap();
        let xdg = home.path().join("xdg");
        let a = Autostart::new(home.path(), Some(&xdg), Path::new("/a\"b$c/fastmlx")).unwrap();
        assert_eq!(a.entry(), xdg.join("autostart/fastmlx.desktop"));
        assert!(a.contents.contains(r#"Exec="/a\"b\$c/fastmlx" app --hidden"#), "{}", a.contents);
    }
}
