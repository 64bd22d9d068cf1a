//! Broken or unsupported models give clear errors naming the file and the problem; nothing
//! panics or aborts the process.

mod common;

use std::fs;
use std::path::Path;

use fastmlx::fixtures::synthetic;
use fastmlx::model::config::QuantSpec;
use fastmlx::model::{load_model, Arch, ModelError};

fn tiny_dir(quant: Option<QuantSpec>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_tiny_model(dir.path(), Arch::Llama, 0, quant).unwrap();
    dir
}

fn load_err(path: &Path) -> String {
    match load_model(path, &common::backend()) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_path_and_missing_files() {
    let _mlx = common::mlx_lock();
    let err = load_err(Path::new("/nonexistent/model"));
    assert!(err.contains("/nonexistent/model") && err.contains("not found"), "{err}");

    let dir = tiny_dir(None);
    fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("tokenizer.json") && err.contains("not found"), "{err}");

    let dir = tiny_dir(None);
    fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("safetensors") && err.contains("not found"), "{err}");

    let dir = tiny_dir(None);
    fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(load_err(dir.path()).contains("config.json"));
}

#[test]
fn unknown_model_type_and_bad_config() {
    let _mlx = common::mlx_lock();
    let dir = tiny_dir(None);
    common::edit_config(dir.path(), |c| c["model_type"] = "gpt_bigcode".into());
    let err = load_err(dir.path());
    assert!(err.contains("config.json") && err.contains("gpt_bigcode") && err.contains("unsupported"), "{err}");
    // The message lists what does load, every family of this build.
    assert!(err.contains("nemotron_h") && err.contains("deepseek_v3") && err.contains("llama"), "{err}");

    let dir = tiny_dir(None);
    fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert!(load_err(dir.path()).contains("invalid JSON"));

    let dir = tiny_dir(None);
    common::edit_config(dir.path(), |c| c["num_key_value_heads"] = 3.into());
    let err = load_err(dir.path());
    assert!(err.contains("num_key_value_heads"), "{err}");

    let dir = tiny_dir(None);
    common::edit_config(dir.path(), |c| c["rope_scaling"] = serde_json::json!({"rope_type": "mystery", "factor": 2.0}));
    assert!(load_err(dir.path()).contains("mystery"));
}

#[test]
fn shape_mismatch_names_the_tensor() {
    let _mlx = common::mlx_lock();
    let dir = tiny_dir(None);
    common::edit_config(dir.path(), |c| c["intermediate_size"] = 512.into());
    let err = load_err(dir.path());
    assert!(err.contains("model.layers.0.mlp.gate_proj.weight") && err.contains("shape"), "{err}");

    let dir = tiny_dir(None);
    common::edit_config(dir.path(), |c| c["num_hidden_layers"] = 3.into());
    let err = load_err(dir.path());
    assert!(err.contains("model.layers.2") && err.contains("missing"), "{err}");
}

#[test]
fn truncated_and_corrupt_safetensors() {
    let _mlx = common::mlx_lock();
    let dir = tiny_dir(None);
    let file = dir.path().join("model.safetensors");
    let bytes = fs::read(&file).unwrap();
    fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model.safetensors") && err.contains("truncated"), "{err}");

    fs::write(&file, b"\xff\xff\xff\xff\xff\xff\xff\x00garbage").unwrap();
    let err = load_err(dir.path());
    assert!(err.contains("model.safetensors") && err.contains("corrupt"), "{err}");

    fs::write(&file, b"").unwrap();
    assert!(load_err(dir.path()).contains("model.safetensors"));
}

#[test]
fn unsupported_quantization() {
    let _mlx = common::mlx_lock();
    let dir = tiny_dir(Some(QuantSpec::affine(64, 4)));
    common::edit_config(dir.path(), |c| c["quantization"]["mode"] = "fp3".into());
    let err = load_err(dir.path());
    assert!(err.contains("fp3") && err.contains("quantization") && err.contains("mxfp4"), "{err}");

    let dir = tiny_dir(Some(QuantSpec::affine(64, 4)));
    common::edit_config(dir.path(), |c| {
        c.as_object_mut().unwrap().remove("quantization");
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    let err = load_err(dir.path());
    assert!(err.contains("no \"quantization\""), "{err}");

    // A module said to be mxfp4 whose tensors are affine (float scales, biases): named, not garbage.
    let dir = tiny_dir(Some(QuantSpec::affine(64, 4)));
    common::edit_config(dir.path(), |c| {
        c["quantization"]["lm_head"] = serde_json::json!({"group_size": 32, "bits": 4, "mode": "mxfp4"});
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    let err = load_err(dir.path());
    assert!(err.contains("lm_head") && err.contains("Mxfp4"), "{err}");

    // A module said to be 8-bit whose tensors are packed 4-bit: a shape error.
    let dir = tiny_dir(Some(QuantSpec::affine(64, 4)));
    common::edit_config(dir.path(), |c| {
        c["quantization"]["lm_head"] = serde_json::json!({"group_size": 64, "bits": 8});
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    let err = load_err(dir.path());
    assert!(err.contains("shape") && err.contains("lm_head"), "{err}");
}

#[test]
fn truncated_and_foreign_gguf() {
    let _mlx = common::mlx_lock();
    let dir = tempfile::tempdir().unwrap();
    let gguf = fs::read(common::smollm2_gguf()).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    fs::write(&truncated, &gguf[..gguf.len() / 3]).unwrap();
    let err = load_err(&truncated);
    assert!(err.contains("truncated.gguf"), "{err}");

    let almost = dir.path().join("almost.gguf");
    fs::write(&almost, &gguf[..gguf.len() - 1000]).unwrap();
    let err = load_err(&almost);
    assert!(err.contains("almost.gguf") && err.contains("past the end"), "{err}");

    let header_only = dir.path().join("header.gguf");
    fs::write(&header_only, &gguf[..64]).unwrap();
    assert!(load_err(&header_only).contains("header.gguf"));

    let not_gguf = dir.path().join("fake.gguf");
    fs::write(&not_gguf, b"PK\x03\x04 a zip, not a gguf").unwrap();
    let err = load_err(&not_gguf);
    assert!(err.contains("fake.gguf") && err.contains("not a GGUF"), "{err}");

    let other = dir.path().join("weights.bin");
    fs::write(&other, b"x").unwrap();
    assert!(load_err(&other).contains("not a model"));
}

#[test]
fn errors_are_typed() {
    let _mlx = common::mlx_lock();
    assert!(matches!(load_model(Path::new("/nope"), &common::backend()), Err(ModelError::NotFound { .. })));
}
