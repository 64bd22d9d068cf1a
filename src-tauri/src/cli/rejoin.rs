//! A rank of `serve --cluster` that lost its cluster starts again in place, to rejoin it. MLX
//! keeps the group a process joined for the life of the process (a second join hands back the
//! broken one, and there is no call to free it), so rejoining takes a new process image: the
//! same program, arguments and process id. Rank 0's listening sockets are passed on, so its
//! port stays open throughout; every other descriptor (MLX's sockets among them) is closed, so
//! the other ranks see this one go and the new image can bind MLX's port again: marked
//! close-on-exec before the exec, and closed by the new image first thing (`close_leftovers`)
//! should one have been opened after that.

/// The environment entry that tells the new image why the old one started it (shown while
/// the cluster forms again).
pub const RESTARTED_AFTER_VAR: &str = "FASTMLX_RESTARTED_AFTER";

/// Replaces this process with a fresh start of itself; `why` is logged and passed on. Returns
/// only if that fails, by ending the process with an error.
pub fn restart(why: &str) -> ! {
    restart_with(why, &[], &[])
}

/// [`restart`], with `env` entries set for the new image and the `clear` ones removed.
pub fn restart_with(why: &str, env: &[(&str, String)], clear: &[&str]) -> ! {
    eprintln!("{why}\nstarting again to rejoin the cluster");
    // A worker tells rank 0 why it goes, so that it is not taken for the machine lost.
    crate::cluster::presence::leave(why);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let (listening, keep) = crate::server::listen::to_pass_on();
        close_on_exec_all_but(&keep);
        let error = match std::env::current_exe() {
            Ok(program) => {
                let mut command = std::process::Command::new(program);
                command.args(std::env::args_os().skip(1));
                for key in clear {
                    command.env_remove(key);
                }
                command
                    .env(RESTARTED_AFTER_VAR, why)
                    .env(crate::server::listen::INHERITED_VAR, listening)
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .exec()
            }
            Err(e) => e,
        };
        eprintln!("error: cannot start again: {error}");
    }
    std::process::exit(1)
}

/// First thing in a process image started by [`restart`]: closes every socket past the
/// standard three descriptors that was not passed on on purpose. The image before marked the
/// others close-on-exec, but a socket MLX's threads opened between that listing and the exec
/// would otherwise live on here, holding a port or a peer's connection open. Only sockets: the
/// libraries' initialisers (run before `main`) may have opened files of their own.
pub fn close_leftovers() {
    #[cfg(unix)]
    if restarted_after().is_some() {
        let passed: Vec<i32> = crate::server::listen::passed_on().into_iter().map(|(_, fd)| fd).collect();
        close_all_but(&passed);
    }
}

#[cfg(unix)]
fn close_all_but(keep: &[i32]) {
    for fd in open_descriptors().into_iter().filter(|fd| *fd > 2 && !keep.contains(fd)) {
        // SAFETY: this runs first in `main`, before this image opens a socket of its own: a
        // socket here is the image before's; one no longer open (the listing's own) fails
        // harmlessly.
        unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut stat) == 0 && (stat.st_mode & libc::S_IFMT) == libc::S_IFSOCK {
                libc::close(fd);
            }
        }
    }
}

/// This process's open descriptors, the listing's own included.
#[cfg(unix)]
fn open_descriptors() -> Vec<i32> {
    match std::fs::read_dir("/dev/fd") {
        Ok(entries) => entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        // No listing: every descriptor up to the limit.
        Err(_) => (3..1024).collect(),
    }
}

/// Why the process before this one started it, if it did.
pub fn restarted_after() -> Option<String> {
    std::env::var(RESTARTED_AFTER_VAR).ok().filter(|why| !why.is_empty())
}

/// Every open descriptor past the standard three closes on exec, except `keep`, which stays
/// open.
#[cfg(unix)]
fn close_on_exec_all_but(keep: &[i32]) {
    // Listed first, changed after: the listing holds a descriptor of its own.
    for fd in open_descriptors().into_iter().filter(|&fd| fd > 2) {
        // SAFETY: flags of descriptors of this process, which is about to be replaced; a
        // descriptor closed since the listing fails harmlessly.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 {
                continue;
            }
            let flags = if keep.contains(&fd) { flags & !libc::FD_CLOEXEC } else { flags | libc::FD_CLOEXEC };
            libc::fcntl(fd, libc::F_SETFD, flags);
        }
    }
}
