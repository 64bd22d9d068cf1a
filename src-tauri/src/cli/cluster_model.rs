//! The model a rank of `serve --cluster` serves, as `serve` takes it (a file, a folder or a
//! local model id, `fastmlx ls`), except that an `org/name` of the Hub this machine does not
//! have is pulled first, verified as any pull: a Mac that lacks the model gets it from its own
//! network rather than failing to join. A rank that starts again in place finds it local.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::hub::HubClient;
use crate::store::{Catalog, PullRequest, PullState, Pulls, StorePaths};

/// How often a pull's progress is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The model's path on this machine, pulled there if it is a Hub repo absent here; `who` names
/// this rank in messages.
pub fn local_or_pulled(given: &Path, who: &str) -> anyhow::Result<PathBuf> {
    if given.exists() {
        return Ok(given.to_path_buf());
    }
    let id = given.to_string_lossy();
    let paths = StorePaths::from_env();
    if let Ok(model) = Catalog::new(paths.clone()).find(&id) {
        return Ok(model.path);
    }
    if !looks_like_repo(&id) {
        anyhow::bail!(
            "{who}: {id} is no file, folder or local model here (`fastmlx ls`), nor a Hub repo to pull (org/name)"
        );
    }
    eprintln!("{who}: {id} is not on this machine: pulling it from the Hub");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let state = runtime.block_on(pull(paths, &id, who));
    match state {
        PullState::Done { path, .. } => {
            eprintln!("{who}: {id} pulled to {}", path.display());
            Ok(path)
        }
        PullState::Failed { message } => {
            anyhow::bail!("{who}: {id} is not on this machine and could not be pulled: {message}")
        }
        PullState::Cancelled | PullState::Running => anyhow::bail!("{who}: pulling {id} did not finish"),
    }
}

async fn pull(paths: StorePaths, repo: &str, who: &str) -> PullState {
    let pulls = Pulls::new(paths, HubClient::from_env());
    let watch = pulls.start(PullRequest { repo: repo.to_string(), revision: "main".into(), gguf: None });
    let progress = watch.progress.clone();
    let finished = watch.finished();
    tokio::pin!(finished);
    let mut ticks = tokio::time::interval(PROGRESS_EVERY);
    ticks.tick().await;
    loop {
        tokio::select! {
            state = &mut finished => return state,
            _ = ticks.tick() => {
                let p = progress.borrow().clone();
                eprintln!("{who}: pulling {repo}: {} of {} MB, file {} of {}", p.done >> 20, p.total >> 20, p.files_done, p.files_total);
            }
        }
    }
}

/// `org/name` as the Hub spells a repo (not a relative path that happens to have one slash).
fn looks_like_repo(id: &str) -> bool {
    let Some((org, name)) = id.split_once('/') else { return false };
    let part = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    part(org) && part(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_repos_are_told_from_paths() {
        assert!(looks_like_repo("mlx-community/Qwen3-4B-4bit"));
        assert!(looks_like_repo("org/name.v2"));
        for not in ["model.gguf", "./x/y", "../x", "/abs/x", "a/b/c", "org/", "/name", "org/na me", "~/m"] {
            assert!(!looks_like_repo(not), "{not}");
        }
    }

    #[test]
    fn a_path_that_exists_is_used_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(local_or_pulled(dir.path(), "rank 1").unwrap(), dir.path());
        let err = local_or_pulled(&dir.path().join("absent.gguf"), "rank 1").unwrap_err().to_string();
        assert!(err.contains("rank 1") && err.contains("absent.gguf") && err.contains("org/name"), "{err}");
    }
}
