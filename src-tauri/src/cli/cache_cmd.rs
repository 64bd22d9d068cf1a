//! `fastmlx cache ls | clear`: the prefix cache's disk tier (per model: blocks and size), and
//! emptying it. A running server's RAM tier is emptied from the Server page or with
//! `DELETE /admin/cache`.

use crate::engine::kv::prefix_cache::{default_disk_dir, list_folders};
use crate::store::human_bytes;

#[derive(clap::Subcommand)]
pub enum CacheCommand {
    /// The prefix cache on disk: per model, blocks and size.
    Ls,
    /// Delete the prefix cache on disk (every model's, or those whose path contains --model).
    Clear {
        #[arg(long)]
        model: Option<String>,
    },
}

pub fn run(command: CacheCommand) -> anyhow::Result<()> {
    let Some(root) = default_disk_dir() else {
        anyhow::bail!("no cache folder on this platform (set FASTMLX_CACHE_DIR)")
    };
    let folders = list_folders(&root);
    match command {
        CacheCommand::Ls => {
            if folders.is_empty() {
                println!("the prefix cache on disk is empty ({})", root.display());
                return Ok(());
            }
            println!("{:<72} {:>8} {:>10}", "MODEL", "BLOCKS", "SIZE");
            for f in &folders {
                println!("{:<72} {:>8} {:>10}", f.model, f.blocks, human_bytes(f.bytes));
            }
            let total: u64 = folders.iter().map(|f| f.bytes).sum();
            println!("{} in {}", human_bytes(total), root.display());
        }
        CacheCommand::Clear { model } => {
            let chosen: Vec<_> =
                folders.iter().filter(|f| model.as_ref().is_none_or(|m| f.model.contains(m.as_str()))).collect();
            for f in &chosen {
                std::fs::remove_dir_all(&f.dir)
                    .map_err(|e| anyhow::anyhow!("cannot delete {}: {e}", f.dir.display()))?;
                println!("deleted {} ({} blocks, {})", f.model, f.blocks, human_bytes(f.bytes));
            }
            if chosen.is_empty() {
                println!("nothing to delete");
            }
        }
    }
    Ok(())
}
