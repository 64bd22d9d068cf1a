//! The `fastmlx` binary end to end.

mod common;

use common::OutputWithin;

use std::process::Command;

fn fastmlx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fastmlx"))
}

#[test]
fn generate_streams_text_and_reports_speed_and_memory() {
    let out = fastmlx()
        .args(["generate", "--chat", "--prompt", "What is the capital of France?", "--max-tokens", "12"])
        .env("FASTMLX_MODEL", common::smollm2_gguf())
        .output_within();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Paris"), "stdout: {stdout}");
    assert!(stderr.contains("Prompt: ") && stderr.contains("tokens-per-sec"), "{stderr}");
    assert!(stderr.contains("Generation: ") && stderr.contains("Peak memory: "), "{stderr}");
}

#[test]
fn sampling_with_a_seed_is_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    assert!(fastmlx().args(["make-test-model", "--arch", "qwen3"]).arg(&model).output_within().status.success());
    let run = |seed: &str| {
        let out = fastmlx()
            .args([
                "generate",
                "--prompt",
                "abc",
                "--max-tokens",
                "16",
                "--temp",
                "0.9",
                "--seed",
                seed,
                "--ignore-eos",
                "-m",
            ])
            .arg(&model)
            .output_within();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    assert_eq!(run("1"), run("1"), "same seed, same text");
    assert_ne!(run("1"), run("2"), "another seed, other text");
}

#[test]
fn bad_input_is_a_clear_error_not_a_crash() {
    let out = fastmlx().args(["generate", "-m", "/no/such/model"]).output_within();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/no/such/model") && stderr.contains("not found"), "{stderr}");

    let out = fastmlx()
        .args(["generate", "--top-p", "0", "--prompt", "x"])
        .env("FASTMLX_MODEL", common::smollm2_gguf())
        .output_within();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));
}

/// Settings come from flags, then `FASTMLX_*` variables, then the config file.
#[test]
fn config_file_is_below_environment_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "model = \"/from/file\"\n").unwrap();
    let run = |env_model: Option<&str>, flag: Option<&str>| {
        let mut cmd = fastmlx();
        cmd.arg("generate").env("FASTMLX_CONFIG", &config).env_remove("FASTMLX_MODEL");
        if let Some(m) = env_model {
            cmd.env("FASTMLX_MODEL", m);
        }
        if let Some(m) = flag {
            cmd.args(["-m", m]);
        }
        String::from_utf8_lossy(&cmd.output_within().stderr).to_string()
    };
    assert!(run(None, None).contains("/from/file"));
    assert!(run(Some("/from/env"), None).contains("/from/env"));
    assert!(run(Some("/from/env"), Some("/from/flag")).contains("/from/flag"));
    std::fs::write(&config, "port = [1, {x = 2}]\n").unwrap();
    let out = fastmlx().arg("generate").env("FASTMLX_CONFIG", &config).output_within();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config file"));
}

/// `ls` finds models in the HF cache layout and FastMLX's folder; `rm` refuses what FastMLX
/// did not download unless forced.
#[test]
fn ls_and_rm_over_the_model_folders() {
    let dir = tempfile::tempdir().unwrap();
    let (own, hf) = (dir.path().join("own"), dir.path().join("hf"));
    let snapshot = hf.join("models--mlx-community--tiny/snapshots/r1");
    assert!(fastmlx().args(["make-test-model", "--arch", "qwen2"]).arg(&snapshot).output_within().status.success());
    assert!(fastmlx()
        .args(["make-test-model", "--arch", "llama"])
        .arg(own.join("mine"))
        .output_within()
        .status
        .success());
    let run = |args: &[&str]| {
        let out = fastmlx()
            .args(args)
            .env("FASTMLX_MODELS_DIR", &own)
            .env("HF_HUB_CACHE", &hf)
            .env("LMSTUDIO_MODELS_DIR", dir.path().join("none"))
            .output_within();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, text) = run(&["ls"]);
    assert!(ok, "{text}");
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert!(rows[0].starts_with("mine ") && rows[0].contains("llama") && rows[0].contains("fastmlx"), "{text}");
    assert!(
        rows[1].starts_with("mlx-community/tiny ") && rows[1].contains("qwen2") && rows[1].contains("hf-cache"),
        "{text}"
    );
    let (ok, text) = run(&["rm", "mlx-community/tiny"]);
    assert!(!ok && text.contains("not downloaded by FastMLX"), "{text}");
    assert!(snapshot.exists());
    let (ok, text) = run(&["rm", "mlx-community/tiny", "--force"]);
    assert!(ok, "{text}");
    assert!(!hf.join("models--mlx-community--tiny").exists());
}

#[test]
fn inspect_plans_the_context_a_model_serves_under_a_ceiling() {
    let out =
        fastmlx().args(["inspect", "--memory-limit", "1.1GB", "--json"]).arg(common::smollm2_gguf()).output_within();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plans = json["plans"].as_array().unwrap();
    let rows: Vec<u64> = plans.iter().map(|p| p["rows"].as_u64().unwrap()).collect();
    assert_eq!(rows, [1, 4, 8, 16]);
    // SmolLM2: 30 layers x keys and values x 3 heads x 64, in the compute dtype.
    let element = if fastmlx::mlx::gpu_available() { 2 } else { 4 };
    assert_eq!(plans[0]["kv_bytes_per_token"], 30 * 2 * 3 * 64 * element);
    assert_eq!(plans[0]["ceiling_bytes"], 1_100_000_000u64);
    let context: Vec<u64> = plans.iter().map(|p| p["context_tokens"].as_u64().unwrap()).collect();
    assert!(context.windows(2).all(|w| w[0] >= w[1]), "more requests, less context each: {context:?}");
    assert!(context[1] > 0 && context[1] < 8192, "1.1 GB is tight for four requests: {context:?}");
    // What four requests are granted is what the KV budget holds.
    let four = &plans[1];
    let granted = 4 * four["kv_bytes_per_token"].as_u64().unwrap() * context[1];
    assert!(granted <= four["kv_budget_bytes"].as_u64().unwrap(), "{four}");

    let text = fastmlx().args(["inspect", "--memory-limit", "1.1GB"]).arg(common::smollm2_gguf()).output_within();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("serves {} tokens of context to 4 requests at once", context[1])), "{text}");

    let missing = fastmlx().args(["inspect", "/no/such/model"]).output_within();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/no/such/model"));
}

/// A process started again in place (a rank of `serve --cluster` rejoining its cluster) closes
/// every descriptor the image before left open but did not pass on, first thing: a socket MLX
/// opened after that image marked its descriptors close-on-exec must not outlive it. The
/// listening socket it did pass on is the one it serves on.
#[cfg(unix)]
#[test]
fn a_process_started_again_in_place_closes_what_it_was_not_passed() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A leftover: a socket (one end of a pair), open in the child as descriptor 7 (not
    // close-on-exec). Both are copied above the numbers they go to first, so that neither
    // dup2 in the child overwrites the other's source.
    let (mut read, write) = std::os::unix::net::UnixStream::pair().unwrap();
    // SAFETY: copies of descriptors this test owns, closed below.
    let high = |fd: i32| unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
    let (leftover, passed) = (high(write.as_raw_fd()), high(listener.as_raw_fd()));
    assert!(leftover >= 100 && passed >= 100);
    let mut command = fastmlx();
    command
        .args(["serve", "--model", common::smollm2_gguf().to_str().unwrap(), "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .env("FASTMLX_CACHE_DIR", dir.path().join("cache"))
        .env("FASTMLX_MODELS_DIR", dir.path().join("models"))
        .env("FASTMLX_RESTARTED_AFTER", "a test")
        .env("FASTMLX_LISTEN_FDS", format!("127.0.0.1:{port}=8"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            for (from, to) in [(leftover, 7), (passed, 8)] {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    drop(write);
    // SAFETY: the copies made above, no longer needed.
    unsafe {
        libc::close(leftover);
        libc::close(passed);
    }
    // The socket reads to its end once the child has closed its copy, while the child runs on.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(read.read_to_end(&mut Vec::new()).is_ok()));
    let closed = rx.recv_timeout(Duration::from_secs(30));
    let running = child.try_wait().unwrap().is_none();
    assert!(closed == Ok(true) && running, "the leftover was not closed ({closed:?}, still running: {running})");
    // Its port is the passed socket (this test's copy still listens: a bind of its own would fail).
    let started = Instant::now();
    let answer = loop {
        let mut answer = String::new();
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            if stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_ok() {
                let _ = stream.read_to_string(&mut answer);
            }
        }
        if answer.starts_with("HTTP/1.") || started.elapsed() > Duration::from_secs(60) {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.") && answer.contains("200"), "{answer}");
}
