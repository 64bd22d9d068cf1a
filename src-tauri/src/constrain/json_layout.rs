//! Bounds on the layout of generated JSON that a grammar does not express, which stop a weak
//! model from spending its whole token budget on padding: numbers of at most 16 digits before
//! and after the point and 2 in the exponent (more than an f64 holds), and whitespace only
//! where it leads somewhere: after `{`, `[`, `,` or `:`, or after a value where a closing
//! bracket may come (not before a `:` or a `,`). Tracked over the output's bytes beside the
//! grammar; strings are passed over. These only narrow what the grammar allows: where nothing
//! would be left (a number that must grow to reach its `minimum`), the grammar alone decides.

const MAX_DIGITS: u8 = 16;
const MAX_EXPONENT_DIGITS: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Part {
    #[default]
    None,
    Integer(u8),
    Fraction(u8),
    Exponent(u8),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLayout {
    in_string: bool,
    escaped: bool,
    part: Part,
    /// The last byte outside strings that is not whitespace (0 before the first).
    last: u8,
    /// Whitespace came after a value: a closing bracket must follow it.
    closing: bool,
}

/// Whether a bracket may close right after the output so far (asked only when needed).
pub type CloserAllowed<'a> = &'a mut dyn FnMut() -> bool;

impl JsonLayout {
    /// Whether `bytes` may follow (the state does not change).
    pub fn allows(&self, bytes: &[u8], closer_allowed: CloserAllowed) -> bool {
        let mut copy = *self;
        let mut closer = None;
        for (i, &b) in bytes.iter().enumerate() {
            if is_whitespace(b) && !copy.in_string && !matches!(copy.last, b'{' | b'[' | b',' | b':' | 0) {
                // Whitespace after a value: only where a bracket may close, which is known
                // for where the token starts (not after a value inside it).
                let at_start = bytes[..i].iter().copied().all(is_whitespace);
                if !at_start || !*closer.get_or_insert_with(&mut *closer_allowed) {
                    return false;
                }
            }
            if !copy.step(b) {
                return false;
            }
        }
        true
    }

    pub fn in_string(&self) -> bool {
        self.in_string
    }

    /// Whether only a closing bracket (or more whitespace) may come next, whatever the token.
    pub fn must_close(&self) -> bool {
        self.closing
    }

    /// Takes `bytes`.
    pub fn advance(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) -> bool {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => {
                    self.in_string = false;
                    self.last = b'"';
                }
                _ => {}
            }
            return true;
        }
        if is_whitespace(b) {
            self.part = Part::None;
            self.closing |= !matches!(self.last, b'{' | b'[' | b',' | b':' | 0);
            return true;
        }
        if std::mem::take(&mut self.closing) && !matches!(b, b'}' | b']') {
            return false;
        }
        self.last = b;
        let (part, ok) = match (self.part, b) {
            (_, b'"') => {
                self.in_string = true;
                (Part::None, true)
            }
            (Part::None, b'-') => (Part::Integer(0), true),
            (Part::None, b'0'..=b'9') => (Part::Integer(1), true),
            (Part::Integer(n), b'0'..=b'9') => (Part::Integer(n + 1), n < MAX_DIGITS),
            (Part::Integer(_), b'.') => (Part::Fraction(0), true),
            (Part::Fraction(n), b'0'..=b'9') => (Part::Fraction(n + 1), n < MAX_DIGITS),
            (Part::Integer(_) | Part::Fraction(_), b'e' | b'E') => (Part::Exponent(0), true),
            (Part::Exponent(0), b'+' | b'-') => (Part::Exponent(0), true),
            (Part::Exponent(n), b'0'..=b'9') => (Part::Exponent(n + 1), n < MAX_EXPONENT_DIGITS),
            _ => (Part::None, true),
        };
        self.part = part;
        ok
    }
}

pub fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `text`, token by token (one byte each), fits, with a bracket allowed to close
    /// after a value when `closing`.
    fn fits(text: &str, closing: bool) -> bool {
        let mut layout = JsonLayout::default();
        text.bytes().all(|b| {
            let ok = layout.allows(&[b], &mut || closing);
            layout.advance(&[b]);
            ok
        })
    }

    #[test]
    fn digits_before_and_after_the_point_and_in_the_exponent() {
        assert!(fits("1234567890123456", true) && fits("-0.1234567890123456e-12", true) && fits("[1e+99,2.5E3]", true));
        assert!(!fits("12345678901234567", true) && !fits("0.12345678901234567", true) && !fits("1e123", true));
    }

    #[test]
    fn strings_are_not_numbers_nor_layout() {
        assert!(fits(r#"{"id":"123456789012345678901234567890","e":"\"1234567890123456789 :"}"#, true));
        assert!(!fits(r#"{"id":"x\\","n":12345678901234567}"#, true), "an escaped backslash ends no string");
    }

    #[test]
    fn whitespace_where_it_leads_somewhere() {
        assert!(fits("{\n  \"a\": [1,\n 2]}", false));
        assert!(!fits("{\"a\" :1}", false), "not before a colon (no bracket closes after a key)");
        assert!(!fits("{\"a\":1 ,", true), "nor before a comma");
        assert!(fits("{\"a\":1\n}", true) && !fits("{\"a\":1\n}", false), "before a closing bracket if it may come");
    }

    #[test]
    fn a_token_is_judged_from_where_it_starts() {
        let after_value = JsonLayout { last: b'1', ..Default::default() };
        assert!(after_value.allows(b"\n}", &mut || true) && !after_value.allows(b"\n}", &mut || false));
        assert!(!after_value.allows(b"}\n", &mut || true), "whitespace after a value inside the token: unknown");
        assert!(JsonLayout { last: b',', ..Default::default() }.allows(b"\n  ", &mut || false));
    }
}
