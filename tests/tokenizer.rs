//! Tokenizer behaviour on the real SmolLM2 vocabulary (rebuilt from GGUF metadata): special
//! tokens on request, streaming detokenization that never emits broken characters.

mod common;

use fastmlx::model::{load_model, LoadedModel};
use fastmlx::tokenizer::StreamDecoder;

fn smollm2() -> LoadedModel {
    load_model(&common::smollm2_gguf(), &common::backend()).unwrap()
}

#[test]
fn special_tokens_are_parsed_only_when_asked() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let t = &model.tokenizer;
    let text = "<|im_start|>user\nhi<|im_end|>";
    let special = t.encode(text, false, true).unwrap();
    assert_eq!(special.first(), Some(&1), "<|im_start|> is id 1");
    assert_eq!(special.last(), Some(&2), "<|im_end|> is id 2");
    let literal = t.encode(text, false, false).unwrap();
    assert!(!literal.contains(&1) && !literal.contains(&2), "{literal:?}");
    assert_eq!(t.decode(&literal, false).unwrap(), text, "the literal encoding round-trips");
    assert!(t.is_eos(2) && !t.is_eos(1));
    assert!(t.is_special(1));
}

#[test]
fn streaming_decode_emits_whole_characters_and_loses_nothing() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let t = &model.tokenizer;
    for text in [
        "Grüße, 世界! Ünïcödé façade — naïve café.",
        "Family: 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵, skin 👋🏽 and a kiss 👩‍❤️‍💋‍👨 done.",
        "数学は楽しいです。日本語のテキストを分割します。",
        "  leading spaces,\ttabs\nand newlines\n\n",
        "def f(x):\n    return x ** 2  # 🐍",
    ] {
        let ids = t.encode(text, false, false).unwrap();
        let mut decoder = StreamDecoder::new(true);
        let mut pieces = Vec::new();
        for &id in &ids {
            if let Some(p) = decoder.push(t, id).unwrap() {
                pieces.push(p);
            }
        }
        if let Some(p) = decoder.flush(t).unwrap() {
            pieces.push(p);
        }
        assert_eq!(pieces.concat(), text, "streamed text differs");
        for p in &pieces {
            assert!(!p.contains('\u{FFFD}'), "broken character in piece {p:?} of {text:?}");
            assert!(!p.ends_with('\u{200D}'), "emoji sequence split after a joiner in {p:?}");
        }
        // Pieces come out as soon as they are stable: more than one for multi-token text.
        assert!(pieces.len() > 1 || ids.len() == 1, "{text:?} came out in one piece");
    }
}

#[test]
fn flush_releases_an_incomplete_character_at_the_very_end() {
    let _mlx = common::mlx_lock();
    let model = smollm2();
    let t = &model.tokenizer;
    let ids = t.encode("🐍", false, false).unwrap();
    assert!(ids.len() > 1, "the emoji takes several byte-level tokens: {ids:?}");
    let mut decoder = StreamDecoder::new(true);
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(decoder.push(t, id).unwrap(), None, "half a character is held back");
    }
    let flushed = decoder.flush(t).unwrap().unwrap();
    assert!(flushed.contains('\u{FFFD}'), "a cut-off character is shown as U+FFFD at the end: {flushed:?}");
}
