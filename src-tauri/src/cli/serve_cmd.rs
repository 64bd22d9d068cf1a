//! `fastmlx serve`: the OpenAI-compatible API on localhost, fed by the batching engine.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::engine::EngineConfig;
use crate::server::{local_access, RunningServer, ServerConfig};
use crate::store::hub::HubClient;
use crate::store::{Catalog, Pulls, Residency, ResidencyConfig, Served, StorePaths};

#[derive(Args)]
pub struct ServeArgs {
    /// The model to load first: a local model id (`fastmlx ls`), a folder or a .gguf file
    /// [default: SmolLM2-135M-Instruct]. Requests naming another local model load it too.
    #[arg(long, short, env = "FASTMLX_MODEL")]
    model: Option<PathBuf>,
    /// Unload a model after this many seconds without requests (default: keep it).
    #[arg(long, env = "FASTMLX_KEEP_ALIVE")]
    keep_alive: Option<u64>,
    /// The most memory the server may hold, everything counted (weights of every loaded model,
    /// KV caches, the prefix cache, each step's working memory, MLX's buffers): `12GB`,
    /// `800MiB`, `60%` of the machine, or bytes [default: 70% of RAM, on Metal at most the GPU's
    /// recommended working set]. Requests wait or are answered 503 rather than cross it.
    #[arg(long, env = "FASTMLX_MEMORY_LIMIT")]
    memory_limit: Option<String>,
    /// The same ceiling in MiB (the older name of --memory-limit).
    #[arg(long, env = "FASTMLX_MEMORY_BUDGET_MB", conflicts_with = "memory_limit")]
    memory_budget_mb: Option<u64>,
    /// A request that has not started after this many seconds is answered 503 with
    /// Retry-After (0: it waits as long as it takes).
    #[arg(long, env = "FASTMLX_MAX_QUEUE_WAIT", default_value_t = crate::engine::DEFAULT_MAX_QUEUE_WAIT.as_secs())]
    max_queue_wait: u64,
    /// Address to listen on; anything but loopback exposes the server to the network.
    #[arg(long, env = "FASTMLX_HOST", default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, env = "FASTMLX_PORT", default_value_t = 8080)]
    port: u16,
    /// Require this key (Authorization: Bearer <key> or x-api-key) on every API call.
    #[arg(long, env = "FASTMLX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Rows decoded together at most.
    #[arg(long, env = "FASTMLX_MAX_BATCH", default_value_t = 32)]
    max_batch: usize,
    /// Requests waiting at most before new ones get 429.
    #[arg(long, env = "FASTMLX_MAX_QUEUE", default_value_t = 256)]
    max_queue: usize,
    /// Limit the context window (prompt + output tokens) below the model's own.
    #[arg(long, env = "FASTMLX_CTX")]
    ctx: Option<usize>,
    /// While streams decode, a long prompt's prefill is paced to keep their inter-token latency
    /// near this multiple of its unloaded value (default 4; 0: up to 512 prompt tokens a step).
    #[arg(long, env = "FASTMLX_ITL_BUDGET", default_value_t = crate::engine::DEFAULT_ITL_BUDGET)]
    itl_budget: f64,
    /// Most memory (MB) the prefix cache (keys and values of prompts seen before) holds per
    /// model; it lives inside the KV budget and gives way to running requests.
    #[arg(long, env = "FASTMLX_PREFIX_CACHE_MB", default_value_t = (crate::engine::DEFAULT_PREFIX_CACHE_BYTES >> 20) as u64)]
    prefix_cache_mb: u64,
    /// Most disk space (GB) the prefix cache keeps per model, so prompts seen before a restart
    /// are read back instead of prefilled (0: RAM only). In `FASTMLX_CACHE_DIR`, else the
    /// platform cache folder.
    #[arg(long, env = "FASTMLX_PREFIX_CACHE_DISK_GB", default_value_t = 20.0)]
    prefix_cache_disk_gb: f64,
    /// Turn the prefix cache off (every prompt is prefilled in full).
    #[arg(long, env = "FASTMLX_NO_PREFIX_CACHE")]
    no_prefix_cache: bool,
    /// Another host name the server answers to (repeatable).
    #[arg(long = "allowed-host", env = "FASTMLX_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Another web page origin trusted to use the server (repeatable; `*` trusts every page).
    /// Local pages, the app and editor webviews are always trusted.
    #[arg(long = "allowed-origin", env = "FASTMLX_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Also serve on this port, where Ollama clients look (11434).
    #[arg(long, env = "FASTMLX_OLLAMA_PORT")]
    ollama_port: Option<u16>,
    /// With `tool_choice: "auto"`, hold a tool call the model starts to the format's grammar, so
    /// that it completes to a call of an offered function with valid arguments.
    #[arg(long, env = "FASTMLX_STRICT_TOOLS")]
    strict_tools: bool,
    /// Fetch `http(s)` image URLs in requests (by default they are refused: a local server that
    /// fetches the URLs it is sent lets any web page that reaches it make requests inside your
    /// network). For a server only your own tools use.
    #[arg(long, env = "FASTMLX_FETCH_IMAGE_URLS")]
    fetch_image_urls: bool,
    /// A model name other tools ask for, as NAME=MODEL (repeatable): `qwen2.5:7b=mlx-community/Qwen2.5-7B-Instruct-4bit`;
    /// NAME may end in `*` (`claude-*=...`); an empty MODEL means the model served now.
    #[arg(long = "alias", env = "FASTMLX_ALIASES", value_delimiter = ',')]
    aliases: Vec<crate::server::aliases::Alias>,
    /// How quantized weights are held in memory.
    #[arg(long, env = "FASTMLX_WEIGHTS", value_enum, default_value_t = super::WeightsArg::Auto)]
    pub(super) weights: super::WeightsArg,
    /// Speculative decoding: `auto` drafts tokens (with the draft model when one is given, else
    /// with the model's own multi-token-prediction head where the checkpoint ships one, else by
    /// prompt lookup: what the prompt and the text so far say comes next) and checks them in one
    /// step, wherever that is measured to pay; `ngram` drafts by prompt lookup whenever it can,
    /// `draft` with the draft model whenever it can, `mtp` with the model's head whenever it
    /// can; `off` never. The output is the same either way.
    #[arg(long, env = "FASTMLX_SPECULATIVE", default_value = "auto")]
    speculative: crate::engine::speculative::Mode,
    /// Tokens a request drafts per step at most.
    #[arg(long, env = "FASTMLX_NUM_DRAFT_TOKENS", default_value_t = crate::engine::speculative::DEFAULT_DRAFT_TOKENS)]
    num_draft_tokens: usize,
    /// A small model with the same tokenizer (a local model id, a folder or a .gguf file) that
    /// drafts tokens for the first model (`--model`), loaded beside it.
    #[arg(long, env = "FASTMLX_DRAFT_MODEL")]
    pub(super) draft_model: Option<String>,
    #[command(flatten)]
    pub(super) kv: super::KvArgs,
    #[command(flatten)]
    pub(super) cluster: super::generate_cluster::ClusterArgs,
    #[command(flatten)]
    pub(super) roster: super::serve_cluster::RosterArgs,
    /// A model's own KV-cache format, as MODEL=BITS[/GROUP[/START]] (repeatable; BITS 8, 4 or
    /// off): `--model-kv qwen3-coder-30b=4 --model-kv smollm2=off`. Others use --kv-bits.
    #[arg(long = "model-kv", env = "FASTMLX_MODEL_KV", value_delimiter = ',')]
    model_kv: Vec<crate::store::ModelKv>,
}

impl ServeArgs {
    /// The first model: `--model`, `FASTMLX_MODEL` or the default one.
    pub fn first_model(&self) -> anyhow::Result<PathBuf> {
        super::resolve_model_path(self.model.clone())
    }

    pub fn residency_config(&self) -> anyhow::Result<ResidencyConfig> {
        let mut config = ResidencyConfig {
            engine: EngineConfig {
                max_batch: self.max_batch,
                max_queue: self.max_queue,
                max_context: self.ctx,
                itl_budget: self.itl_budget.max(0.0),
                max_queue_wait: (self.max_queue_wait > 0).then(|| std::time::Duration::from_secs(self.max_queue_wait)),
                prefix_cache_bytes: if self.no_prefix_cache { 0 } else { (self.prefix_cache_mb as usize) << 20 },
                prefix_cache_disk: (self.prefix_cache_disk_gb > 0.0)
                    .then(crate::engine::kv::prefix_cache::default_disk_dir)
                    .flatten()
                    .map(|dir| (dir, (self.prefix_cache_disk_gb.min(1e6) * 1e9) as u64)),
                speculative: crate::engine::speculative::SpeculativeConfig {
                    mode: self.speculative,
                    draft_tokens: self.num_draft_tokens,
                },
                kv_format: self.kv.format()?,
                ..Default::default()
            },
            load: self.weights.load_options(),
            keep_alive: self.keep_alive.map(std::time::Duration::from_secs),
            model_kv: self.model_kv.clone(),
            ..Default::default()
        };
        if let Some(mb) = self.memory_budget_mb {
            config.memory_budget = mb << 20;
        }
        if let Some(limit) = &self.memory_limit {
            let machine = crate::mlx::machine_memory_bytes();
            let bytes =
                crate::mlx::parse_memory_size(limit, machine).map_err(|e| anyhow::anyhow!("--memory-limit: {e}"))?;
            if bytes < 256 << 20 {
                anyhow::bail!("--memory-limit: {limit} is below the 256 MiB a model and its caches need at least");
            }
            config.memory_budget = bytes;
        }
        Ok(config)
    }

    /// The models' residency in the platform's model folders, with its settings and the draft
    /// model (`--draft-model`) paired with the first model.
    pub fn residency(&self) -> anyhow::Result<Residency> {
        let catalog = Catalog::new(StorePaths::from_env());
        let mut config = self.residency_config()?;
        match &self.draft_model {
            Some(draft) => {
                let target = catalog.find_or_add_path(&self.first_model()?.to_string_lossy())?;
                let draft = catalog.find_or_add_path(draft).with_context(|| format!("--draft-model {draft}"))?;
                config.drafts.push((target.id, draft.id));
            }
            None if self.speculative == crate::engine::speculative::Mode::Draft => {
                anyhow::bail!("--speculative draft needs a draft model (--draft-model NAME)")
            }
            None => {}
        }
        Ok(Residency::new(catalog, config))
    }

    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig {
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
            settings_file: crate::config_file::config_path(),
            ..Default::default()
        };
        config.allowed_hosts.extend(self.allowed_hosts.iter().cloned());
        config.allowed_origins.extend(self.allowed_origins.iter().cloned());
        config.aliases.extend(self.aliases.iter().cloned());
        config.ollama_port = self.ollama_port;
        config.strict_tools = self.strict_tools;
        config.fetch_image_urls = self.fetch_image_urls;
        local_access(&mut config, self.host);
        config
    }

    pub fn address(&self) -> (IpAddr, u16) {
        (self.host, self.port)
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let path = args.first_model()?;
    if let Some(hosts) = args.cluster.hostfile() {
        return super::serve_cluster::run(args, path, hosts);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args, path))
}

async fn serve(args: ServeArgs, path: PathBuf) -> anyhow::Result<()> {
    let models = args.residency()?;
    let first =
        models.load_given(&path.to_string_lossy()).await.with_context(|| format!("loading {}", path.display()))?;
    serve_loaded(args, models, first).await
}

/// Serves the models of `models` over HTTP, `first` loaded, until the process is told to stop.
pub(super) async fn serve_loaded(args: ServeArgs, models: Residency, first: Served) -> anyhow::Result<()> {
    let server = start_server(&args, &models).await?;
    eprintln!("FastMLX serving {} at {}", first.id, server.url());
    drop(first);
    shutdown_signal().await;
    stop_server(models, server).await
}

/// The HTTP server over `models`, listening.
pub(super) async fn start_server(args: &ServeArgs, models: &Residency) -> anyhow::Result<RunningServer> {
    models.spawn_idle_reaper();
    let pulls = Pulls::new(models.catalog().paths().clone(), HubClient::from_env());
    let server = RunningServer::start(models.clone(), pulls, args.server_config(), args.host, args.port)
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    if let Some(ollama) = server.ollama_address {
        eprintln!("Ollama API also at http://{ollama}");
    }
    Ok(server)
}

/// Ends every running stream (each gets its finish), so connections can close, then the server.
pub(super) async fn stop_server(models: Residency, server: RunningServer) -> anyhow::Result<()> {
    eprintln!("shutting down");
    models.unload_all().await;
    server.stop().await?;
    Ok(())
}

pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
}
