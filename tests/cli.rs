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
