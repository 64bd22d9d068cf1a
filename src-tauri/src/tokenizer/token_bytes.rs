//! The bytes each token stands for, for constrained decoding: a grammar is matched on bytes,
//! and a byte-level BPE token may hold half a UTF-8 character, so decoding ids one by one to
//! strings would not do.

use tokenizers::decoders::DecoderWrapper;

/// Every token's bytes, by id, in the form llguidance's token trie takes: a special token is
/// `marker` followed by its name (it never matches text, only a grammar naming it); an unused
/// id is empty. Non-special added tokens (Qwen's `<tool_call>`) are text.
pub(crate) fn token_bytes(tokenizer: &tokenizers::Tokenizer, marker: u8) -> Vec<Vec<u8>> {
    let kind = DecoderKind::of(tokenizer.get_decoder());
    let byte_level = byte_level_chars();
    let added = tokenizer.get_added_tokens_decoder();
    let size = tokenizer.get_vocab_size(true);
    (0..size as u32)
        .map(|id| {
            if let Some(token) = added.get(&id) {
                let text = token.content.as_bytes();
                return if token.special { [&[marker], text].concat() } else { text.to_vec() };
            }
            let Some(piece) = tokenizer.id_to_token(id) else { return Vec::new() };
            match kind {
                DecoderKind::ByteLevel => {
                    piece.chars().map(|c| byte_level.get(&c).copied()).collect::<Option<Vec<u8>>>().unwrap_or_default()
                }
                DecoderKind::SentencePiece => sentencepiece_bytes(&piece),
                DecoderKind::Other => tokenizer.decode(&[id], false).map(String::into_bytes).unwrap_or_default(),
            }
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DecoderKind {
    ByteLevel,
    /// `▁` for spaces and `<0xNN>` byte-fallback pieces.
    SentencePiece,
    Other,
}

impl DecoderKind {
    fn of(decoder: Option<&DecoderWrapper>) -> DecoderKind {
        match decoder {
            Some(DecoderWrapper::ByteLevel(_)) => DecoderKind::ByteLevel,
            Some(DecoderWrapper::Metaspace(_) | DecoderWrapper::ByteFallback(_)) => DecoderKind::SentencePiece,
            Some(DecoderWrapper::Sequence(seq)) => {
                let parts: Vec<DecoderKind> = seq.get_decoders().iter().map(|d| DecoderKind::of(Some(d))).collect();
                let replaces_spaces = seq.get_decoders().iter().any(|d| matches!(d, DecoderWrapper::Replace(_)));
                if parts.contains(&DecoderKind::ByteLevel) {
                    DecoderKind::ByteLevel
                } else if parts.contains(&DecoderKind::SentencePiece) || replaces_spaces {
                    DecoderKind::SentencePiece
                } else {
                    DecoderKind::Other
                }
            }
            _ => DecoderKind::Other,
        }
    }
}

fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        if let Ok(byte) = u8::from_str_radix(hex, 16) {
            return vec![byte];
        }
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's byte-level alphabet, reversed: printable bytes stand for themselves, the others for
/// the characters from U+0100 on, in byte order.
fn byte_level_chars() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).expect("valid code point");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_matches_gpt2() {
        let chars = byte_level_chars();
        assert_eq!(chars[&'\u{120}'], b' ', "Ġ is a space");
        assert_eq!(chars[&'\u{10a}'], b'\n', "Ċ is a newline");
        assert_eq!(chars[&'a'], b'a');
        assert_eq!(chars.len(), 256);
    }

    #[test]
    fn sentencepiece_pieces() {
        assert_eq!(sentencepiece_bytes("\u{2581}hello"), b" hello");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_bytes("<0xE2>"), [0xe2]);
    }
}
