//! The `fastmlx` command line.

mod bench_cmd;
mod bench_grammar_cmd;
mod cache_cmd;
mod cluster_cmd;
mod cluster_model;
mod generate_cluster;
mod generate_cmd;
mod inspect_cmd;
mod kv_args;
mod model_path;
mod rejoin;
mod serve_cluster;
mod serve_cmd;
mod store_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use kv_args::KvArgs;
pub use model_path::{default_model_path, resolve_model_path, DEFAULT_MODEL_FILE};
pub use serve_cluster::EXIT_WITH_PARENT_VAR;
pub use serve_cmd::ServeArgs;

/// `--weights`: how quantized weights are held (see [`crate::model::WeightFormat`]).
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub enum WeightsArg {
    /// Packed on a GPU, expanded to f32 on a CPU when memory allows.
    #[default]
    Auto,
    /// Keep quantized weights packed (MLX's quantized kernels).
    Packed,
    /// Expand quantized weights at load.
    Dense,
}

impl WeightsArg {
    pub fn load_options(self) -> crate::model::LoadOptions {
        use crate::model::WeightFormat;
        let weights = match self {
            WeightsArg::Auto => WeightFormat::Auto,
            WeightsArg::Packed => WeightFormat::Packed,
            WeightsArg::Dense => WeightFormat::Dense,
        };
        crate::model::LoadOptions { weights }
    }
}

#[derive(Parser)]
#[command(name = "fastmlx", version, about = "Local LLM server for Apple Silicon, on MLX")]
struct Cli {
    /// With none, the desktop app starts (in a build with the `desktop` feature).
    #[command(subcommand)]
    command: Option<Command>,
}

/// `fastmlx app`: the server's settings, and whether to start in the menu bar only.
#[derive(clap::Args)]
pub struct AppArgs {
    #[command(flatten)]
    serve: serve_cmd::ServeArgs,
    /// Start with no window open (the menu-bar icon only), as at login.
    #[arg(long)]
    hidden: bool,
    /// Serve no model at start, not even the default one: as on a first run, the menu bar
    /// offers to choose one.
    #[arg(long, conflicts_with = "model")]
    no_model: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout, then print speed and memory.
    Generate(generate_cmd::GenerateArgs),
    /// Serve the OpenAI-compatible API on localhost.
    Serve(serve_cmd::ServeArgs),
    /// The menu-bar app: the same server, a tray menu, the dashboard and chat windows.
    App(AppArgs),
    /// Measure single-stream prompt and decode speed.
    Bench(bench_cmd::BenchArgs),
    /// Measure the per-token cost of constrained decoding (JSON Schema) on the CPU.
    BenchGrammar(bench_grammar_cmd::BenchGrammarArgs),
    /// Download a model from the Hugging Face Hub (resumable; Ctrl-C cancels).
    Pull(store_cmd::PullArgs),
    /// List local models: FastMLX's folder, the Hugging Face cache, LM Studio's folder.
    Ls,
    /// Delete a model FastMLX downloaded.
    Rm(store_cmd::RmArgs),
    /// Search the Hugging Face Hub for MLX models.
    Search(store_cmd::SearchArgs),
    /// What a local model is and how much context it serves on this machine (without loading it).
    Inspect(inspect_cmd::InspectArgs),
    /// The prefix cache on disk: `ls` (per model) or `clear`.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCommand),
    /// Several Macs serving one model: `check` (the preflight each machine runs).
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Print the OpenAPI description of the HTTP API (docs/openapi.json).
    Openapi,
    /// Write a tiny random-weight model (for tests and experiments).
    #[command(hide = true)]
    MakeTestModel(generate_cmd::MakeTestModelArgs),
}

pub fn main() -> ExitCode {
    rejoin::close_leftovers();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FASTMLX_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only, not escape codes in a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = crate::config_file::apply() {
        eprintln!("error: config file: {e:#}");
        return ExitCode::from(2);
    }
    let cli = Cli::parse();
    let command = match cli.command {
        Some(command) => command,
        // As `fastmlx app` with its defaults (and the environment's settings).
        None if cfg!(feature = "desktop") => Cli::parse_from(["fastmlx", "app"]).command.expect("app is a command"),
        None => {
            let _ = <Cli as clap::CommandFactory>::command().print_help();
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::App(args) => run_app(args),
        Command::Generate(args) => generate_cmd::run(args),
        Command::Serve(args) => serve_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::BenchGrammar(args) => bench_grammar_cmd::run(args),
        Command::Pull(args) => store_cmd::pull(args),
        Command::Ls => store_cmd::ls(),
        Command::Rm(args) => store_cmd::rm(args),
        Command::Search(args) => store_cmd::search(args),
        Command::Inspect(args) => inspect_cmd::run(args),
        Command::Cache(command) => cache_cmd::run(command),
        Command::Cluster(command) => cluster_cmd::run(command),
        Command::Openapi => {
            print!("{}", crate::server::openapi::document_json());
            Ok(())
        }
        Command::MakeTestModel(args) => generate_cmd::make_test_model(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "desktop")]
fn run_app(args: AppArgs) -> anyhow::Result<()> {
    let flags = crate::desktop::cluster_launch::serve_flags(std::env::args_os());
    crate::desktop::run(args.serve, args.hidden, args.no_model, flags)
}

#[cfg(not(feature = "desktop"))]
fn run_app(_: AppArgs) -> anyhow::Result<()> {
    anyhow::bail!("this build has no desktop app (built without the `desktop` feature); use `fastmlx serve`")
}
