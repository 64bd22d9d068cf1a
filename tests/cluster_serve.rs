//! `fastmlx serve --cluster`: one model served across 2 and 3 processes on this machine (MLX's
//! `ring` backend over loopback), rank 0 running the HTTP server and the engine. Through the
//! HTTP API, concurrent requests of different lengths (rows joining and leaving the batch, with
//! drafted tokens checked and taken back) get what one process answers, on SmolLM2 and on a
//! Gated DeltaNet hybrid (recurrent states on the workers), and requests sharing a system prompt
//! find its start in every rank's prefix cache; a worker that dies mid-answer ends
//! the stream with an error event within the deadline, the server stays up saying which rank
//! is gone, and once the worker is started again the cluster forms again by itself and serves.
//! On a network of their own (network namespaces on a bridge), a pulled cable and a link cut
//! between two workers are named within seconds, and the others serve until they are mended.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::fake_hub::{FakeHub, FakeRepo};
use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;
use serde_json::{json, Value};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A port whose next one is free too: rank 0's roster listens there.
fn free_port_pair() -> u16 {
    loop {
        let port = free_port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

fn host_file(dir: &Path, ranks: usize) -> PathBuf {
    let first = free_port_pair();
    let other = || std::iter::repeat_with(free_port).find(|&p| p != first + 1).unwrap();
    let port = |rank: usize| if rank == 0 { first } else { other() };
    let hosts: Vec<Vec<String>> = (0..ranks).map(|rank| vec![format!("127.0.0.1:{}", port(rank))]).collect();
    let path = dir.join(format!("hosts-{ranks}.json"));
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// The port of `rank` in the host file at `hosts`.
fn hosts_port(hosts: &Path, rank: usize) -> u16 {
    let ranks: Vec<Vec<String>> = serde_json::from_str(&std::fs::read_to_string(hosts).unwrap()).unwrap();
    ranks[rank][0].rsplit_once(':').unwrap().1.parse().unwrap()
}

/// A server process, killed when dropped; its log is a file.
struct Node {
    child: Child,
    log: PathBuf,
}

impl Node {
    /// What the process printed, but for the HTTP layer's lines: the polls of `/health` while
    /// a cluster forms would bury the rest in a failure's message.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| !l.contains(" fastmlx::http: ")).map(|l| format!("{l}\n")).collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `fastmlx serve` of `model` on `port` with `args`, alone or as `rank` of the cluster `hosts`.
fn serve(dir: &Path, model: &Path, port: u16, args: &[&str], cluster: Option<(&Path, usize)>) -> Node {
    let (mut command, log) = serve_command(dir, model, port, args, cluster);
    Node { child: command.spawn().unwrap(), log }
}

/// [`serve`]'s command, not started, and its log.
fn serve_command(
    dir: &Path,
    model: &Path,
    port: u16,
    args: &[&str],
    cluster: Option<(&Path, usize)>,
) -> (Command, PathBuf) {
    serve_command_from(Command::new(env!("CARGO_BIN_EXE_fastmlx")), dir, model, port, args, cluster)
}

/// [`serve_command`] on `command`, the server's program (run on a machine of a [`Lan`] maybe).
fn serve_command_from(
    mut command: Command,
    dir: &Path,
    model: &Path,
    port: u16,
    args: &[&str],
    cluster: Option<(&Path, usize)>,
) -> (Command, PathBuf) {
    let name = cluster.map_or("alone".to_string(), |(_, rank)| format!("rank{rank}"));
    let log = dir.join(format!("{name}-{port}.log"));
    command
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--port", &port.to_string()])
        .args(args)
        .env("FASTMLX_MODELS_DIR", dir.join("models"))
        // Each process one BLAS thread: spinning BLAS threads of several processes starve them all.
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("FASTMLX_CACHE_DIR", dir.join("cache"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some((hosts, rank)) = cluster {
        command.arg("--cluster").arg(hosts).args(["--rank", &rank.to_string()]);
        if !args.contains(&"--timeout") {
            command.args(["--timeout", "15"]);
        }
    }
    (command, log)
}

async fn wait_ready(port: u16, node: &mut Node) {
    let started = Instant::now();
    loop {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/health")).await {
            if r.status().is_success() {
                return;
            }
        }
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("the server ended ({status}) before it served: {}", node.log());
        }
        assert!(started.elapsed() < Duration::from_secs(120), "not ready after 120 s: {}", node.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rank 0 (its port) and the workers of `model` across `ranks` processes, ready.
async fn cluster(dir: &Path, model: &Path, ranks: usize, args: &[&str]) -> (u16, Vec<Node>) {
    let hosts = host_file(dir, ranks);
    cluster_of(dir, model, &hosts, args).await
}

async fn cluster_of(dir: &Path, model: &Path, hosts: &Path, args: &[&str]) -> (u16, Vec<Node>) {
    let ranks = serde_json::from_str::<Vec<Value>>(&std::fs::read_to_string(hosts).unwrap()).unwrap().len();
    started_in_order(ranks, |rank, port| serve(dir, model, port, args, Some((hosts, rank)))).await
}

/// `ranks` ranks, each started by `start` (given its rank and an HTTP port), in order, and
/// rank 0 (its port) ready.
async fn started_in_order(ranks: usize, mut start: impl FnMut(usize, u16) -> Node) -> (u16, Vec<Node>) {
    let port = free_port();
    let mut nodes = Vec::new();
    for rank in 0..ranks {
        nodes.push(start(rank, if rank == 0 { port } else { free_port() }));
        // MLX's ring connects more reliably when its ranks start in order.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_ready(port, &mut nodes[0]).await;
    (port, nodes)
}

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Write a poem about the sea. Write a poem about the sea. Write a poem about the sea.",
    "1, 2, 3, 4,",
    "def fib(n):",
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "Rust is",
    "List three colors:",
];

/// The 8 prompts at once, each with its own length (rows join and leave the batch): each
/// answer's text, and the drafted tokens checked in all.
async fn answers(port: u16) -> (Vec<String>, u64) {
    let client = reqwest::Client::new();
    let asks = PROMPTS.iter().enumerate().map(|(i, prompt)| {
        let body = json!({"prompt": prompt, "max_tokens": 6 + 5 * i, "temperature": 0, "ignore_eos": true});
        let request = client.post(format!("http://127.0.0.1:{port}/v1/completions")).json(&body).send();
        tokio::spawn(async move {
            let response = request.await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{status}: {body}");
            (body["choices"][0]["text"].as_str().unwrap().to_string(), body["timings"]["draft_n"].as_u64().unwrap_or(0))
        })
    });
    let mut texts = Vec::new();
    let mut drafted = 0;
    for ask in asks.collect::<Vec<_>>() {
        let (text, draft) = ask.await.unwrap();
        texts.push(text);
        drafted += draft;
    }
    (texts, drafted)
}

/// `model` served across `ranks` processes answers as one process does, drafting (`speculative`).
/// A system prompt of ~150 tokens (two whole prefix-cache blocks, short of a shared segment).
const SYSTEM: &str = "You are a careful assistant for a team of engineers. Answer briefly and precisely, \
    name the files you would change, say what you measured, and never guess at figures you do not have. \
    When a question is unclear, ask one short question back. Prefer plain words to jargon, short \
    sentences to long ones, and examples to abstractions. Keep code blocks small and complete.";

/// Chat requests sharing the system prompt: the first alone, then three at once, which find
/// its start in the prefix cache. Each answer's text, and the prompt tokens each reused.
async fn turns(port: u16) -> (Vec<String>, Vec<u64>) {
    let client = reqwest::Client::new();
    let ask = |question: &str| {
        let body = json!({
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "max_tokens": 12,
            "temperature": 0,
        });
        let request = client.post(format!("http://127.0.0.1:{port}/v1/chat/completions")).json(&body).send();
        tokio::spawn(async move {
            let response = request.await.unwrap();
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{status}: {body}");
            let text = body["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
            (text, body["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0))
        })
    };
    let mut out = vec![ask("What is a prefix cache?").await.unwrap()];
    let rest: Vec<_> = ["Why batch requests?", "What is a pipeline stage?", "How fast is Thunderbolt 5?"]
        .into_iter()
        .map(ask)
        .collect();
    for r in rest {
        out.push(r.await.unwrap());
    }
    out.into_iter().unzip()
}

/// One greedy answer in each dialect besides OpenAI's completions: chat under a JSON schema
/// (its grammar masks the verify steps' logits too), Anthropic Messages, Ollama's chat and
/// OpenAI Responses. Rank 0's engine serves them all, split or not.
async fn dialects(port: u16) -> Vec<String> {
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}");
    let models: Value = client.get(format!("{url}/v1/models")).send().await.unwrap().json().await.unwrap();
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let user = json!([{"role": "user", "content": "Name a colour."}]);
    let schema = json!({"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]});
    let format = json!({"type": "json_schema", "json_schema": {"name": "colour", "schema": schema}});
    let asks = [
        (
            "/v1/chat/completions",
            json!({"model": model, "messages": user, "max_tokens": 16, "temperature": 0, "response_format": format}),
        ),
        ("/v1/messages", json!({"model": model, "messages": user, "max_tokens": 8, "temperature": 0})),
        (
            "/api/chat",
            json!({"model": model, "messages": user, "stream": false, "options": {"temperature": 0, "num_predict": 8}}),
        ),
        (
            "/v1/responses",
            json!({"model": model, "input": "Name a colour.", "max_output_tokens": 16, "temperature": 0}),
        ),
    ];
    let mut texts = Vec::new();
    for (path, body) in asks {
        let response = client.post(format!("{url}{path}")).json(&body).send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status}: {body}");
        let text = match path {
            "/v1/chat/completions" => &body["choices"][0]["message"]["content"],
            "/v1/messages" => &body["content"][0]["text"],
            "/api/chat" => &body["message"]["content"],
            _ => {
                let message = body["output"].as_array().unwrap().iter().find(|o| o["type"] == "message");
                &message.unwrap_or_else(|| panic!("{path}: no message in {body}"))["content"][0]["text"]
            }
        };
        texts.push(text.as_str().unwrap_or_else(|| panic!("{path}: no text in {body}")).to_string());
    }
    assert!(texts[0].starts_with('{'), "the schema's grammar: {texts:?}");
    texts
}

/// `model` across `ranks` processes with `args` (and `split`: how it is split) answers as one
/// process with `args` does.
async fn assert_served_like_alone(
    dir: &Path,
    model: &Path,
    (ranks, split): (usize, &[&str]),
    args: &[&str],
    what: &str,
) {
    let port = free_port();
    let mut alone = serve(dir, model, port, args, None);
    wait_ready(port, &mut alone).await;
    let (want, _) = answers(port).await;
    let (want_turns, _) = turns(port).await;
    let want_dialects = dialects(port).await;
    drop(alone);
    let (port, nodes) = cluster(dir, model, ranks, &[args, split].concat()).await;
    let (got, drafted) = answers(port).await;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{what} across {ranks} ranks, prompt {i}: {}", nodes[0].log());
    }
    assert!(drafted > 0, "{what}: no drafted tokens were checked across the ranks");
    // The system prompt's start is a hit on every rank (rank 0 resumes only where all can).
    let (got_turns, reused) = turns(port).await;
    assert_eq!(got_turns, want_turns, "{what} across {ranks} ranks, the turns: {}", nodes[0].log());
    assert!(reused[1..].iter().all(|&r| r >= 64), "{what}: prompt tokens reused {reused:?}: {}", nodes[0].log());
    assert_eq!(dialects(port).await, want_dialects, "{what} across {ranks} ranks, the dialects: {}", nodes[0].log());
    for (rank, node) in nodes.iter().enumerate() {
        assert!(node.log().contains(&format!("rank {rank} of {ranks}: ")), "{}", node.log());
    }
    let tensor = split.contains(&"tensor");
    assert_cluster_shown(port, ranks, tensor, what).await;
}

/// `/admin/status` and `/metrics` show the cluster: every rank's layers (all of the model's,
/// once each; by `tensor`s, a share of every layer on every rank), each link measured at
/// start, the steps sent through and their costs.
async fn assert_cluster_shown(port: u16, ranks: usize, tensor: bool, what: &str) {
    let url = format!("http://127.0.0.1:{port}");
    let status: Value = reqwest::get(format!("{url}/admin/status")).await.unwrap().json().await.unwrap();
    let cluster = &status["loaded"][0]["cluster"];
    let nodes = cluster["nodes"].as_array().unwrap_or_else(|| panic!("{what}: no cluster in {status}"));
    assert_eq!(nodes.len(), ranks, "{what}: {cluster}");
    assert_eq!(cluster["parallel"], if tensor { "tensor" } else { "pipeline" }, "{what}: {cluster}");
    let mut next = 0;
    for (rank, node) in nodes.iter().enumerate() {
        assert_eq!(node["rank"], rank, "{what}: {cluster}");
        assert!(node["room_bytes"].as_u64().unwrap() > 0 && node["host"].as_str().unwrap().starts_with("127.0.0.1:"));
        if tensor {
            assert_eq!((&node["first_layer"], &node["end_layer"]), (&json!(0), &nodes[0]["end_layer"]), "{what}");
            assert_eq!(node["ends"], true, "{what}: {cluster}");
            continue;
        }
        assert_eq!(node["first_layer"], next, "{what}: the layers run in rank order: {cluster}");
        next = node["end_layer"].as_u64().unwrap();
        assert_eq!(node["ends"], rank == 0, "{what}: {cluster}");
    }
    let links = cluster["links"].as_array().unwrap();
    assert_eq!(links.len(), if ranks == 2 { 1 } else { ranks }, "{what}: {cluster}");
    assert!(links.iter().all(|l| l["megabytes_per_second"].as_f64().unwrap() > 0.0), "{what}: {cluster}");
    let steps = cluster["steps"].as_u64().unwrap();
    assert!(steps > 0 && cluster["bytes_per_hop"].as_u64().unwrap() > steps, "{what}: {cluster}");
    let (wait, total) = (cluster["wait_seconds"].as_f64().unwrap(), cluster["step_seconds"].as_f64().unwrap());
    assert!(0.0 < wait && wait < total, "{what}: {cluster}");
    // By tensors, the first step of each kind and one every few seconds have their sums timed
    // apart from rank 0's layers: a part of those steps' time; none of a pipeline's.
    for kind in ["prompt", "decode"] {
        let timed = &cluster["sums_timed"][kind];
        let n = timed["steps"].as_u64().unwrap();
        let (sums, total) = (timed["sum_seconds"].as_f64().unwrap(), timed["step_seconds"].as_f64().unwrap());
        match tensor {
            true => assert!(1 <= n && n < steps && 0.0 < sums && sums < total, "{what}, {kind}: {cluster}"),
            false => assert_eq!((n, sums), (0, 0.0), "{what}, {kind}: {cluster}"),
        }
    }
    let metrics = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    let line = |name: &str| metrics.lines().find(|l| l.starts_with(name)).map(str::to_string);
    assert!(line("fastmlx_cluster_up{").is_some_and(|l| l.ends_with(" 1")), "{what}: {metrics}");
    // Read after the status: as many or more (the engine may warm a turn meanwhile).
    let at_least = |prefix: &str, least: u64| {
        let n = metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        assert!(n.is_some_and(|n| n >= least), "{what}: {prefix} {least}: {metrics}");
    };
    at_least("fastmlx_cluster_steps_total{", steps);
    let layer_lines = metrics.lines().filter(|l| l.starts_with("fastmlx_cluster_node_layers{")).count();
    assert_eq!(layer_lines, ranks, "{what}: {metrics}");
    assert!(line("fastmlx_cluster_link_bytes_per_second{").is_some(), "{what}: {metrics}");
    let model = status["loaded"][0]["id"].as_str().unwrap();
    for kind in ["prompt", "decode"] {
        let timed = cluster["sums_timed"][kind]["steps"].as_u64().unwrap();
        at_least(&format!("fastmlx_cluster_timed_steps_total{{model=\"{model}\",steps=\"{kind}\"}}"), timed);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn served_across_ranks_answers_as_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let smollm2 = common::smollm2_gguf();
    assert_served_like_alone(dir.path(), &smollm2, (2, &[]), &["--speculative", "ngram"], "SmolLM2").await;
    // A draft model drafts on rank 0 (loaded whole there); the pipeline checks its tokens.
    let draft = ["--speculative", "draft", "--draft-model", smollm2.to_str().unwrap()];
    assert_served_like_alone(dir.path(), &smollm2, (2, &[]), &draft, "SmolLM2 drafted by a draft model").await;
    // Shared out by tensors: every rank runs its half of every layer's heads and columns on the
    // engine's rows, summing with the other's; a draft model (itself) drafts on rank 0.
    let qwen3 = dir.path().join("qwen3");
    synthetic::write_tiny_model(&qwen3, Arch::Qwen3, 3, None).unwrap();
    let draft = ["--speculative", "draft", "--draft-model", qwen3.to_str().unwrap()];
    let tensor = (2, &["--parallel", "tensor"][..]);
    assert_served_like_alone(dir.path(), &qwen3, tensor, &draft, "Qwen3 by tensors").await;
    // A random model repeats nothing for n-grams to find: its MTP head drafts (on rank 0,
    // with the ends), so the workers' recurrent layers take back rejected positions.
    let hybrid = dir.path().join("qwen35");
    let options = synthetic::TinyOptions { mtp: true, ..Default::default() };
    synthetic::write_tiny_model_with(&hybrid, Arch::Qwen35, 3, &options).unwrap();
    let mtp = ["--speculative", "mtp"];
    assert_served_like_alone(dir.path(), &hybrid, (3, &[]), &mtp, "Qwen3.5 (Gated DeltaNet hybrid)").await;
}

/// A short greedy answer of the server on `port`.
async fn short_answer(client: &reqwest::Client, port: u16) -> String {
    let body = json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0});
    let response = retried(|| client.post(format!("http://127.0.0.1:{port}/v1/completions")).json(&body)).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{status}: {body}");
    body["choices"][0]["text"].as_str().unwrap().to_string()
}

/// A long streamed completion on `port`, once its first tokens flow: the response, and what it
/// said so far.
async fn long_stream(client: &reqwest::Client, port: u16) -> (reqwest::Response, String) {
    let mut stream = client
        .post(format!("http://127.0.0.1:{port}/v1/completions"))
        .json(&json!({"prompt": "Count to a thousand.", "max_tokens": 4000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while seen.matches("data: ").count() < 5 {
        seen.push_str(&String::from_utf8_lossy(&stream.chunk().await.unwrap().expect("the stream ended early")));
    }
    (stream, seen)
}

/// The last 600 bytes or so of `text` (from a character's start), for a failure's message.
fn tail_of(text: &str) -> &str {
    let mut from = text.len().saturating_sub(600);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    &text[from..]
}

/// A request sent again if its connection closed unanswered: rank 0 hands its port over to
/// its next process image, and a connection it had accepted just before is closed.
async fn retried(request: impl Fn() -> reqwest::RequestBuilder) -> reqwest::Response {
    match request().send().await {
        Ok(response) => response,
        Err(e) => {
            eprintln!("sent again after: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
            request().send().await.unwrap()
        }
    }
}

/// Rank 0's server after its worker was lost mid-answer (`lose` does it to the worker's
/// process): the stream ends with an error event naming the rank within the deadline, the
/// server stays up saying which rank is gone, and new requests are refused with that. With
/// `restart`, the worker is then started again: the cluster forms again by itself and serves
/// the answers it gave before, also after idling past the deadline (the worker parked, woken
/// for rank 0's heartbeats).
/// The cluster: `ranks` processes, the model split as `split` says.
async fn assert_lost_worker_reported(
    lose: impl FnOnce(&mut Child),
    (how, said): (&str, &str),
    restart: bool,
    (ranks, split): (usize, &[&str]),
) {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = (common::smollm2_gguf(), host_file(dir.path(), ranks));
    let (port, mut nodes) = cluster_of(dir.path(), &model, &hosts, split).await;
    // A connection per request: rank 0 closes its open ones when it starts again.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let before = short_answer(&client, port).await;
    let body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 4000,
        "ignore_eos": true,
        "stream": true,
    });
    // The same, not streamed, running beside it: answered 503 (the cluster forms again).
    let whole = {
        let mut body = body.clone();
        body["stream"] = json!(false);
        let request = client.post(format!("{url}/v1/chat/completions")).json(&body).send();
        tokio::spawn(async move {
            let response = request.await.unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        })
    };
    let mut stream = client.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert!(stream.status().is_success(), "{}", stream.status());
    // Once tokens flow, the worker is lost.
    let mut seen = String::new();
    while seen.matches("data: ").count() < 5 {
        seen.push_str(&String::from_utf8_lossy(&stream.chunk().await.unwrap().expect("the stream ended early")));
    }
    lose(&mut nodes[1].child);
    let lost = Instant::now();
    // The deadline on a wait is 15 s (`cluster`).
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.chunk()).await.unwrap().unwrap() {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let waited = lost.elapsed();
    assert!(waited < Duration::from_secs(30), "{how}: the stream took {waited:?} to end");
    // Named by rank 0's roster, which rank 1's presence left as it went.
    let said = format!("rank 1 (127.0.0.1:{}) is gone: {said}", hosts_port(&hosts, 1));
    let tail = tail_of(&seen);
    assert!(tail.contains("\"error\"") && tail.contains(&said), "{how}: {tail}");
    let (status, whole) = whole.await.unwrap();
    assert_eq!(status, 503, "{how}: {whole}");
    assert!(whole["error"]["message"].as_str().unwrap().contains(&said), "{how}: {whole}");
    // Rank 0 may be starting again meanwhile (its port stays open): it says the same.
    let health = retried(|| client.get(format!("{url}/health"))).await;
    assert_eq!(health.status(), 503, "{how}");
    let health: Value = health.json().await.unwrap();
    assert!(health["error"].as_str().unwrap().contains(&said), "{how}: {health}");
    let refused = retried(|| {
        client.post(format!("{url}/v1/chat/completions")).json(&json!({
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "messages": [{"role": "user", "content": "Hello"}],
        }))
    })
    .await;
    assert_eq!(refused.status(), 503, "{how}");
    let refused: Value = refused.json().await.unwrap();
    assert!(refused["error"]["message"].as_str().unwrap().contains("rank 1"), "{how}: {refused}");
    let status: Value = retried(|| client.get(format!("{url}/admin/status"))).await.json().await.unwrap();
    assert!(status.to_string().contains("the cluster lost a rank"), "{how}: {status}");
    let metrics = retried(|| client.get(format!("{url}/metrics"))).await.text().await.unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("fastmlx_cluster_up{") && l.ends_with(" 0")), "{how}: {metrics}");
    eprintln!("{how}: the stream ended {waited:?} later: {tail}\n/health: {health}");
    if !restart {
        return;
    }
    // The worker is back (the same command): the cluster forms again by itself.
    nodes[1] = serve(dir.path(), &model, free_port(), &[], Some((&hosts, 1)));
    let back = Instant::now();
    wait_ready(port, &mut nodes[0]).await;
    eprintln!("{how}: served again {:?} after the worker started again", back.elapsed());
    assert!(nodes[0].log().contains("starting again to rejoin the cluster"), "{}", nodes[0].log());
    assert_eq!(short_answer(&client, port).await, before, "{how}: after the cluster formed again");
    // Idle past the deadline (15 s), parked: rank 0's heartbeats keep the worker, which would
    // otherwise take rank 0 for gone.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(short_answer(&client, port).await, before, "{how}: after idling: {}", nodes[1].log());
    assert!(nodes[1].child.try_wait().unwrap().is_none(), "the worker ended: {}", nodes[1].log());
    assert!(!nodes[1].log().contains("starting again"), "the worker lost rank 0: {}", nodes[1].log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_lost_mid_answer_ends_the_stream_with_an_error_and_is_served_again_once_back() {
    // Killed: its connections close, MLX's send fails.
    // Started again, it is served again.
    let killed = ("killed", "its connection to rank 0 closed without a goodbye");
    assert_lost_worker_reported(|worker| worker.kill().unwrap(), killed, true, (2, &[])).await;
    // Frozen (a machine that hangs or a cable pulled): nothing closes and MLX waits for good;
    // its presence at rank 0's roster falls silent, which ends the stream after 10 s, well
    // before the deadline on MLX's wait (60 s here), and the wait is left behind. Here with the
    // model shared out by tensors across 3 ranks (SmolLM2's 3 key/value heads): rank 0 waits in
    // MLX's sums, where MLX could not say which rank it waits for.
    let freeze = |worker: &mut Child| {
        let frozen = Command::new("kill").args(["-STOP", &worker.id().to_string()]).status().unwrap();
        assert!(frozen.success());
    };
    let frozen = ("frozen, by tensors", "not heard from for 10 s");
    let split = ["--parallel", "tensor", "--timeout", "60"];
    assert_lost_worker_reported(freeze, frozen, false, (3, &split)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn three_ranks_form_again_after_the_middle_one_is_lost_while_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = (common::smollm2_gguf(), host_file(dir.path(), 3));
    let (port, mut nodes) = cluster_of(dir.path(), &model, &hosts, &[]).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let before = short_answer(&client, port).await;
    // Idle: the workers parked off the ring (after 1 s without a step).
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes[1].child.kill().unwrap();
    // No request is running: rank 0's roster finds the lost rank by its presence.
    let lost = Instant::now();
    loop {
        let health = retried(|| client.get(format!("http://127.0.0.1:{port}/health"))).await;
        if health.status() == 503 {
            break;
        }
        assert!(lost.elapsed() < Duration::from_secs(40), "the lost rank not seen: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the idle cluster saw its lost rank {:?} later", lost.elapsed());
    // Rank 0 started again on its port, and says what it waits for.
    let waiting = loop {
        let status: Value =
            retried(|| client.get(format!("http://127.0.0.1:{port}/admin/status"))).await.json().await.unwrap();
        let reason = status["waiting"]["reason"].as_str().unwrap_or_default().to_string();
        // Rank 2 started again and checked in: rank 0 names the rank that is gone.
        if reason.contains("waiting for rank 1 (") && !reason.contains("rank 2 (") {
            break reason;
        }
        assert!(lost.elapsed() < Duration::from_secs(60), "rank 0 did not start again: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Named as the rank lost, by its presence on rank 0's roster (MLX says only that one of
    // ranks 1 and 2 is lost or stalled); rank 2, parked, is not taken for gone.
    let gone = format!("the cluster lost a rank: rank 1 (127.0.0.1:{}) is gone: ", hosts_port(&hosts, 1));
    assert!(waiting.contains(&gone), "{waiting}");
    let rank2 = format!("rank 2 (127.0.0.1:{})", hosts_port(&hosts, 2));
    assert!(!nodes[0].log().contains(&format!("{rank2} is gone")), "{}", nodes[0].log());
    let metrics = retried(|| client.get(format!("http://127.0.0.1:{port}/metrics"))).await.text().await.unwrap();
    assert!(metrics.contains("fastmlx_cluster_up{model=\"SmolLM2-135M-Instruct.Q4_1\"} 0"), "{metrics}");
    nodes[1] = serve(dir.path(), &model, free_port(), &[], Some((&hosts, 1)));
    let back = Instant::now();
    wait_ready(port, &mut nodes[0]).await;
    eprintln!("served again {:?} after the middle rank started again", back.elapsed());
    assert_eq!(short_answer(&client, port).await, before, "{}", nodes[0].log());
    // Rank 2 started again with rank 0 (it follows rank 0's roster connection closing).
    for rank in [0, 2] {
        assert!(nodes[rank].log().contains("starting again to rejoin the cluster"), "{}", nodes[rank].log());
    }
}

/// The CPU time process `pid` has used, in seconds (user and system, from `/proc`).
#[cfg(target_os = "linux")]
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's name (in parentheses, which may hold spaces): utime and
    // stime are the 14th and 15th of the line, in ticks of 1/100 s.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    (fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()) as f64 / 100.0
}

/// Four machines, the most a Thunderbolt ring of Macs usually has: a rank with no link to rank 0
/// (rank 2, between ranks 1 and 3) killed mid-answer is named, its neighbours follow rank 0 as it
/// starts again, and the cluster serves the same answer once the rank is back.
#[tokio::test(flavor = "multi_thread")]
async fn four_ranks_name_a_rank_away_from_rank_0_and_form_again() {
    let dir = tempfile::tempdir().unwrap();
    // The tiny Qwen3.5 has 4 layers (3 of Gated DeltaNet, 1 of attention): one per rank.
    let model = dir.path().join("qwen35");
    synthetic::write_tiny_model(&model, Arch::Qwen35, 4, None).unwrap();
    // Room for an answer long enough to be cut by the kill however fast this machine runs.
    let config_path = model.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(8192);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let hosts = host_file(dir.path(), 4);
    let (port, mut nodes) = cluster_of(dir.path(), &model, &hosts, &[]).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let before = short_answer(&client, port).await;
    assert_cluster_shown(port, 4, false, "4 ranks").await;
    // Idle, the workers are parked off MLX's ring, whose wait polls its sockets in a loop (a
    // core each, for as long as the cluster is idle): they use next to no CPU.
    #[cfg(target_os = "linux")]
    {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let used = |node: &Node| cpu_seconds(node.child.id());
        let start: Vec<f64> = nodes[1..].iter().map(used).collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        for (i, node) in nodes[1..].iter().enumerate() {
            let busy = used(node) - start[i];
            assert!(busy < 0.25, "rank {}: {busy:.2} s of CPU in 2 s idle: {}", i + 1, node.log());
        }
        // Woken for the next request.
        assert_eq!(short_answer(&client, port).await, before, "after a park: {}", nodes[0].log());
    }
    let (mut stream, mut seen) = long_stream(&client, port).await;
    nodes[2].child.kill().unwrap();
    let lost = Instant::now();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.chunk()).await.unwrap().unwrap() {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let waited = lost.elapsed();
    let tail = tail_of(&seen);
    let gone = format!("the cluster lost a rank: rank 2 (127.0.0.1:{}) is gone", hosts_port(&hosts, 2));
    assert!(tail.contains(&gone), "{tail}");
    assert!(waited < Duration::from_secs(8), "the stream took {waited:?} to end: {tail}");
    eprintln!("4 ranks: the stream ended {waited:?} after rank 2 was killed: {tail}");
    nodes[2] = serve(dir.path(), &model, free_port(), &[], Some((&hosts, 2)));
    let back = Instant::now();
    wait_ready(port, &mut nodes[0]).await;
    eprintln!("4 ranks: served again {:?} after rank 2 started again", back.elapsed());
    assert_eq!(short_answer(&client, port).await, before, "{}", nodes[0].log());
    // The ranks that stayed started again with rank 0, to form anew with rank 2 back.
    for rank in [0, 1, 3] {
        assert!(nodes[rank].log().contains("starting again to rejoin the cluster"), "{}", nodes[rank].log());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_short_of_memory_bounds_the_kv_that_rank_0_admits_and_the_model_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = (common::smollm2_gguf(), host_file(dir.path(), 2));
    let port = free_port();
    // Rank 0 drafts with a draft model (itself): the drafts' keys and values are all on rank 0.
    let draft = ["--speculative", "draft", "--draft-model", model.to_str().unwrap()];
    let mut nodes = vec![serve(dir.path(), &model, port, &draft, Some((&hosts, 0)))];
    tokio::time::sleep(Duration::from_millis(500)).await;
    nodes.push(serve(dir.path(), &model, free_port(), &["--memory-limit", "400MiB"], Some((&hosts, 1))));
    wait_ready(port, &mut nodes[0]).await;
    let log = nodes[1].log();
    let room: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("rank 1: room for ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the worker told no room: {log}"));
    let status: Value =
        reqwest::get(format!("http://127.0.0.1:{port}/admin/status")).await.unwrap().json().await.unwrap();
    let budget = status["loaded"][0]["kv_budget_bytes"].as_u64().unwrap();
    // SmolLM2-135M: layers of 3 KV heads of 64, at most 4 bytes an element; rank 0 counts the
    // keys and values of its own stage's layers (its prefix cache's blocks hold those too).
    // Alone, rank 0's budget here is gigabytes (70 % of the machine).
    let first = &status["loaded"][0]["cluster"]["nodes"][0];
    let layers = first["end_layer"].as_u64().unwrap() - first["first_layer"].as_u64().unwrap();
    assert!(layers < 30, "{status}");
    let per_token_bound = layers * 2 * 3 * 64 * 4;
    assert!(0 < budget && budget <= room * per_token_bound, "budget {budget} for {room} tokens: {status}");
    // The draft model's keys and values take their share beside the worker's room, not out
    // of it: rank 0 still admits the tokens the worker holds (2 bytes an element at least).
    assert!(budget >= room * layers * 2 * 3 * 64 * 2, "budget {budget} for {room} tokens: {status}");
    let client = reqwest::Client::new();
    assert!(short_answer(&client, port).await.contains("Paris"));
    // The split model stays loaded while the server runs (unloaded, the workers would end).
    let unload = client
        .post(format!("http://127.0.0.1:{port}/admin/unload"))
        .json(&json!({"model": "SmolLM2-135M-Instruct.Q4_1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 409, "{}", unload.text().await.unwrap());
    assert!(short_answer(&client, port).await.contains("Paris"));
}

/// The roster's view from `/admin/status`: the cluster's nodes' ranks (rank 0's only while
/// it serves alone) and the machines it serves without.
async fn cluster_nodes(client: &reqwest::Client, port: u16) -> Option<(Vec<u64>, Vec<String>)> {
    let response = retried(|| client.get(format!("http://127.0.0.1:{port}/admin/status"))).await;
    let status: Value = response.json().await.ok()?;
    let cluster = status["loaded"].as_array()?.first()?.get("cluster")?.clone();
    let ranks = cluster["nodes"].as_array()?.iter().filter_map(|n| n["rank"].as_u64()).collect();
    let without = cluster["without"].as_array()?.iter().filter_map(|w| w.as_str().map(str::to_string)).collect();
    Some((ranks, without))
}

/// Waits until the cluster serves with the machines `ranks`, at most `within`.
async fn serving_with(client: &reqwest::Client, port: u16, ranks: &[u64], within: Duration, node: &Node) {
    let since = Instant::now();
    while cluster_nodes(client, port).await.is_none_or(|(serving, _)| serving != ranks) {
        assert!(since.elapsed() < within, "not served by ranks {ranks:?}: {}", node.log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("served by ranks {ranks:?} {:?} later", since.elapsed());
}

/// Waits until `/health` says 503 (the lost machine found), then until it says 200 again.
async fn served_again(client: &reqwest::Client, port: u16, node: &mut Node, what: &str) {
    let lost = Instant::now();
    while retried(|| client.get(format!("http://127.0.0.1:{port}/health"))).await.status() != 503 {
        assert!(lost.elapsed() < Duration::from_secs(40), "{what}: the lost rank not seen: {}", node.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_ready(port, node).await;
    eprintln!("{what}: served again {:?} after the loss", lost.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn machines_gone_past_the_limit_are_served_without_and_taken_back_when_they_can_form() {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = (common::smollm2_gguf(), host_file(dir.path(), 3));
    let args = ["--drop-after", "8"];
    let (port, mut nodes) = cluster_of(dir.path(), &model, &hosts, &args).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let before = short_answer(&client, port).await;
    // Rank 1 gone for good: after 8 s the model is split across ranks 0 and 2 again, rank 2
    // now second in the ring and still named rank 2.
    nodes[1].child.kill().unwrap();
    served_again(&client, port, &mut nodes[0], "without rank 1").await;
    assert_eq!(short_answer(&client, port).await, before, "on two machines: {}", nodes[0].log());
    let (ranks, without) = cluster_nodes(&client, port).await.expect("a cluster");
    assert_eq!(ranks, [0, 2], "{without:?}");
    assert!(without.len() == 1 && without[0].starts_with("rank 1 (127.0.0.1:"), "{without:?}");
    assert!(nodes[2].log().contains("rank 2 (rank 1 of 2, without rank 1 (127.0.0.1:"), "{}", nodes[2].log());
    // Rank 2 gone too: rank 0 serves the model alone (it fits here).
    nodes[2].child.kill().unwrap();
    served_again(&client, port, &mut nodes[0], "alone").await;
    assert_eq!(short_answer(&client, port).await, before, "alone: {}", nodes[0].log());
    // Shown as a cluster of this machine alone, without the others, and kept loaded for them.
    let (ranks, without) = cluster_nodes(&client, port).await.expect("alone, shown as its cluster");
    assert_eq!(ranks, [0]);
    assert!(
        without.len() == 2 && without[0].starts_with("rank 1 (") && without[1].starts_with("rank 2 ("),
        "{without:?}"
    );
    let unload = client
        .post(format!("http://127.0.0.1:{port}/admin/unload"))
        .json(&json!({"model": "SmolLM2-135M-Instruct.Q4_1"}));
    let refused = unload.send().await.unwrap();
    assert_eq!(refused.status(), 409, "{}", refused.text().await.unwrap());
    assert!(nodes[0].log().contains("serving SmolLM2-135M-Instruct.Q4_1 on this machine alone"), "{}", nodes[0].log());
    // `/metrics` and the Live page count it as a cluster of one machine, serving without two.
    let metrics = client.get(format!("http://127.0.0.1:{port}/metrics")).send().await.unwrap().text().await.unwrap();
    for series in [
        "fastmlx_cluster_nodes{model=\"SmolLM2-135M-Instruct.Q4_1\"} 1",
        "fastmlx_cluster_without{model=\"SmolLM2-135M-Instruct.Q4_1\"} 2",
    ] {
        assert!(metrics.lines().any(|l| l == series), "{series}: {metrics}");
    }
    let started = Instant::now();
    loop {
        let history: Value = client
            .get(format!("http://127.0.0.1:{port}/admin/metrics/history"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let latest = &history["samples"].as_array().unwrap().last().unwrap()["models"][0]["cluster"];
        if latest["nodes"].as_array().is_some_and(|n| n.len() == 1)
            && latest["without"].as_array().is_some_and(|w| w.len() == 2)
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the Live page's samples: {latest}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A machine back with other settings is refused at the roster, and rank 0 serves on.
    let mut other = serve(dir.path(), &model, free_port(), &["--kv-bits", "8"], Some((&hosts, 1)));
    let status = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some(status) = other.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("a machine with other settings was not refused: {}", other.log()));
    assert!(
        !status.success() && other.log().contains("rank 0 refused rank 1: the ranks do not match"),
        "{}",
        other.log()
    );
    assert_eq!(short_answer(&client, port).await, before, "alone, after the refusal: {}", nodes[0].log());
    // Rank 1 back, and its load fails as rank 0 takes it in: its copy of the model is damaged
    // (a GGUF file is known by its name and size, so the roster lets it in). Rank 0 serves alone
    // again, holding rank 1 off.
    let damaged = dir.path().join("damaged").join(model.file_name().unwrap());
    std::fs::create_dir_all(damaged.parent().unwrap()).unwrap();
    let mut bytes = std::fs::read(&model).unwrap();
    bytes[..4].copy_from_slice(b"XXXX");
    std::fs::write(&damaged, bytes).unwrap();
    nodes[1] = serve(dir.path(), &damaged, free_port(), &args, Some((&hosts, 1)));
    let tried = Instant::now();
    while !nodes[0].log().contains("could not be taken back") {
        assert!(tried.elapsed() < Duration::from_secs(90), "the take-in did not fail: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let why = "could not be taken back (rank 1 could not load its part of the model";
    assert!(nodes[0].log().contains(why), "{}", nodes[0].log());
    assert!(nodes[1].log().contains("not a GGUF file"), "{}", nodes[1].log());
    wait_ready(port, &mut nodes[0]).await;
    eprintln!("alone again {:?} after rank 1 came back and could not load", tried.elapsed());
    assert_eq!(short_answer(&client, port).await, before, "alone again: {}", nodes[0].log());
    // Rank 2 back: once the server is idle, the cluster forms again with it (rank 1 held off).
    let back = Instant::now();
    nodes[2] = serve(dir.path(), &model, free_port(), &args, Some((&hosts, 2)));
    loop {
        if let Some((ranks, without)) = cluster_nodes(&client, port).await {
            if ranks == [0, 2] {
                assert!(without.len() == 1 && without[0].starts_with("rank 1 ("), "{without:?}");
                break;
            }
        }
        assert!(back.elapsed() < Duration::from_secs(90), "not taken back: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("rank 2 served again {:?} after it started again", back.elapsed());
    // Rank 0 fell back and held rank 1 off (the hold itself is shown by the roster's unit tests).
    assert!(nodes[0].log().contains("serving without it again, and trying it again in 5 min"), "{}", nodes[0].log());
    assert!(nodes[0].log().contains("rank 2 (127.0.0.1:"), "{}", nodes[0].log());
    assert_eq!(short_answer(&client, port).await, before, "rank 2 back: {}", nodes[0].log());
    // Rank 1's copy mended and the machine started again (its load failure ended it): shown
    // as held off, with the time left, and not taken in by itself however idle the server
    // is; a person's ask takes it in now.
    assert!(nodes[1].child.try_wait().unwrap().is_some(), "rank 1 still runs: {}", nodes[1].log());
    nodes[1] = serve(dir.path(), &model, free_port(), &args, Some((&hosts, 1)));
    let rank1 = format!("rank 1 (127.0.0.1:{})", hosts_port(&hosts, 1));
    let started = Instant::now();
    let held = loop {
        let response = retried(|| client.get(format!("http://127.0.0.1:{port}/admin/status"))).await;
        let status: Value = response.json().await.unwrap();
        let held = status["loaded"][0]["cluster"]["held"][0].clone();
        if !held.is_null() {
            break held;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "rank 1 not shown held: {status}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(held["machine"], json!(rank1), "{held}");
    assert!(held["seconds_left"].as_u64().is_some_and(|s| s > 0 && s <= 300), "{held}");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(cluster_nodes(&client, port).await.unwrap().0, [0, 2], "taken in while held: {}", nodes[0].log());
    let asked = retried(|| client.post(format!("http://127.0.0.1:{port}/admin/cluster/take-back"))).await;
    assert_eq!(asked.status(), 202);
    assert_eq!(asked.json::<Value>().await.unwrap()["taking_back"], json!([rank1]));
    serving_with(&client, port, &[0, 1, 2], Duration::from_secs(90), &nodes[0]).await;
    assert_eq!(short_answer(&client, port).await, before, "rank 1 taken back when asked: {}", nodes[0].log());
    // It served, so its hold is gone: lost again and back, it is never shown held, and is
    // taken back by itself.
    nodes[1].child.kill().unwrap();
    serving_with(&client, port, &[0, 2], Duration::from_secs(90), &nodes[0]).await;
    nodes[1] = serve(dir.path(), &model, free_port(), &args, Some((&hosts, 1)));
    let back = Instant::now();
    loop {
        let response = retried(|| client.get(format!("http://127.0.0.1:{port}/admin/status"))).await;
        let status: Value = response.json().await.unwrap();
        let cluster = &status["loaded"][0]["cluster"];
        assert!(cluster["held"].is_null(), "held again: {status}");
        if cluster["nodes"].as_array().is_some_and(|n| n.len() == 3) {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(90), "not taken back: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(short_answer(&client, port).await, before, "rank 1 back by itself: {}", nodes[0].log());
}

/// A tiny Llama written in `dir`, and a host file of two ranks.
fn tiny_llama_for_two(dir: &Path) -> (PathBuf, PathBuf) {
    let model = dir.join("tiny-llama");
    synthetic::write_tiny_model(&model, Arch::Llama, 3, None).unwrap();
    (model, host_file(dir, 2))
}

/// With `--take-back asked`, a machine that is back is listed (`/admin/status`'s `back`) but not
/// taken in however idle the server is, until a person asks (`POST /admin/cluster/take-back`):
/// taking it in reloads the model across the machines, minutes of 503s for a large model.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_back_is_taken_in_only_when_asked_where_the_server_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = tiny_llama_for_two(dir.path());
    let args = ["--drop-after", "2", "--take-back", "asked"];
    let (port, mut nodes) = cluster_of(dir.path(), &model, &hosts, &args).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let before = short_answer(&client, port).await;
    let take_back = || client.post(format!("http://127.0.0.1:{port}/admin/cluster/take-back"));
    let status = || async {
        let status: Value =
            retried(|| client.get(format!("http://127.0.0.1:{port}/admin/status"))).await.json().await.unwrap();
        status["loaded"][0]["cluster"].clone()
    };
    // Rank 1 gone (a request finds it at once): past 2 s, rank 0 serves the model alone.
    nodes[1].child.kill().unwrap();
    let _ = client
        .post(format!("http://127.0.0.1:{port}/v1/completions"))
        .json(&json!({"prompt": "Hi", "max_tokens": 2}))
        .send()
        .await;
    let lost = Instant::now();
    while cluster_nodes(&client, port).await.is_none_or(|(ranks, _)| ranks != [0]) {
        assert!(lost.elapsed() < Duration::from_secs(60), "not alone: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused = retried(take_back).await;
    assert_eq!(refused.status(), 409);
    let refused: Value = refused.json().await.unwrap();
    assert!(
        refused["error"]["message"].as_str().unwrap().contains("no machine the cluster serves without is back"),
        "{refused}"
    );
    // Back: listed, and still left out after idling past the 5 s of `--take-back idle`.
    nodes[1] = serve(dir.path(), &model, free_port(), &args, Some((&hosts, 1)));
    let started = Instant::now();
    while status().await["back"].as_array().is_none_or(|b| b.is_empty()) {
        assert!(started.elapsed() < Duration::from_secs(30), "never listed as back: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let cluster = status().await;
    assert_eq!(cluster["take_back"], "asked", "{cluster}");
    assert!(cluster["back"][0].as_str().unwrap().starts_with("rank 1 (127.0.0.1:"), "{cluster}");
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(cluster_nodes(&client, port).await.map(|(ranks, _)| ranks), Some(vec![0]), "{}", nodes[0].log());
    // Asked: the cluster forms again with it and answers as before.
    let asked = retried(take_back).await;
    assert_eq!(asked.status(), 202);
    let asked: Value = asked.json().await.unwrap();
    assert!(asked["taking_back"][0].as_str().unwrap().starts_with("rank 1 ("), "{asked}");
    let started = Instant::now();
    while cluster_nodes(&client, port).await.is_none_or(|(ranks, _)| ranks != [0, 1]) {
        assert!(started.elapsed() < Duration::from_secs(60), "not taken back: {}", nodes[0].log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(short_answer(&client, port).await, before, "{}", nodes[0].log());
}

/// A rank of `hosts` serving `repo`, on a machine of its own (`dir`: its models folder, empty at
/// first) that reaches the Hub at `hub`.
fn pulling(dir: &Path, repo: &str, port: u16, (hosts, rank): (&Path, usize), hub: &FakeHub) -> Node {
    std::fs::create_dir_all(dir).unwrap();
    let (mut command, log) = serve_command(dir, Path::new(repo), port, &[], Some((hosts, rank)));
    command
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HUB_CACHE", dir.join("hf"))
        .env("LMSTUDIO_MODELS_DIR", dir.join("lms"));
    Node { child: command.spawn().unwrap(), log }
}

/// A Mac of the cluster without the model pulls it from the Hub (verified as any pull) before
/// it joins; a repo the Hub does not have ends that rank with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_absent_on_a_machine_is_pulled_there_before_it_joins() {
    const REPO: &str = "test-org/tiny-llama";
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("written");
    synthetic::write_tiny_model(&written, Arch::Llama, 3, None).unwrap();
    let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&written)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    let hub =
        FakeHub::start(vec![FakeRepo::new(REPO, files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect())]).await;
    let hosts = host_file(dir.path(), 2);

    let mut absent = pulling(&dir.path().join("other"), "test-org/absent", free_port(), (&hosts, 1), &hub);
    let status = absent.child.wait().unwrap();
    assert!(!status.success());
    assert!(
        absent.log().contains("rank 1: test-org/absent is not on this machine and could not be pulled"),
        "{}",
        absent.log()
    );

    // Two machines, neither of which has it: each pulls it to its own disk, then they form.
    let port = free_port();
    let mut first = pulling(&dir.path().join("mac-1"), REPO, port, (&hosts, 0), &hub);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = pulling(&dir.path().join("mac-2"), REPO, free_port(), (&hosts, 1), &hub);
    wait_ready(port, &mut first).await;
    for (rank, node) in [(0, &first), (1, &second)] {
        assert!(node.log().contains(&format!("rank {rank}: {REPO} pulled to")), "{}", node.log());
    }
    let client = reqwest::Client::new();
    assert!(!short_answer(&client, port).await.is_empty());
    let status: Value =
        client.get(format!("http://127.0.0.1:{port}/admin/status")).send().await.unwrap().json().await.unwrap();
    let model = status["loaded"].as_array().unwrap().iter().find(|m| m["id"] == REPO).expect("served under its Hub id");
    assert_eq!(model["cluster"]["nodes"].as_array().unwrap().len(), 2, "{model}");
}

/// A machine that checks in but whose MLX port another process holds is named, on rank 0 and on
/// itself, and waited for (MLX's start would fail without saying which rank could not listen);
/// once the port is free, the cluster forms.
#[tokio::test(flavor = "multi_thread")]
async fn a_machine_whose_mlx_port_is_taken_is_named_and_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let (model, hosts) = tiny_llama_for_two(dir.path());
    let list: Vec<Vec<String>> = serde_json::from_str(&std::fs::read_to_string(&hosts).unwrap()).unwrap();
    let taken = list[1][0].clone();
    let holder = std::net::TcpListener::bind(&taken).unwrap();
    let port = free_port();
    let mut first = serve(dir.path(), &model, port, &[], Some((&hosts, 0)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = serve(dir.path(), &model, free_port(), &[], Some((&hosts, 1)));
    let client = reqwest::Client::new();
    let body = json!({"model": "tiny-llama", "prompt": "Hi", "max_tokens": 2});
    let started = Instant::now();
    let said = loop {
        let response = client.post(format!("http://127.0.0.1:{port}/v1/completions")).json(&body).send().await;
        if let Ok(response) = response {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            if status == 503 && text.contains("MLX cannot listen") {
                break text;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never named: {}", first.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(said.contains(&format!("waiting for rank 1 ({taken}): MLX cannot listen at {taken}: ")), "{said}");
    assert!(second.log().contains(&format!("rank 1: MLX cannot listen at {taken}")), "{}", second.log());
    drop(holder);
    wait_ready(port, &mut first).await;
    assert!(!short_answer(&client, port).await.is_empty());
    assert!(second.log().contains("rank 1: MLX can listen at this machine's address again"), "{}", second.log());
}

/// A rank the app runs names the app its parent (`FASTMLX_EXIT_WITH_PARENT`): once the app is
/// gone (a crash included), the rank ends rather than keep its port and memory.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn a_rank_the_app_started_ends_when_the_app_is_gone() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let hosts = host_file(dir.path(), 2);
    // A shell stands in for the app: it starts rank 1 (which waits for rank 0's roster), naming
    // itself the parent, and is killed.
    let (rank, log) = serve_command(dir.path(), &common::smollm2_gguf(), free_port(), &[], Some((&hosts, 1)));
    let mut app = Command::new("sh");
    app.arg("-c").arg(r#"FASTMLX_EXIT_WITH_PARENT=$$ "$@" & echo $!; wait"#).arg("sh");
    app.arg(rank.get_program()).args(rank.get_args());
    for (key, value) in rank.get_envs() {
        if let Some(value) = value {
            app.env(key, value);
        }
    }
    app.stdout(Stdio::piped()).stderr(std::fs::File::create(&log).unwrap());
    let mut app = app.spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(app.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !matches!(s.rsplit_once(") ").map(|(_, r)| &r[..1]), Some("Z" | "X")))
    };
    let started = Instant::now();
    while !read().contains("waiting for rank 0's roster") {
        assert!(started.elapsed() < Duration::from_secs(30) && alive(), "rank 1 did not start: {}", read());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.kill().unwrap();
    app.wait().unwrap();
    let gone = Instant::now();
    while alive() {
        assert!(gone.elapsed() < Duration::from_secs(10), "rank 1 outlived the app: {}", read());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(read().contains("the app that started this rank (process"), "{}", read());
}

/// Machines on a network of their own: Linux network namespaces on a bridge (`common::lan`).
#[cfg(target_os = "linux")]
mod on_a_network {
    use super::*;
    use common::lan::Lan;

    /// Rank `rank` of the cluster `hosts` served on its machine of `lan` (each worker's HTTP port
    /// is in a namespace of its own; rank 0's, `port`, is this machine's).
    fn serve_on(lan: &Lan, dir: &Path, model: &Path, port: u16, args: &[&str], (hosts, rank): (&Path, usize)) -> Node {
        let program = lan.command(rank, env!("CARGO_BIN_EXE_fastmlx"));
        let (mut command, log) = serve_command_from(program, dir, model, port, args, Some((hosts, rank)));
        Node { child: command.spawn().unwrap(), log }
    }

    /// Three machines on a network of their own, serving SmolLM2 under `--drop-after 8`: the
    /// network, rank 0's port, the nodes, and the cluster's first answer.
    async fn three_on_a_lan(dir: &Path) -> (Lan, u16, Vec<Node>, String) {
        let lan = Lan::new(3);
        let (model, hosts) = (common::smollm2_gguf(), lan.host_file(dir));
        let args = ["--drop-after", "8"];
        let (port, nodes) =
            started_in_order(lan.ranks(), |rank, port| serve_on(&lan, dir, &model, port, &args, (&hosts, rank))).await;
        let before = short_answer(&reqwest::Client::new(), port).await;
        (lan, port, nodes, before)
    }

    /// The text a streamed completion's events carried.
    fn streamed_text(events: &str) -> String {
        let chunks = events.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| d.starts_with('{'));
        let chunks = chunks.map(|d| serde_json::from_str::<Value>(d).unwrap());
        chunks.filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string)).collect()
    }

    /// Reads `stream` to its end (within 60 s), after `seen`: all it said, and how long after
    /// `since` it ended.
    async fn to_the_end(mut stream: reqwest::Response, seen: String, since: Instant) -> (String, Duration) {
        // Bytes first: a character may be split across two chunks.
        let mut bytes = seen.into_bytes();
        while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.chunk()).await.unwrap().unwrap() {
            bytes.extend_from_slice(&chunk);
        }
        (String::from_utf8_lossy(&bytes).into_owned(), since.elapsed())
    }

    /// Three machines on a network of their own (network namespaces on a bridge, not loopback), a
    /// cable pulled as from a Mac: nothing closes, what crosses it is dropped. A cable out for a
    /// second mid-answer costs the answer nothing (TCP sends again what was lost; the links'
    /// watch needs three failed probes in a row). Out for good mid-answer, the stream ends within
    /// seconds naming the machine rank 0 cannot reach; past `--drop-after` the others serve the
    /// model, and the machine is taken back once its cable is in again (its process, which never
    /// ended, waited for rank 0 all along).
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "makes network namespaces: needs root (scripts/test.sh runs it as root)"]
    async fn a_cable_pulled_mid_answer_is_named_in_seconds_served_without_and_taken_back_once_plugged() {
        let dir = tempfile::tempdir().unwrap();
        let (lan, port, mut nodes, before) = three_on_a_lan(dir.path()).await;
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let url = format!("http://127.0.0.1:{port}/v1/completions");
        let mut body =
            json!({"prompt": "Count to a thousand.", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
        let whole: Value = client.post(&url).json(&body).send().await.unwrap().json().await.unwrap();
        let whole = whole["choices"][0]["text"].as_str().unwrap().to_string();

        body["stream"] = json!(true);
        let mut stream = client.post(&url).json(&body).send().await.unwrap();
        let mut seen = String::new();
        while seen.matches("data: ").count() < 5 {
            seen.push_str(&String::from_utf8_lossy(&stream.chunk().await.unwrap().expect("the stream ended early")));
        }
        // Mid-answer: some 35 tokens to go, which wait for the cable (each step crosses it).
        assert!(!seen.contains("[DONE]"), "the answer ended before the cable was pulled: {seen}");
        lan.pull_cable(2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        lan.plug_cable(2);
        let (seen, _) = to_the_end(stream, seen, Instant::now()).await;
        assert!(!seen.contains("\"error\""), "a flap ended the answer: {}", tail_of(&seen));
        assert_eq!(streamed_text(&seen), whole, "a flap changed the answer: {}", nodes[0].log());

        let (stream, seen) = long_stream(&client, port).await;
        lan.pull_cable(1);
        let (seen, waited) = to_the_end(stream, seen, Instant::now()).await;
        let tail = tail_of(&seen);
        let rank1 = format!("rank 1 ({}:5000)", lan.address(1));
        // Rank 0's probes of rank 1's post go unanswered (not refused), three a second apart.
        assert!(
            tail.contains(&format!("cannot reach {rank1} (the link")) && tail.contains("no answer in 1 s"),
            "{tail}"
        );
        assert!(waited < Duration::from_secs(8), "the stream took {waited:?} to end: {tail}");
        eprintln!("the pulled cable ended the stream {waited:?} later: {tail}");
        let health: Value =
            retried(|| client.get(format!("http://127.0.0.1:{port}/health"))).await.json().await.unwrap();
        assert!(health["error"].as_str().unwrap_or_default().contains(&rank1), "{health}");

        // Past the limit: ranks 0 and 2 serve the model, and say without which machine.
        serving_with(&client, port, &[0, 2], Duration::from_secs(90), &nodes[0]).await;
        assert_eq!(short_answer(&client, port).await, before, "without rank 1: {}", nodes[0].log());
        let (_, without) = cluster_nodes(&client, port).await.unwrap();
        assert!(without.len() == 1 && without[0].starts_with(&rank1), "{without:?}");
        // Plugged in again: taken back once the server is idle.
        lan.plug_cable(1);
        serving_with(&client, port, &[0, 1, 2], Duration::from_secs(90), &nodes[0]).await;
        assert_eq!(short_answer(&client, port).await, before, "rank 1 back: {}", nodes[0].log());
        assert!(nodes[1].child.try_wait().unwrap().is_none(), "rank 1 ended: {}", nodes[1].log());
    }

    /// The link between two workers cut mid-answer (rank 1's to rank 2 in the ring, a cable of a
    /// Thunderbolt mesh), both still reaching rank 0: each side finds no route to the other. The
    /// stream ends within seconds naming the link; the ring cannot form past the cut, so past
    /// `--drop-after` the machine behind it is left out and the others serve; once the link is
    /// mended it is taken back.
    #[tokio::test(flavor = "multi_thread")]
    #[ignore = "makes network namespaces: needs root (scripts/test.sh runs it as root)"]
    async fn a_link_cut_between_workers_is_named_and_the_machine_behind_it_left_out_until_mended() {
        let dir = tempfile::tempdir().unwrap();
        let (lan, port, nodes, before) = three_on_a_lan(dir.path()).await;
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();

        let (stream, seen) = long_stream(&client, port).await;
        lan.cut_link(1, 2);
        let (seen, waited) = to_the_end(stream, seen, Instant::now()).await;
        let tail = tail_of(&seen);
        let (rank1, rank2) = (format!("rank 1 ({}:5000)", lan.address(1)), format!("rank 2 ({}:5000)", lan.address(2)));
        assert!(tail.contains(&format!("the cluster lost a rank: {rank1} cannot reach {rank2} (the link")), "{tail}");
        // Three probes a second apart, then the next heartbeat: well before a presence falls
        // silent (10 s) or the deadline on MLX's wait (15 s).
        assert!(waited < Duration::from_secs(8), "the stream took {waited:?} to end: {tail}");
        eprintln!("the cut link ended the stream {waited:?} later: {tail}");

        // Both present at rank 0, but the ring cannot form across the cut: past the limit rank 2,
        // the machine not reached, is left out.
        serving_with(&client, port, &[0, 1], Duration::from_secs(90), &nodes[0]).await;
        assert_eq!(short_answer(&client, port).await, before, "without rank 2: {}", nodes[0].log());
        let (_, without) = cluster_nodes(&client, port).await.unwrap();
        assert!(without.len() == 1 && without[0].starts_with(&rank2), "{without:?}");
        // Mended before rank 0 tries it again (idle 5 s): taken back.
        lan.mend_link(1, 2);
        serving_with(&client, port, &[0, 1, 2], Duration::from_secs(90), &nodes[0]).await;
        assert_eq!(short_answer(&client, port).await, before, "rank 2 back: {}", nodes[0].log());
    }
}
