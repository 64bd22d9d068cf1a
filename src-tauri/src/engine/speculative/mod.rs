//! Speculative decoding: a running row may carry a few drafted tokens, which one forward pass
//! of the batch checks together with its next input (`scheduler::verify`). Drafts come from
//! prompt lookup (`ngram`), from a small draft model with the same tokenizer (`draft`), or from
//! the checkpoint's own multi-token-prediction head (`mtp`), each row's length following its
//! acceptance ([`RowDrafter`]).
//!
//! Why the output is unchanged: every proposal is a fixed token (no distribution of its own),
//! so the standard acceptance rule (accept draft `d` with probability `p(d)`, else sample from
//! `p` with `d` removed) is the same as sampling the target's token from `p` as usual and
//! keeping the draft when they agree. The verify step does exactly that, position by position,
//! with the row's own sampler, penalties, grammar and stops, so what is sampled, with what
//! random draws in what order, is what plain decoding samples: greedy and seeded output are
//! identical with drafting on or off.
//!
//! Whether it pays: [`Payoff`] compares the tokens a row gets per second from verify steps
//! with plain steps of the same batch size, measured as they run, and stops drafting (and
//! tries again later) where verifying costs more than it gains: at high concurrency a step is
//! bound by compute, not by reading the weights, and drafting backs off by itself.

mod draft;
mod mtp;
mod ngram;

pub use draft::{check_vocabularies, DraftModel, Want, CATCH_UP};
pub use mtp::MtpDrafter;
pub use ngram::PromptLookup;

use std::time::Duration;

/// How the engine drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Never.
    Off,
    /// The draft model when one is loaded, else the model's MTP head where it ships one, else
    /// prompt lookup, while it pays.
    #[default]
    Auto,
    /// Prompt lookup on every step that has a proposal, whether it pays or not (to measure).
    Ngram,
    /// The draft model on every step, whether it pays or not (a draft model must be given).
    Draft,
    /// The model's multi-token-prediction head on every step, whether it pays or not (the
    /// checkpoint must ship one).
    Mtp,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "false" => Ok(Mode::Off),
            "auto" | "on" | "true" => Ok(Mode::Auto),
            "ngram" | "prompt-lookup" | "prompt_lookup" => Ok(Mode::Ngram),
            "draft" | "draft-model" | "draft_model" => Ok(Mode::Draft),
            "mtp" => Ok(Mode::Mtp),
            other => Err(format!("unknown speculative mode '{other}' (off, auto, ngram, draft or mtp)")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::Ngram => "ngram",
            Mode::Draft => "draft",
            Mode::Mtp => "mtp",
        })
    }
}

/// Drafted tokens per row and step at most, by default: long enough for the runs of copied
/// code an edit gives back, short enough that a rejected draft costs little.
pub const DEFAULT_DRAFT_TOKENS: usize = 8;

/// Positions a verify step checks at most over all rows (rows x (1 + the longest draft)):
/// beyond it a step is bound by compute and its logits by memory.
pub const STEP_POSITIONS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    pub mode: Mode,
    /// Drafted tokens per row and step at most.
    pub draft_tokens: usize,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        SpeculativeConfig { mode: Mode::Auto, draft_tokens: DEFAULT_DRAFT_TOKENS }
    }
}

/// One row's proposer and how far it drafts: the length follows its recent acceptance.
pub struct RowDrafter {
    lookup: PromptLookup,
    /// Tokens it drafts at most now.
    length: usize,
    most: usize,
    /// Tokens drafted and accepted so far (the request's `draft_n`, `draft_n_accepted`).
    pub drafted: usize,
    pub accepted: usize,
}

impl RowDrafter {
    pub fn new(most: usize) -> RowDrafter {
        RowDrafter { lookup: PromptLookup::default(), length: most, most, drafted: 0, accepted: 0 }
    }

    /// Up to `room` tokens to follow `tokens` (empty: nothing to propose).
    pub fn propose(&mut self, tokens: &[u32], room: usize) -> Vec<u32> {
        self.lookup.propose(tokens, self.length.min(room))
    }

    /// Tokens it drafts at most now, within `room`.
    pub fn length(&self, room: usize) -> usize {
        self.length.min(room)
    }

    /// `accepted` of `drafted` proposed tokens were what the model chose: a run accepted whole
    /// drafts further next time, a rejection drafts just past what was accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted;
        self.accepted += accepted;
        self.length = if accepted == drafted { (self.length + 2).min(self.most) } else { (accepted + 1).max(2) };
    }
}

/// Batch sizes measured apart: 1, 2, 3-4, 5-8, 9-16, 17+.
const BUCKETS: usize = 6;

fn bucket(rows: usize) -> usize {
    (usize::BITS - rows.max(1).saturating_sub(1).leading_zeros()).min(BUCKETS as u32 - 1) as usize
}

/// `auto` drafts in batches of at most this many rows. Measured on a 2-core CPU, 16 concurrent
/// chats ran 16-20 % slower while the measurements judged each batch size in turn (a verify step
/// of many rows is bound by compute there); small batches are where one stream waits on
/// reading the weights, which drafting amortises.
pub(crate) const AUTO_MOST_ROWS: usize = 4;

/// A plain step is run now and then while drafting, so the comparison stays current.
const PLAIN_EVERY: u64 = 16;
/// Steps drafting stays off where it did not pay, before it is tried again.
const BACK_OFF_STEPS: u64 = 128;
/// Verify steps measured before drafting is judged: one step says little (a draft rejected
/// at once costs a step, the next may keep eight tokens).
const JUDGED_AFTER: u32 = 4;
/// Weight of the newest step in the running averages.
const EMA: f64 = 0.2;

/// Tokens per row per second, plain and drafting, per batch size; whether drafting pays.
#[derive(Default)]
pub struct Payoff {
    plain: [Option<f64>; BUCKETS],
    verify: [Option<f64>; BUCKETS],
    /// Verify steps measured since drafting was last (re)started, per bucket.
    judged: [u32; BUCKETS],
    /// Per bucket: the step count until which drafting is off.
    off_until: [u64; BUCKETS],
    steps: u64,
}

impl Payoff {
    /// Whether this step of `rows` rows may draft (`forced`: whatever the measurements say).
    pub fn may_draft(&mut self, rows: usize, forced: bool) -> bool {
        self.steps += 1;
        if forced {
            return true;
        }
        if rows > AUTO_MOST_ROWS {
            return false;
        }
        let b = bucket(rows);
        if self.steps < self.off_until[b] {
            return false;
        }
        // Now and then a plain step, to know what drafting is compared with.
        self.plain[b].is_some() && !self.steps.is_multiple_of(PLAIN_EVERY)
    }

    /// A step of `rows` rows took `elapsed` and gave `tokens` tokens over all rows.
    pub fn record(&mut self, rows: usize, tokens: usize, elapsed: Duration, drafted: bool) {
        let b = bucket(rows);
        let rate = tokens as f64 / rows.max(1) as f64 / elapsed.as_secs_f64().max(1e-6);
        let slot = if drafted { &mut self.verify[b] } else { &mut self.plain[b] };
        *slot = Some(slot.map_or(rate, |old| old + EMA * (rate - old)));
        if !drafted {
            return;
        }
        self.judged[b] += 1;
        if let (Some(plain), Some(verify)) = (self.plain[b], self.verify[b]) {
            if self.judged[b] >= JUDGED_AFTER && verify < plain {
                // Larger batches gain less from drafting (their steps are nearer to being bound
                // by compute): they stop too, without each paying for its own judgement.
                for larger in b..BUCKETS {
                    self.off_until[larger] = self.steps + BACK_OFF_STEPS;
                    // Measured afresh when it is tried again.
                    (self.verify[larger], self.judged[larger]) = (None, 0);
                }
            }
        }
    }
}

/// How a row takes a verify step: it samples position by position (`sample(i)`: the token chosen
/// from position `i`'s logits, and whether the row goes on), going on to position `i + 1` only
/// while the token chosen at `i` is the one drafted there. Position `i + 1`'s logits were computed
/// with the draft's token at `i` as input, so they are the model's distribution only then. For a
/// proposal that is a fixed token this is the standard acceptance rule (accept `d` with
/// probability p(d), else sample from p without `d`), and the row's random numbers are drawn in
/// the order plain decoding draws them. Returns the positions used (the tokens emitted) and
/// whether the row goes on.
pub fn verify_row(draft: &[u32], mut sample: impl FnMut(usize) -> (u32, bool)) -> (usize, bool) {
    let mut used = 0;
    loop {
        let (token, alive) = sample(used);
        used += 1;
        if !alive || used > draft.len() || draft[used - 1] != token {
            return (used, alive);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_powers_of_two() {
        let got: Vec<usize> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 64].iter().map(|&r| bucket(r)).collect();
        assert_eq!(got, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    }

    #[test]
    fn drafting_backs_off_where_it_is_slower_than_plain_steps_and_retries_later() {
        let mut p = Payoff::default();
        // No plain measurement yet: a plain step first.
        assert!(!p.may_draft(1, false));
        p.record(1, 1, Duration::from_millis(10), false);
        assert!(p.may_draft(1, false));
        // Drafting gives 2 tokens in 30 ms: 67 tokens/s against 100 plain. Judged after a few
        // such steps, it is off for a while.
        for _ in 0..JUDGED_AFTER {
            assert!(p.may_draft(1, false));
            p.record(1, 2, Duration::from_millis(30), true);
        }
        assert!((0..BACK_OFF_STEPS - 2).all(|_| !p.may_draft(1, false)));
        assert!((0..4).any(|_| p.may_draft(1, false)));
    }

    #[test]
    fn larger_batches_stop_with_a_smaller_one_not_the_other_way() {
        let measured = || {
            let mut p = Payoff::default();
            p.record(1, 1, Duration::from_millis(10), false);
            p.record(4, 4, Duration::from_millis(10), false);
            p.record(8, 8, Duration::from_millis(10), false);
            p
        };
        let mut p = measured();
        for _ in 0..JUDGED_AFTER {
            p.record(1, 2, Duration::from_millis(30), true);
        }
        assert!(!p.may_draft(4, false));
        assert!(p.may_draft(4, true), "forced drafting ignores the measurements");
        let mut p = measured();
        p.record(4, 4, Duration::from_millis(10), false);
        for _ in 0..JUDGED_AFTER {
            p.record(4, 4, Duration::from_millis(30), true);
        }
        assert!(!p.may_draft(4, false) && p.may_draft(1, false));
        // Larger batches than auto drafts in never draft unless forced.
        assert!(!measured().may_draft(8, false) && measured().may_draft(8, true));
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut d = RowDrafter::new(8);
        d.record(8, 2);
        assert_eq!(d.length, 3);
        d.record(3, 3);
        assert_eq!(d.length, 5);
        d.record(5, 0);
        assert_eq!(d.length, 2);
        assert_eq!((d.drafted, d.accepted), (16, 5));
    }

    #[test]
    fn modes_parse_and_unknown_ones_are_named() {
        assert_eq!("auto".parse::<Mode>(), Ok(Mode::Auto));
        assert_eq!("OFF".parse::<Mode>(), Ok(Mode::Off));
        assert_eq!("ngram".parse::<Mode>(), Ok(Mode::Ngram));
        assert_eq!("draft".parse::<Mode>(), Ok(Mode::Draft));
        assert_eq!("mtp".parse::<Mode>(), Ok(Mode::Mtp));
        assert!("fast".parse::<Mode>().unwrap_err().contains("unknown"));
    }
}
