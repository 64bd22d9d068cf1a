//! The cluster preflight (`fastmlx cluster check`) with 2 and 3 processes on this machine and
//! MLX's `ring` backend over loopback: the ranks agree, rank 0 measures the link; a rank with
//! another model or other settings is refused on every rank, naming the difference; a bad host
//! file or a rank whose peer never comes gives an error, never a hang.

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
        for peer in 1..size {
            assert!(links.contains(&format!("link 0 <-> {peer}: round trip")), "{links}");
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
    assert!(!o.status.success() && text(&o).contains("did not form"), "{}", text(&o));
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}
