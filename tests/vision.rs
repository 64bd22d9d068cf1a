//! Images in (issue 36): FastMLX's decoding and Qwen-VL preprocessing against the reference's
//! (tests/data/reference/vision_preprocess.json, from scripts/reference/vision_preprocess.py:
//! Pillow 13's decoders and bicubic resize, mlx-vlm 0.7.6's Qwen3VLImageProcessor), to the byte: the
//! decoded pixels, the resized pixels (both of Pillow's pass orders) and the f32 pixel values, for a
//! screenshot, a tall image, one under the minimum size with an alpha channel and a GIF, each under
//! three checkpoints' settings; JPEGs (with and without chroma subsampling) decoded within 4 levels.
//! Gemma 3's and Gemma 4's preprocessing likewise (tests/data/reference/vision_gemma_preprocess.json).
//! Then each family's tower and generation on tiny random models against the references
//! (mlx-vlm 0.7.6's classes; for Gemma, with transformers' attention among an image's tokens).

mod common;

use base64::Engine as _;
use fastmlx::model::vision::qwen::{preprocess, QwenImageConfig};
use fastmlx::model::vision::resample::resize_bicubic;
use fastmlx::model::vision::{decode, MediaType};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn hex(bytes: impl AsRef<[u8]>) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn decoding_resizing_and_pixel_values_equal_the_reference_processor() {
    let reference = common::read_json("tests/data/reference/vision_preprocess.json");
    let configs = common::read_json("tests/data/vision/preprocessor_configs.json");
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 18);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["image"].as_str().unwrap();
        let config_name = case["config"].as_str().unwrap();
        let label = format!("{name} with {config_name}");
        let bytes = std::fs::read(common::root().join(format!("tests/data/vision/{name}"))).unwrap();
        let declared = match name.rsplit('.').next() {
            Some("png") => MediaType::Png,
            Some("jpg") => MediaType::Jpeg,
            Some("gif") => MediaType::Gif,
            other => panic!("{other:?}"),
        };
        let image = decode(&bytes, Some(declared)).unwrap();
        let size = [image.width as u64, image.height as u64];
        assert_eq!(serde_json::json!(size), case["size"], "{label}");
        // JPEG: zune-jpeg's decoder, not libjpeg-turbo's, whose last bits differ (IDCT, chroma
        // upsampling): measured here up to 4 levels on 29 % of a 4:2:0 photo's values (mean +0.18)
        // and up to 3 on 1 % of a 4:4:4 one's. Every other format to the byte.
        let exact = declared != MediaType::Jpeg;
        if exact && hex(&image.rgb) != case["decoded_sha256"] {
            failures.push(format!("{label}: decoded pixels differ from Pillow's"));
            continue;
        }
        if !exact {
            let crop =
                base64::engine::general_purpose::STANDARD.decode(case["decoded_crop"].as_str().unwrap()).unwrap();
            let ours: Vec<u8> =
                (0..32).flat_map(|y| image.rgb[y * image.width as usize * 3..][..32 * 3].to_vec()).collect();
            let worst = ours.iter().zip(&crop).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            let sum: i64 = image.rgb.iter().map(|&v| i64::from(v)).sum();
            let mean_shift = (sum - case["decoded_sum"].as_i64().unwrap()).abs() as f64 / image.rgb.len() as f64;
            assert!(
                worst <= 4 && mean_shift < 0.25,
                "{label}: JPEG decoded {worst} levels off at most, mean shift {mean_shift}"
            );
        }
        let config = QwenImageConfig::from_json(&configs[config_name], &Value::Null).unwrap();
        let (h, w) = config.smart_resize(image.height as usize, image.width as usize).unwrap();
        assert_eq!(serde_json::json!([w, h]), case["resized"], "{label}: the size resized to");
        let resized = resize_bicubic(&image.rgb, image.width as usize, image.height as usize, w, h);
        if exact && hex(&resized) != case["resized_sha256"] {
            failures.push(format!("{label}: resized pixels differ from Pillow's bicubic"));
            continue;
        }
        let pixels = preprocess(&image, &config).unwrap();
        assert_eq!(serde_json::json!(pixels.grid), case["grid"], "{label}");
        assert_eq!(serde_json::json!([pixels.values.len() / pixels.row_len, pixels.row_len]), case["shape"], "{label}");
        let le: Vec<u8> = pixels.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        if exact && hex(&le) != case["pixels_sha256"] {
            let first: Vec<f32> = pixels.values[..8].to_vec();
            let sum: f64 = pixels.values.iter().map(|v| f64::from(*v)).sum();
            failures.push(format!(
                "{label}: pixel values differ: first {first:?} vs {}, sum {sum} vs {}",
                case["first"], case["sum"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Qwen3-VL's vision tower on a tiny random model against mlx-vlm 0.7.6's own `VisionModel`
/// (tests/data/reference/vision_qwen3_vl.json, from scripts/reference/vision_qwen3_vl.py): two
/// images in one batch, each attending within itself; the merged features and the deepstack ones.
#[test]
fn the_qwen3_vl_vision_tower_equals_mlx_vlms() {
    use fastmlx::model::checkpoint::read_safetensors;
    use fastmlx::model::vision::qwen_tower::{QwenVisionConfig, QwenVisionTower};
    use fastmlx::model::weights::{QuantConfig, Weights};

    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/vision_qwen3_vl.json");
    let dir = common::root().join("tests/data/vision/tiny_qwen3_vl_vision");
    let config: QwenVisionConfig = serde_json::from_value(
        common::read_json("tests/data/vision/tiny_qwen3_vl_vision/config.json")["vision_config"].clone(),
    )
    .unwrap();
    let mut weights =
        Weights::new(read_safetensors(&dir).unwrap(), dir.clone(), QuantConfig::default(), mlx_rs::Dtype::Float32);
    let tower = QwenVisionTower::build(config, &mut weights, "vision_tower.").unwrap();
    let processor = QwenImageConfig { patch_size: 8, min_pixels: 65_536, max_pixels: 16_777_216, ..Default::default() };
    let (mut rows, mut grids, mut row_len) = (Vec::new(), Vec::new(), 0);
    for name in ["small.png", "banner.gif"] {
        let bytes = std::fs::read(common::root().join(format!("tests/data/vision/{name}"))).unwrap();
        let pixels = preprocess(&decode(&bytes, None).unwrap(), &processor).unwrap();
        rows.extend_from_slice(&pixels.values);
        grids.push(pixels.grid);
        row_len = pixels.row_len;
    }
    assert_eq!(serde_json::json!(grids), reference["grids"]);
    let pixels = mlx_rs::Array::from_slice(&rows, &[(rows.len() / row_len) as i32, row_len as i32]);
    let features = tower.forward(&pixels, &grids).unwrap();
    let check = |got: &mlx_rs::Array, want: &Value, what: &str| {
        let shape: Vec<i32> = got.shape().to_vec();
        assert_eq!(serde_json::json!(shape), want["shape"], "{what}");
        let values: Vec<f32> = got.as_slice::<f32>().to_vec();
        let width = shape[1] as usize;
        let close = |a: f64, b: f64, scale: f64| (a - b).abs() <= 1e-4 * scale.max(1.0);
        for (i, want_sum) in want["row_sums"].as_array().unwrap().iter().enumerate() {
            let sum: f64 = values[i * width..(i + 1) * width].iter().map(|&v| f64::from(v)).sum();
            let want_sum = want_sum.as_f64().unwrap();
            assert!(close(sum, want_sum, want_sum.abs()), "{what}: row {i} sums to {sum}, not {want_sum}");
        }
        for (i, w) in want["first"].as_array().unwrap().iter().enumerate() {
            let w = w.as_f64().unwrap();
            assert!(close(f64::from(values[i]), w, w.abs()), "{what}: value {i} is {}, not {w}", values[i]);
        }
        let abs: f64 = values.iter().map(|v| f64::from(v.abs())).sum();
        let want_abs = want["abs_sum"].as_f64().unwrap();
        assert!((abs - want_abs).abs() <= 1e-5 * want_abs, "{what}: |values| sum to {abs}, not {want_abs}");
    };
    features.merged.eval().unwrap();
    check(&features.merged, &reference["merged"], "merged");
    assert_eq!(features.deepstack.len(), 2);
    for (j, d) in features.deepstack.iter().enumerate() {
        d.eval().unwrap();
        check(d, &reference["deepstack"][j], &format!("deepstack {j}"));
    }
    // Hugging Face's layout keeps the patch kernel channels-first: the same tower.
    let mut tensors = read_safetensors(&dir).unwrap();
    let kernel = tensors.remove("vision_tower.patch_embed.proj.weight").unwrap();
    tensors.insert("vision_tower.patch_embed.proj.weight".into(), kernel.transpose_axes(&[0, 4, 1, 2, 3]).unwrap());
    let mut weights = Weights::new(tensors, dir.clone(), QuantConfig::default(), mlx_rs::Dtype::Float32);
    let hf = QwenVisionTower::build(tower.config.clone(), &mut weights, "vision_tower.").unwrap();
    let again = hf.forward(&pixels, &grids).unwrap().merged;
    assert!(again.all_close(&features.merged, 1e-6, 1e-6, None).unwrap(), "channels-first kernel");
}

/// Qwen3-VL's 3D positions for prompts with images equal mlx-vlm's `get_rope_index`
/// (tests/data/reference/vision_mrope.json): images first, last, two with text between.
#[test]
fn mrope_positions_equal_mlx_vlms() {
    use fastmlx::model::vision::mrope::mrope_positions;

    let reference = common::read_json("tests/data/reference/vision_mrope.json");
    let image_token = reference["image_token"].as_u64().unwrap() as u32;
    let merge = reference["merge"].as_u64().unwrap() as usize;
    for case in reference["cases"].as_array().unwrap() {
        let tokens: Vec<u32> = common::ids(&case["tokens"]);
        let grids: Vec<[usize; 3]> = serde_json::from_value(case["grids"].clone()).unwrap();
        let (positions, delta) = mrope_positions(&tokens, image_token, &grids, merge).unwrap();
        let by_axis: Vec<Vec<i32>> = (0..3).map(|a| positions.iter().map(|p| p[a]).collect()).collect();
        assert_eq!(serde_json::json!(by_axis), case["positions"], "{}", case["name"]);
        assert_eq!(i64::from(delta), case["delta"].as_i64().unwrap(), "{}", case["name"]);
    }
}

/// A case of tests/data/reference/vision_<family>_generate.json as a request: its prompt's
/// placeholders expanded by FastMLX's processor (checked equal to the reference's: Gemma 3's in the
/// rendered text, the others' in the tokens), its images prepared, greedy for the reference's
/// number of tokens.
fn reference_request(
    processor: &fastmlx::model::vision::ImageProcessor,
    case: &Value,
    images: &[fastmlx::model::vision::DecodedImage],
) -> fastmlx::engine::Request {
    let ids: Vec<u32> = match case.get("expanded_text") {
        Some(text) if !images.is_empty() => {
            let ours = processor.expand_text(case["prompt_text"].as_str().unwrap()).unwrap();
            assert_eq!(ours, text.as_str().unwrap(), "{}: expanded text", case["name"]);
            common::ids(&case["expanded_ids"])
        }
        _ => common::ids(&case["prompt_ids"]),
    };
    let (expanded, prepared) = processor.prepare(&ids, images).unwrap();
    assert_eq!(expanded, common::ids(&case["expanded_ids"]), "{}: expanded prompt", case["name"]);
    if let Some(grids) = case.get("grids") {
        let ours: Vec<[usize; 3]> = prepared.images.iter().map(|i| i.pixels.grid).collect();
        assert_eq!(&serde_json::json!(ours), grids, "{}", case["name"]);
    }
    if let Some(tokens) = case.get("tokens_per_image") {
        let ours: Vec<usize> = prepared.images.iter().map(|i| i.tokens).collect();
        assert_eq!(&serde_json::json!(ours), tokens, "{}", case["name"]);
    }
    let mut request = common::engine::request(&expanded, case["output_ids"].as_array().unwrap().len());
    request.images = (!prepared.images.is_empty()).then(|| std::sync::Arc::new(prepared));
    request
}

fn case_images(case: &Value) -> Vec<fastmlx::model::vision::DecodedImage> {
    case["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| {
            let path = common::root().join("tests/data/vision").join(name.as_str().unwrap());
            decode(&std::fs::read(path).unwrap(), None).unwrap()
        })
        .collect()
}

/// A tiny random Qwen3-VL (tests/data/vision/tiny_qwen3_vl, written by
/// scripts/reference/vision_qwen3_vl_generate.py with mlx-vlm 0.7.6's own classes) gives
/// mlx-vlm's greedy tokens for one image, two in one message, tall and wide ones, an image in the
/// second turn and text alone: each alone, all batched together, and prefilled in chunks that
/// cut through the images. The conversation's next turn hits the prefix cache past the image; the
/// same prompt with another picture of the same size does not reuse anything from its image on.
#[test]
fn qwen3_vl_gives_mlx_vlms_tokens_alone_batched_chunked_and_from_the_cache() {
    sees_as_mlx_vlm("qwen3_vl");
}

/// The same for Qwen3.5 (the hybrid: Gated DeltaNet layers and gated full attention with partial
/// M-RoPE; the same tower without deepstack), its cache hits resuming from snapshots.
#[test]
fn qwen3_5_gives_mlx_vlms_tokens_alone_batched_chunked_and_from_the_cache() {
    sees_as_mlx_vlm("qwen3_5");
}

/// The same for Qwen3-VL-MoE (routed experts in every layer but the first).
#[test]
fn qwen3_vl_moe_gives_mlx_vlms_tokens_alone_batched_chunked_and_from_the_cache() {
    sees_as_mlx_vlm("qwen3_vl_moe");
}

/// Hugging Face's layout of the same Qwen3-VL-MoE (`model.visual.*`, `model.language_model.*`, each
/// layer's experts fused as `experts.gate_up_proj` / `experts.down_proj`, inputs first, and the patch
/// kernel channels first) loads to the same model: mlx-vlm's tokens for one image.
#[test]
fn qwen3_vl_moe_in_hugging_faces_layout_gives_the_same_tokens() {
    use fastmlx::model::checkpoint::read_safetensors;
    use mlx_rs::ops::concatenate;

    let _mlx = common::mlx_lock();
    let reference = common::read_json("tests/data/reference/vision_qwen3_vl_moe_generate.json");
    let case = &reference["cases"][0];
    let source = common::root().join("tests/data/vision/tiny_qwen3_vl_moe");
    let dir = tempfile::tempdir().unwrap();
    for file in
        ["config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
    {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    let mlx = read_safetensors(&source).unwrap();
    let hf_name = |name: &str| {
        name.replace("language_model.model.", "model.language_model.")
            .replace("language_model.lm_head", "lm_head")
            .replace("vision_tower.", "model.visual.")
    };
    let inputs_first = |a: &mlx_rs::Array| a.transpose_axes(&[0, 2, 1]).unwrap();
    let mut hf = std::collections::HashMap::new();
    for (name, array) in &mlx {
        if let Some(rest) = name.strip_suffix(".switch_mlp.gate_proj.weight") {
            let up = &mlx[&format!("{rest}.switch_mlp.up_proj.weight")];
            let fused = concatenate(&[inputs_first(array), inputs_first(up)], -1).unwrap();
            hf.insert(hf_name(&format!("{rest}.experts.gate_up_proj")), fused);
        } else if let Some(rest) = name.strip_suffix(".switch_mlp.down_proj.weight") {
            hf.insert(hf_name(&format!("{rest}.experts.down_proj")), inputs_first(array));
        } else if name == "vision_tower.patch_embed.proj.weight" {
            hf.insert(hf_name(name), array.transpose_axes(&[0, 4, 1, 2, 3]).unwrap());
        } else if !name.ends_with(".switch_mlp.up_proj.weight") {
            hf.insert(hf_name(name), array.clone());
        }
    }
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    mlx_rs::Array::save_safetensors(hf, &metadata, dir.path().join("model.safetensors")).unwrap();

    let model = fastmlx::model::load_model(dir.path(), &fastmlx::mlx::Backend::init()).unwrap();
    let processor = model.vision.as_ref().expect("the tower under model.visual").processor.clone();
    drop(model);
    let request = reference_request(&processor, case, &case_images(case));
    let engine = common::engine::start(dir.path(), fastmlx::engine::EngineConfig::default());
    assert_eq!(common::collect(engine.submit(request).unwrap()).tokens, common::ids(&case["output_ids"]));
}

fn sees_as_mlx_vlm(family: &str) {
    use fastmlx::engine::EngineConfig;

    let _mlx = common::mlx_lock();
    let reference = common::read_json(&format!("tests/data/reference/vision_{family}_generate.json"));
    let dir = common::root().join(format!("tests/data/vision/tiny_{family}"));
    let cases = reference["cases"].as_array().unwrap();
    let model = fastmlx::model::load_model(&dir, &fastmlx::mlx::Backend::init()).unwrap();
    let processor = model.vision.as_ref().expect("the vision tower is loaded").processor.clone();
    drop(model);
    let requests: Vec<_> = cases.iter().map(|c| reference_request(&processor, c, &case_images(c))).collect();
    let want = |i: usize| common::ids(&cases[i]["output_ids"]);

    // Gemma's images are prefilled whole (their tokens see each other): chunks of 7, shorter
    // than an image, grow to hold it.
    let chunks: &[(usize, &str)] = if family.starts_with("gemma") {
        &[(2048, "whole"), (37, "in chunks of 37"), (7, "in chunks of 7")]
    } else {
        &[(2048, "whole"), (37, "in chunks of 37")]
    };
    for &(prefill_chunk, label) in chunks {
        let engine =
            common::engine::start(&dir, EngineConfig { prefill_chunk, prefix_cache_bytes: 0, ..Default::default() });
        // Alone.
        for (i, request) in requests.iter().enumerate() {
            let got = common::collect(engine.submit(request.clone()).unwrap());
            assert_eq!(got.tokens, want(i), "{label}, alone: {}", cases[i]["name"]);
        }
        // Together: rows join the batch as their prefills end and leave as they finish.
        let streams: Vec<_> = requests.iter().map(|r| engine.submit(r.clone()).unwrap()).collect();
        for (i, stream) in streams.into_iter().enumerate() {
            assert_eq!(common::collect(stream).tokens, want(i), "{label}, batched: {}", cases[i]["name"]);
        }
        common::engine::wait_idle(&engine);
    }

    // The prefix cache: the conversation's next turn (the answer and a new question after it) reuses
    // the image; another picture of the same size does not.
    let engine = common::engine::start(&dir, EngineConfig { prefix_cache_bytes: 64 << 20, ..Default::default() });
    let one = &requests[0];
    let cold = common::collect(engine.submit(one.clone()).unwrap());
    assert_eq!(cold.tokens, want(0));
    let mut next_turn = one.clone();
    next_turn.prompt_ids.extend(&cold.tokens);
    next_turn.prompt_ids.extend(b"\nAnd now?\n".map(u32::from));
    let warm = common::collect(engine.submit(next_turn).unwrap());
    let image = &one.images.as_ref().unwrap().images[0];
    assert!(
        warm.finish.usage.cached_tokens > image.start + image.tokens,
        "the next turn reuses the image: {} cached",
        warm.finish.usage.cached_tokens
    );
    let mut other = case_images(&cases[0]);
    other[0].rgb.iter_mut().for_each(|v| *v = 255 - *v);
    other[0].hash[0] ^= 1;
    let edited = reference_request(&processor, &cases[0], &other);
    let edited = common::collect(engine.submit(edited).unwrap());
    assert!(
        edited.finish.usage.cached_tokens <= image.start,
        "another picture of the same size reuses only the text before it: {} cached, the image starts at {}",
        edited.finish.usage.cached_tokens,
        image.start
    );
    let metrics = common::engine::wait_idle(&engine);
    assert_eq!(metrics.images_encoded_total, 2, "the repeated image is not encoded twice");
}

/// Gemma 3 (SigLIP tower, images expanded in the text, each image's tokens seeing each other on
/// every layer as in transformers) gives transformers' greedy tokens: the reference is mlx-vlm
/// 0.7.6's own model with transformers' masks (scripts/reference/vision_gemma_generate.py), where
/// mlx-vlm alone attends causally and answers differently.
#[test]
fn gemma3_gives_the_references_tokens_alone_batched_chunked_and_from_the_cache() {
    sees_as_mlx_vlm("gemma3");
    gemma_images_across_blocks("gemma3");
}

/// Gemma 4 (its own tower with 2D rotary positions and pooling, per-layer inputs reading image
/// tokens as padding, image tokens seeing each other on the sliding layers only, as transformers).
#[test]
fn gemma4_gives_the_references_tokens_alone_batched_chunked_and_from_the_cache() {
    sees_as_mlx_vlm("gemma4");
    gemma_images_across_blocks("gemma4");
}

/// The reference's cases tell transformers' attention from mlx-vlm's: following mlx-vlm would
/// fail them. Then a prompt whose image straddles a prefix-cache block (stored while the prompt
/// is prefilled): in chunks of 7 it answers as prefilled whole, and again from the cache.
fn gemma_images_across_blocks(family: &str) {
    use fastmlx::engine::EngineConfig;

    let _mlx = common::mlx_lock();
    let reference = common::read_json(&format!("tests/data/reference/vision_{family}_generate.json"));
    let cases = reference["cases"].as_array().unwrap();
    assert!(
        cases.iter().any(|c| c["output_ids"] != c["output_ids_mlx_vlm"]),
        "the tiny model must answer differently under mlx-vlm's causal masks"
    );
    let dir = common::root().join(format!("tests/data/vision/tiny_{family}"));
    let model = fastmlx::model::load_model(&dir, &fastmlx::mlx::Backend::init()).unwrap();
    let processor = model.vision.as_ref().expect("the vision tower is loaded").processor.clone();
    drop(model);
    let case = &cases[0];
    let request = reference_request(&processor, case, &case_images(case));
    let image = request.images.as_ref().unwrap().images[0].clone();
    // Text before the image so that it straddles the 64-token block the cache keeps.
    let pad = 64 - image.start - image.tokens / 2;
    let mut ids: Vec<u32> = request.prompt_ids[..1].to_vec();
    ids.extend(std::iter::repeat_n(u32::from(b'x'), pad));
    ids.extend(&request.prompt_ids[1..]);
    let mut padded = request.clone();
    let mut images = (**request.images.as_ref().unwrap()).clone();
    images.images[0].start += pad;
    let start = images.images[0].start;
    images.key_ids = ids.clone();
    for j in 0..image.tokens {
        images.key_ids[start + j] = request.images.as_ref().unwrap().key_ids[image.start + j];
    }
    assert!(start < 64 && start + image.tokens > 64, "the image straddles the block");
    padded.prompt_ids = ids;
    padded.images = Some(std::sync::Arc::new(images));

    let whole = common::engine::start(&dir, EngineConfig { prefix_cache_bytes: 0, ..Default::default() });
    let want = common::collect(whole.submit(padded.clone()).unwrap()).tokens;
    common::engine::wait_idle(&whole);
    drop(whole);
    let engine = common::engine::start(
        &dir,
        EngineConfig { prefill_chunk: 7, prefix_cache_bytes: 64 << 20, ..Default::default() },
    );
    let cold = common::collect(engine.submit(padded.clone()).unwrap());
    assert_eq!(cold.tokens, want, "in chunks of 7");
    let warm = common::collect(engine.submit(padded).unwrap());
    assert!(warm.finish.usage.cached_tokens > start + image.tokens, "the image from the cache");
    assert_eq!(warm.tokens, cold.tokens);
    common::engine::wait_idle(&engine);
}

/// Gemma 3's SigLIP tower with its projector, and Gemma 4's tower with its embedder, on their
/// tiny random models: each image's features as the language model takes them, against mlx-vlm's
/// own modules (the `tower` of tests/data/reference/vision_gemma*_generate.json), within 1e-4.
#[test]
fn the_gemma_vision_towers_equal_the_references() {
    let _mlx = common::mlx_lock();
    for family in ["gemma3", "gemma4"] {
        let reference = common::read_json(&format!("tests/data/reference/vision_{family}_generate.json"));
        let dir = common::root().join(format!("tests/data/vision/tiny_{family}"));
        let model = fastmlx::model::load_model(&dir, &fastmlx::mlx::Backend::init()).unwrap();
        let vision = model.vision.as_ref().expect("the vision tower is loaded");
        for name in ["small.png", "banner.gif"] {
            let bytes = std::fs::read(common::root().join(format!("tests/data/vision/{name}"))).unwrap();
            let image = decode(&bytes, None).unwrap();
            // One placeholder; Gemma 3's prompt carries its image's tokens already.
            let ids = match &vision.processor.family {
                fastmlx::model::vision::Family::Gemma3 { image } => vec![vision.processor.image_token; image.tokens],
                _ => vec![vision.processor.image_token],
            };
            let (_, prepared) = vision.processor.prepare(&ids, std::slice::from_ref(&image)).unwrap();
            let features = vision.encode(&[&prepared.images[0].pixels]).unwrap().remove(0).merged;
            features.eval().unwrap();
            let want = &reference["tower"][name];
            let what = format!("{family} {name}");
            let shape: Vec<i32> = features.shape().to_vec();
            assert_eq!(serde_json::json!(shape), want["shape"], "{what}");
            let values: Vec<f32> = features.as_slice::<f32>().to_vec();
            let width = shape[1] as usize;
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
            for (i, w) in want["row_sums"].as_array().unwrap().iter().enumerate() {
                let sum: f64 = values[i * width..(i + 1) * width].iter().map(|&v| f64::from(v)).sum();
                assert!(close(sum, w.as_f64().unwrap()), "{what}: row {i} sums to {sum}, not {w}");
            }
            for (i, w) in want["first"].as_array().unwrap().iter().enumerate() {
                assert!(
                    close(f64::from(values[i]), w.as_f64().unwrap()),
                    "{what}: value {i} is {}, not {w}",
                    values[i]
                );
            }
            let abs: f64 = values.iter().map(|v| f64::from(v.abs())).sum();
            let want_abs = want["abs_sum"].as_f64().unwrap();
            assert!((abs - want_abs).abs() <= 1e-5 * want_abs, "{what}: |values| sum to {abs}, not {want_abs}");
        }
    }
}

/// Gemma 3's and Gemma 4's preprocessing against the references'
/// (tests/data/reference/vision_gemma_preprocess.json, from
/// scripts/reference/vision_gemma_preprocess.py): the size resized to, the resized pixels (Pillow's
/// bilinear and bicubic) and the pixel values to the byte for PNG and GIF (JPEG: sizes and token
/// counts), each image under Gemma 3's settings and Gemma 4's at 70, 280 and 1,120 tokens. Gemma 4's
/// values are transformers' (its f64 rescale; mlx-vlm's f32 product is one bit off for half the
/// byte values, and the reference records both).
#[test]
fn gemma_preprocessing_equals_the_reference_processors() {
    use fastmlx::model::vision::gemma::{Gemma3ImageConfig, Gemma4ImageConfig};
    use fastmlx::model::vision::resample::{resize, Filter};

    let reference = common::read_json("tests/data/reference/vision_gemma_preprocess.json");
    let configs = &reference["configs"];
    let outer = serde_json::json!({"vision_config": {"image_size": 896, "patch_size": 14}, "mm_tokens_per_image": 256});
    let gemma3 = Gemma3ImageConfig::from_json(&outer, &configs["gemma3"], &Value::Null).unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for case in reference["cases"].as_array().unwrap() {
        let config = case["config"].as_str().unwrap();
        // transformers' own Gemma 3 processor composites an alpha channel onto white, with a flag
        // the published config leaves off (then it refuses the image); mlx-vlm's pipeline, as
        // FastMLX, drops the alpha.
        if config == "gemma3_transformers_rgba" {
            continue;
        }
        let name = case["image"].as_str().unwrap();
        let label = format!("{name} with {config}");
        let bytes = std::fs::read(common::root().join(format!("tests/data/vision/{name}"))).unwrap();
        let image = decode(&bytes, None).unwrap();
        let exact = !name.ends_with(".jpg");
        let (w, h, pixels, want_pixels) = if config == "gemma3" {
            let pixels = gemma3.preprocess(&image);
            (896, 896, pixels, &case["pixels_sha256"])
        } else {
            let mut raw = configs["gemma4"].clone();
            raw["max_soft_tokens"] = case["max_soft_tokens"].clone();
            let c = Gemma4ImageConfig::from_json(&Value::Null, &serde_json::json!({ "image_processor": raw })).unwrap();
            let (h, w) = c.target_size(image.height as usize, image.width as usize).unwrap();
            assert_eq!(
                serde_json::json!(c.image_tokens(image.height as usize, image.width as usize).unwrap()),
                case["tokens"],
                "{label}"
            );
            (w, h, c.preprocess(&image).unwrap(), &case["pixels_sha256_transformers"])
        };
        assert_eq!(serde_json::json!([w, h]), case["resized"], "{label}: the size resized to");
        if !exact {
            continue;
        }
        let filter = if config == "gemma3" { Filter::Bilinear } else { Filter::Bicubic };
        let resized = resize(&image.rgb, image.width as usize, image.height as usize, w, h, filter);
        if hex(&resized) != case["resized_sha256"] {
            failures.push(format!("{label}: resized pixels differ from Pillow's"));
            continue;
        }
        // The reference's values are channels first: undo the patches.
        let p = (pixels.row_len / 3).isqrt();
        let (gh, gw) = (pixels.grid[1], pixels.grid[2]);
        let mut planar = vec![0f32; 3 * h * w];
        for (k, patch) in pixels.values.chunks_exact(pixels.row_len).enumerate() {
            let (py, px) = (k / gw, k % gw);
            for (i, v) in patch.iter().enumerate() {
                let (y, x, c) = (py * p + i / (3 * p), px * p + (i / 3) % p, i % 3);
                planar[c * h * w + y * w + x] = *v;
            }
        }
        assert_eq!(gh * p, h, "{label}");
        let le: Vec<u8> = planar.iter().flat_map(|v| v.to_le_bytes()).collect();
        if hex(&le) != *want_pixels {
            failures.push(format!("{label}: pixel values differ: first {:?} vs {}", &planar[..4], case["first"]));
        }
        checked += 1;
    }
    assert!(checked >= 16, "{checked} cases compared to the byte");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The published Gemma configs (tests/data/configs) read as the references read them: Gemma 3's
/// 256 tokens seeing each other on every layer; Gemma 4's placeholders and token counts, its
/// image tokens seeing each other on the sliding layers of the 26B-A4B and 31B only; their towers'
/// shapes.
#[test]
fn the_published_gemma_configs_give_their_processors_and_towers() {
    use fastmlx::model::vision::gemma4_tower::Gemma4VisionConfig;
    use fastmlx::model::vision::siglip::SiglipConfig;
    use fastmlx::model::vision::{Family, ImageAttention, ImageProcessor};

    let config = |name: &str| common::read_json(&format!("tests/data/configs/{name}.json"));
    let gemma3 = config("gemma-3-4b-it");
    let pre = serde_json::json!({"size": {"height": 896, "width": 896}, "resample": 2, "image_mean": [0.5, 0.5, 0.5],
                                 "image_std": [0.5, 0.5, 0.5], "rescale_factor": 0.00392156862745098});
    let p = ImageProcessor::from_json(&gemma3, &pre, &Value::Null).unwrap();
    assert_eq!((p.image_token, p.attention), (262_144, ImageAttention { full: true, sliding: true }));
    assert!(matches!(p.family, Family::Gemma3 { ref image } if image.tokens == 256 && image.size == 896));
    let siglip: SiglipConfig = serde_json::from_value(gemma3["vision_config"].clone()).unwrap();
    assert_eq!((siglip.num_hidden_layers, siglip.layer_norm_eps), (27, 1e-6));

    let processor = serde_json::json!({"image_processor": {"patch_size": 16, "pooling_kernel_size": 3,
        "max_soft_tokens": 280, "rescale_factor": 0.00392156862745098, "do_normalize": false, "resample": 3}});
    for (name, bidirectional, standardize) in
        [("gemma-4-e2b", false, false), ("gemma-4-31b-it", true, true), ("gemma-4-26b-a4b-it-mlx-4bit", true, true)]
    {
        let c = config(name);
        let p = ImageProcessor::from_json(&c, &Value::Null, &processor).unwrap();
        assert_eq!(p.image_token, 258_880, "{name}");
        assert_eq!(p.attention, ImageAttention { full: false, sliding: bidirectional }, "{name}");
        assert!(matches!(p.family, Family::Gemma4 { boi: 255_999, eoi: 258_882, .. }), "{name}");
        assert_eq!(p.image_tokens(800, 1280).unwrap(), 13 * 21 + 2, "{name}: a screenshot");
        let tower: Gemma4VisionConfig = serde_json::from_value(c["vision_config"].clone()).unwrap();
        assert_eq!(tower.standardize, standardize, "{name}");
    }
}

/// Two Gemma 3 prompts prefilled together in chunks of 7 whose images interlock: no common chunk
/// length ends outside both images (the shorter prompt ends inside the other's image), so one
/// waits while the other holds its image whole. Each answers as it does alone, prefilled whole.
#[test]
fn interlocking_images_prefill_apart_and_answer_as_alone() {
    use fastmlx::engine::EngineConfig;

    let _mlx = common::mlx_lock();
    let dir = common::root().join("tests/data/vision/tiny_gemma3");
    let model = fastmlx::model::load_model(&dir, &fastmlx::mlx::Backend::init()).unwrap();
    let processor = model.vision.as_ref().unwrap().processor.clone();
    drop(model);
    let image = decode(&std::fs::read(common::root().join("tests/data/vision/small.png")).unwrap(), None).unwrap();
    // <bos>, `before` bytes of text, <start_of_image>, 16 soft tokens, <end_of_image>, `after` bytes.
    let prompt = |before: usize, after: usize| {
        let mut ids = vec![257];
        ids.extend((0..before).map(|i| u32::from(b'a') + (i % 26) as u32));
        ids.push(260);
        ids.extend([processor.image_token; 16]);
        ids.push(261);
        ids.extend((0..after).map(|i| u32::from(b'A') + (i % 26) as u32));
        let (ids, images) = processor.prepare(&ids, std::slice::from_ref(&image)).unwrap();
        let mut request = common::engine::request(&ids, 6);
        request.images = Some(std::sync::Arc::new(images));
        request
    };
    // A: image at 6..22, 30 tokens; B: image at 21..37, 60 tokens.
    let (a, b) = (prompt(4, 7), prompt(19, 22));
    let whole = common::engine::start(&dir, EngineConfig { prefix_cache_bytes: 0, ..Default::default() });
    let want: Vec<Vec<u32>> =
        [&a, &b].iter().map(|r| common::collect(whole.submit((*r).clone()).unwrap()).tokens).collect();
    common::engine::wait_idle(&whole);
    drop(whole);
    let engine =
        common::engine::start(&dir, EngineConfig { prefill_chunk: 14, prefix_cache_bytes: 0, ..Default::default() });
    let streams = [engine.submit(a).unwrap(), engine.submit(b).unwrap()];
    for (i, stream) in streams.into_iter().enumerate() {
        assert_eq!(common::collect(stream).tokens, want[i], "request {i}");
    }
    common::engine::wait_idle(&engine);
}
