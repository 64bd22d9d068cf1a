//! Stop strings matched across token boundaries. Text that might be the start of a stop string
//! is held back until it is known not to be; a matched stop string is never emitted.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopMatch {
    /// Text safe to emit now (possibly empty: the rest is held back).
    Continue(String),
    /// A stop string matched: emit this text, then finish.
    Stopped { text: String, stop: String },
}

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopMatch {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return StopMatch::Continue(std::mem::take(&mut self.pending));
        }
        // The earliest match wins; on a tie at one position, the longest stop string.
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|i| (i, s)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())));
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            let text = self.pending[..at].to_string();
            self.pending.clear();
            return StopMatch::Stopped { text, stop };
        }
        let hold = self.held_back_len();
        let emit_to = self.pending.len() - hold;
        let text = self.pending[..emit_to].to_string();
        self.pending.drain(..emit_to);
        StopMatch::Continue(text)
    }

    /// The text held back when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of `pending` that is a proper prefix of a stop string.
    fn held_back_len(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let suffix = &self.pending[i..];
                if suffix.len() <= best {
                    break;
                }
                if stop.starts_with(suffix) {
                    best = suffix.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopMatch::Continue(t) => out.push_str(&t),
                StopMatch::Stopped { text, stop } => {
                    out.push_str(&text);
                    return (out, Some(stop));
                }
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stop_split_across_tokens_is_found_and_not_emitted() {
        assert_eq!(feed(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), Some("END".into())));
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        assert_eq!(feed(&["END"], &["an E", "N", "d"]), ("an ENd".into(), None));
    }

    #[test]
    fn text_is_emitted_as_soon_as_it_cannot_start_a_stop() {
        let mut m = StopMatcher::new(vec!["###".into()]);
        assert_eq!(m.push("abc #"), StopMatch::Continue("abc ".into()));
        assert_eq!(m.push("x"), StopMatch::Continue("#x".into()));
    }

    #[test]
    fn earliest_of_several_stops_and_multibyte_text() {
        assert_eq!(feed(&["世界", "b"], &["a", "世", "界b"]), ("a".into(), Some("世界".into())));
    }
}
