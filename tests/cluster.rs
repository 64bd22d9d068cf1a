//! The cluster with 2 and 3 processes on this machine and MLX's `ring` backend over loopback.
//! The preflight (`fastmlx cluster check`): the ranks agree and measure the ring's links; a rank
//! with another model or other settings is refused on every rank, naming the difference; a bad
//! host file or a rank whose peer never comes gives an error, never a hang. Pipeline parallel
//! (`fastmlx generate --cluster`): the model split across the ranks says what one process says,
//! for the tiny model of every architecture and for SmolLM2; a worker killed mid-generation ends
//! rank 0 with an error within a bounded time.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use fastmlx::fixtures::synthetic;
use fastmlx::model::Arch;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn host_file(dir: &Path, ranks: usize) -> std::path::PathBuf {
    let hosts: Vec<Vec<String>> = (0..ranks).map(|_| vec![format!("127.0.0.1:{}", free_port())]).collect();
    let path = dir.join("hosts.json");
    std::fs::write(&path, serde_json::to_string(&hosts).unwrap()).unwrap();
    path
}

/// Runs one check per `(model, settings)`, rank by rank (MLX's ring connects more reliably when
/// its ranks start in order), and waits for all.
fn check(hosts: &Path, nodes: &[(&Path, &str)], timeout: u64) -> Vec<Output> {
    let children: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(rank, (model, settings))| {
            let child = Command::new(env!("CARGO_BIN_EXE_fastmlx"))
                .args(["cluster", "check", "--hostfile"])
                .arg(hosts)
                .args(["--rank", &rank.to_string(), "--settings", settings, "--timeout", &timeout.to_string()])
                .arg("--model")
                .arg(model)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(500));
            child
        })
        .collect();
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn two_and_three_ranks_agree_and_measure_their_links() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    synthetic::write_tiny_model(&model, Arch::Llama, 1, None).unwrap();
    for size in [2, 3] {
        let nodes = vec![(model.as_path(), "ctx=4096"); size];
        let out = check(&host_file(dir.path(), size), &nodes, 60);
        for (rank, o) in out.iter().enumerate() {
            assert!(o.status.success(), "rank {rank} of {size}: {}", text(o));
            let says = text(o);
            assert!(says.contains(&format!("rank {rank} of {size}")) && says.contains("every rank agrees"), "{says}");
        }
        let links = text(&out[0]);
        // Each link of the ring (MLX's ring talks only to neighbours): 0-1 for two ranks,
        // 0-1, 1-2 and 2-0 for three.
        let ring = if size == 2 { 1 } else { size };
        for from in 0..ring {
            assert!(links.contains(&format!("link {from} <-> {}: round trip", (from + 1) % size)), "{links}");
        }
    }
}

#[test]
fn a_rank_with_another_model_or_settings_is_refused_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    synthetic::write_tiny_model(&a, Arch::Llama, 1, None).unwrap();
    synthetic::write_tiny_model(&b, Arch::Llama, 2, None).unwrap();
    let out = check(&host_file(dir.path(), 2), &[(&a, "ctx=4096"), (&b, "ctx=8192")], 60);
    for (rank, o) in out.iter().enumerate() {
        let says = text(o);
        assert!(!o.status.success(), "rank {rank} went on: {says}");
        assert!(says.contains("do not match") && says.contains("on rank 1"), "rank {rank}: {says}");
        assert!(says.contains("model b (") && says.contains("\"ctx=8192\""), "rank {rank}: {says}");
    }
}

#[test]
fn bad_host_files_and_missing_peers_fail_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    synthetic::write_tiny_model(&model, Arch::Llama, 1, None).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"[["127.0.0.1:5000"], ["127.0.0.1"]]"#).unwrap();
    let o = check(&bad, &[(&model, "")], 60).remove(0);
    assert!(!o.status.success() && text(&o).contains("rank 1") && text(&o).contains("host:port"), "{}", text(&o));
    // Rank 1 never starts: rank 0 gives up at its timeout, saying so.
    let hosts = host_file(dir.path(), 2);
    let start = Instant::now();
    let o = check(&hosts, &[(&model, "")], 3).remove(0);
    assert!(!o.status.success() && text(&o).contains("has not formed"), "{}", text(&o));
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}

/// `fastmlx generate` of `model` with `args`: alone (`ranks` 1) or split across `ranks`
/// processes on loopback (with `split`: `--parallel tensor`), started in rank order; every
/// process's output.
fn generate(dir: &Path, model: &Path, args: &[&str], split: Parallel, ranks: usize) -> Vec<Output> {
    let start = |extra: Vec<String>| {
        Command::new(env!("CARGO_BIN_EXE_fastmlx"))
            .arg("generate")
            .arg("--model")
            .arg(model)
            .args(args)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    if ranks == 1 {
        return vec![start(Vec::new()).wait_with_output().unwrap()];
    }
    let hosts = host_file(dir, ranks);
    let children: Vec<_> = (0..ranks)
        .map(|rank| {
            let rank = rank.to_string();
            let mut extra = vec!["--cluster", hosts.to_str().unwrap(), "--rank", &rank, "--timeout", "60"];
            if split == Parallel::Tensor {
                extra.extend(["--parallel", "tensor"]);
            }
            let child = start(extra.iter().map(|s| s.to_string()).collect());
            std::thread::sleep(Duration::from_millis(500));
            child
        })
        .collect();
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Parallel {
    Pipeline,
    Tensor,
}

/// Rank 0's text equals one process's, every rank succeeds, and each says what it held.
fn assert_pipelined_like_alone(dir: &Path, model: &Path, args: &[&str], ranks: usize, what: &str) {
    let says = assert_split_like_alone(dir, model, args, Parallel::Pipeline, ranks, what);
    assert!(says.contains(&format!("Pipeline: {ranks} ranks")), "{says}");
}

/// Rank 0's text equals one process's and every rank succeeds; rank 0's report.
fn assert_split_like_alone(
    dir: &Path,
    model: &Path,
    args: &[&str],
    split: Parallel,
    ranks: usize,
    what: &str,
) -> String {
    let alone = generate(dir, model, args, split, 1).remove(0);
    assert!(alone.status.success(), "{what} alone: {}", text(&alone));
    let out = generate(dir, model, args, split, ranks);
    for (rank, o) in out.iter().enumerate() {
        assert!(o.status.success(), "{what}, rank {rank} of {ranks}: {}", text(o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("rank {rank} of {ranks}: ")), "{}", text(o));
    }
    assert_eq!(
        String::from_utf8_lossy(&out[0].stdout),
        String::from_utf8_lossy(&alone.stdout),
        "{what} across {ranks} ranks: {}",
        text(&out[0])
    );
    String::from_utf8_lossy(&out[0].stderr).into_owned()
}

#[test]
fn pipelined_generation_equals_one_process_for_every_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--prompt", "The sea is", "--max-tokens", "12", "--ignore-eos"];
    for arch in Arch::ALL {
        let model = dir.path().join(format!("{arch:?}"));
        synthetic::write_tiny_model(&model, arch, 3, None).unwrap();
        if arch == Arch::Gemma4 {
            // Its later layers read earlier layers' caches: refused by every rank, with the reason.
            for (rank, o) in generate(dir.path(), &model, &args, Parallel::Pipeline, 2).iter().enumerate() {
                let says = text(o);
                assert!(!o.status.success() && says.contains("cannot be split across machines"), "rank {rank}: {says}");
            }
            continue;
        }
        assert_pipelined_like_alone(dir.path(), &model, &args, 2, &format!("{arch:?}"));
    }
    // Three ranks, on the families with enough layers (a Mamba-2 hybrid, a Gated DeltaNet one).
    for arch in [Arch::NemotronH, Arch::Qwen35] {
        assert_pipelined_like_alone(dir.path(), &dir.path().join(format!("{arch:?}")), &args, 3, &format!("{arch:?}"));
    }
}

#[test]
fn smollm2_split_across_two_and_three_ranks_says_what_one_process_says() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::smollm2_gguf();
    let args = ["--prompt", "Write a short poem about the sea.", "--chat", "--max-tokens", "24"];
    for ranks in [2, 3] {
        assert_pipelined_like_alone(dir.path(), &model, &args, ranks, "SmolLM2");
    }
}

#[test]
fn a_worker_killed_mid_generation_ends_rank_0_with_an_error_not_a_hang() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let hosts = host_file(dir.path(), 2);
    let model = common::smollm2_gguf();
    let start = |rank: usize, stdout: Stdio| {
        Command::new(env!("CARGO_BIN_EXE_fastmlx"))
            .args(["generate", "--prompt", "Count to a thousand.", "--max-tokens", "2000", "--ignore-eos"])
            .arg("--model")
            .arg(&model)
            .arg("--cluster")
            .arg(&hosts)
            .args(["--rank", &rank.to_string(), "--timeout", "10"])
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut rank0 = start(0, Stdio::piped());
    std::thread::sleep(Duration::from_millis(500));
    let mut rank1 = start(1, Stdio::null());
    // Once rank 0 has written text, the generation is under way: the worker dies.
    let mut first = [0u8; 1];
    rank0.stdout.take().unwrap().read_exact(&mut first).unwrap();
    rank1.kill().unwrap();
    rank1.wait().unwrap();
    let killed = Instant::now();
    let out = rank0.wait_with_output().unwrap();
    let says = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "rank 0 went on without its worker: {says}");
    assert!(killed.elapsed() < Duration::from_secs(30), "rank 0 took {:?} to give up: {says}", killed.elapsed());
    assert!(!says.contains("Generation:"), "{says}");
    eprintln!("rank 0 after its worker was killed, {:?} later: {says}", killed.elapsed());
}

#[test]
fn tensor_parallel_generation_equals_one_process_for_the_families_it_splits() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--prompt", "The sea is", "--max-tokens", "12", "--ignore-eos"];
    let tensor = Parallel::Tensor;
    let split = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma3,
        Arch::SmolLm3,
        Arch::SeedOss,
        // Experts: each one's intermediate columns split, the router whole on every rank.
        Arch::Qwen3Moe,
        Arch::Qwen2Moe,
        Arch::Mixtral,
        Arch::GptOss,
    ];
    for arch in split {
        let model = dir.path().join(format!("{arch:?}"));
        synthetic::write_tiny_model(&model, arch, 3, None).unwrap();
        let says = assert_split_like_alone(dir.path(), &model, &args, tensor, 2, &format!("{arch:?} by tensors"));
        assert!(says.contains("1/2 of every layer's heads"), "{says}");
    }
    // The real model: 9 query and 3 key/value heads split in 3.
    assert_split_like_alone(dir.path(), &common::smollm2_gguf(), &args, tensor, 3, "SmolLM2 by tensors");
    // What this build does not split by tensors is refused by every rank, with the reason.
    let refused = [
        (Arch::Phi3, "fused"),
        (Arch::Lfm2, "other than attention"),
        (Arch::MiniMax, "span every head"),
        (Arch::DeepseekV3, "latent or recurrent"),
    ];
    for (arch, reason) in refused {
        let model = dir.path().join(format!("{arch:?}"));
        synthetic::write_tiny_model(&model, arch, 3, None).unwrap();
        for (rank, o) in generate(dir.path(), &model, &args, tensor, 2).iter().enumerate() {
            let says = text(o);
            assert!(!o.status.success() && says.contains("cannot be split by tensors"), "{arch:?} rank {rank}: {says}");
            assert!(says.contains(reason), "{arch:?} rank {rank}: {says}");
        }
    }
}
