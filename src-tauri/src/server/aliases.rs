//! Model names other tools ask for, mapped to local models: Ollama clients ask for `qwen2.5:7b`,
//! Claude Code for `claude-sonnet-4-5`. An alias is `name=target`; a name ending in `*` matches
//! every name it begins; an empty target means the model served now (the most recently used).

/// `claude-*` goes to the model served now unless configured otherwise, so Claude Code works
/// without setup.
pub const DEFAULT_ALIASES: &[(&str, &str)] = &[("claude-*", "")];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub name: String,
    pub target: String,
}

impl std::str::FromStr for Alias {
    type Err = String;

    fn from_str(s: &str) -> Result<Alias, String> {
        let (name, target) = s.split_once('=').ok_or_else(|| format!("alias {s:?}: expected NAME=MODEL"))?;
        let name = name.trim();
        if name.is_empty() || name.strip_suffix('*').unwrap_or(name).contains('*') {
            return Err(format!("alias {s:?}: the name must be non-empty, with `*` only at its end"));
        }
        Ok(Alias { name: name.to_string(), target: target.trim().to_string() })
    }
}

pub fn defaults() -> Vec<Alias> {
    DEFAULT_ALIASES.iter().map(|(name, target)| Alias { name: name.to_string(), target: target.to_string() }).collect()
}

/// What `requested` names: `Some(target)` when an alias matches (exact names before patterns,
/// longer patterns first; `Some("")` = the model served now), else `None`.
pub fn resolve<'a>(aliases: &'a [Alias], requested: &str) -> Option<&'a str> {
    let lower = requested.to_ascii_lowercase();
    if let Some(a) = aliases.iter().find(|a| !a.name.ends_with('*') && a.name.eq_ignore_ascii_case(requested)) {
        return Some(&a.target);
    }
    aliases
        .iter()
        .filter_map(|a| a.name.strip_suffix('*').map(|prefix| (prefix, a)))
        .filter(|(prefix, _)| lower.starts_with(&prefix.to_ascii_lowercase()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, a)| a.target.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_then_longest_pattern() {
        let aliases: Vec<Alias> =
            ["qwen2.5:7b=mlx-community/Qwen2.5-7B-Instruct-4bit", "claude-*=", "claude-opus-*=big", "CLAUDE-X=x"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
        assert_eq!(resolve(&aliases, "qwen2.5:7b"), Some("mlx-community/Qwen2.5-7B-Instruct-4bit"));
        assert_eq!(resolve(&aliases, "claude-sonnet-4-5"), Some(""));
        assert_eq!(resolve(&aliases, "claude-opus-4-1"), Some("big"));
        assert_eq!(resolve(&aliases, "claude-x"), Some("x"));
        assert_eq!(resolve(&aliases, "llama3"), None);
        assert!("no-equals".parse::<Alias>().is_err());
        assert!("a*b=c".parse::<Alias>().is_err());
        assert!("=c".parse::<Alias>().is_err());
        assert_eq!("modè=x".parse::<Alias>().unwrap().name, "modè", "a multi-byte last character");
    }
}
