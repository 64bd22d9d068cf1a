//! `fastmlx pull | ls | rm | search`: the model store from the terminal.

use std::time::Duration;

use anyhow::bail;
use clap::Args;

use crate::store::fit::hub_estimate;
use crate::store::hub::HubClient;
use crate::store::human_bytes;
use crate::store::{Catalog, PullRequest, PullState, Pulls, StorePaths};

#[derive(Args)]
pub struct PullArgs {
    /// A Hugging Face repo, e.g. mlx-community/Qwen2.5-0.5B-Instruct-4bit.
    repo: String,
    /// For a GGUF repo: the file, or a part of its name (e.g. Q4_0).
    #[arg(long)]
    gguf: Option<String>,
    #[arg(long, default_value = "main")]
    revision: String,
}

#[derive(Args)]
pub struct RmArgs {
    /// The model id (`fastmlx ls`).
    id: String,
    /// Also delete models FastMLX did not download (HF cache, LM Studio, files you put there).
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct SearchArgs {
    /// Words to look for on the Hub.
    text: String,
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Every library, not only MLX models.
    #[arg(long)]
    all: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

pub fn pull(args: PullArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let pulls = Pulls::new(StorePaths::from_env(), HubClient::from_env());
        let mut watch = pulls.start(PullRequest { repo: args.repo.clone(), revision: args.revision, gguf: args.gguf });
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        let cancel = tokio::spawn({
            let (pulls, repo) = (pulls.clone(), args.repo.clone());
            async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    pulls.cancel(&repo);
                }
            }
        });
        loop {
            let p = watch.progress.borrow().clone();
            bar.set_length(p.total);
            bar.set_position(p.done);
            bar.set_message(format!("{} ({}/{})", p.file, p.files_done, p.files_total));
            if watch.state.borrow().is_finished() {
                break;
            }
            tokio::select! {
                _ = watch.state.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        cancel.abort();
        bar.finish_and_clear();
        let state = watch.state.borrow().clone();
        match state {
            PullState::Done { id, path } => {
                println!("{id} is ready: {}", path.display());
                Ok(())
            }
            PullState::Cancelled => bail!("cancelled; run the same command again to resume"),
            PullState::Failed { message } => bail!("{message}"),
            PullState::Running => unreachable!("the loop ends when the pull does"),
        }
    })
}

pub fn ls() -> anyhow::Result<()> {
    let models = Catalog::new(StorePaths::from_env()).list();
    if models.is_empty() {
        println!("no models yet: `fastmlx search <text>` then `fastmlx pull <repo>`");
        return Ok(());
    }
    println!(
        "{:<56} {:>9} {:>9} {:>8} {:<18} {:<10} {:<8} NOTES",
        "ID", "SIZE", "MEMORY", "PARAMS", "QUANTIZATION", "ARCH", "SOURCE"
    );
    let load = crate::model::LoadOptions::default();
    for m in models {
        let s = &m.summary;
        // What the weights will take once loaded here (repacked GGUF blocks, f32 on a CPU).
        let memory = human_bytes(crate::store::estimated_weights_bytes(s, &load));
        let params = s.parameters.map_or("-".into(), |p| format!("{:.1}B", p as f64 / 1e9));
        let source =
            serde_json::to_value(m.source).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let notes = s.unloadable_reason.as_ref().map_or(String::new(), |r| format!("cannot load: {r}"));
        println!(
            "{:<56} {:>9} {:>9} {:>8} {:<18} {:<10} {:<8} {notes}",
            m.id,
            human_bytes(s.size_bytes),
            memory,
            params,
            s.quantization.as_deref().unwrap_or("-"),
            s.architecture.as_deref().unwrap_or("-"),
            source
        );
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> anyhow::Result<()> {
    let path = Catalog::new(StorePaths::from_env()).delete(&args.id, args.force)?;
    println!("deleted {} ({})", args.id, path.display());
    Ok(())
}

pub fn search(args: SearchArgs) -> anyhow::Result<()> {
    let hub = HubClient::from_env();
    let (hits, shapes) = runtime()?.block_on(async {
        let hits = hub.search(&args.text, args.limit, !args.all).await?;
        let shapes = crate::store::HubShapes::default().of(&hub, &hits).await;
        anyhow::Ok((hits, shapes))
    })?;
    let ceiling = crate::mlx::default_ceiling();
    let max_batch = crate::engine::EngineConfig::default().max_batch;
    println!("{:<60} {:<14} {:>10} {:>9} {:<8} {:<10}", "REPO", "QUANT", "DOWNLOADS", "SIZE", "FIT", "CONTEXT");
    for (hit, shape) in hits.into_iter().zip(shapes) {
        let size = hit.storage_bytes.map_or("-".into(), human_bytes);
        let estimate = hub_estimate(hit.storage_bytes, shape.as_deref(), ceiling, max_batch);
        let fit = estimate.fit.unwrap_or("-");
        // What it serves here, or why it cannot be loaded.
        let context = match (&estimate.plan, shape.as_ref().map(|s| &s.config)) {
            (Some(p), _) if p.context_tokens > 0 => format!("{} x {} tokens", p.rows, p.context_tokens),
            (_, Some(Err(why))) => why.clone(),
            _ => "-".into(),
        };
        let quant = hit.quantization.as_deref().unwrap_or("-");
        println!("{:<60} {:<14} {:>10} {:>9} {:<8} {:<10}", hit.id, quant, hit.downloads, size, fit, context);
    }
    Ok(())
}
