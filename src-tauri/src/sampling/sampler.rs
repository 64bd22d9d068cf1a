//! Picks one token from one row of logits.

use std::collections::HashMap;

use super::{Rng, SamplingParams};
use crate::constrain::TokenConstraint;

/// The chosen token and its log-probability under the model (after penalties, before
/// temperature and truncation), as OpenAI's `logprobs` reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprob: f32,
}

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// How often each generated token occurred (presence/frequency penalties).
    counts: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = params.seed.map_or_else(Rng::from_entropy, Rng::seeded);
        Sampler { params, rng, counts: HashMap::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Chooses the next token. `logits` is modified in place (penalties); `recent` is the tail
    /// of prompt and output the repetition penalty looks at.
    pub fn sample(&mut self, logits: &mut [f32], recent: &[u32]) -> Sampled {
        self.apply_penalties(logits, recent);
        let log_z = log_sum_exp(logits);
        let token = self.choose(logits);
        self.record(token);
        Sampled { token, logprob: logits[token as usize] - log_z }
    }

    /// As [`Sampler::sample`], restricted to the tokens `constraint` allows: the usual choice
    /// when it is allowed (almost always, and cheap to check), otherwise a choice among the
    /// allowed tokens with the others masked out. `None` when no token is allowed.
    pub fn sample_constrained(
        &mut self,
        logits: &mut [f32],
        recent: &[u32],
        constraint: &mut TokenConstraint,
    ) -> Option<Sampled> {
        self.apply_penalties(logits, recent);
        let mut token = self.choose(logits);
        if !constraint.allows(token) {
            if constraint.mask(logits) == 0 {
                return None;
            }
            token = self.choose(logits);
        }
        let log_z = log_sum_exp(logits);
        self.record(token);
        Some(Sampled { token, logprob: logits[token as usize] - log_z })
    }

    fn choose(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            argmax(logits)
        } else {
            self.draw(logits)
        }
    }

    /// Counts a token as generated (for the presence/frequency penalties) without sampling it.
    pub fn record(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    fn apply_penalties(&self, logits: &mut [f32], recent: &[u32]) {
        let p = &self.params;
        for &(token, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(token as usize) {
                *l += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            let start = recent.len().saturating_sub(p.repetition_context);
            let mut seen: Vec<u32> = recent[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &n) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    /// Temperature, then top-k, top-p and min-p truncation, then a draw.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let mut candidates: Vec<(u32, f32)> =
            logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l * inv_t)).collect();
        if candidates.is_empty() {
            return argmax(logits);
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < candidates.len() {
            candidates.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            candidates.truncate(p.top_k);
        }
        candidates.sort_unstable_by(by_logit_desc);
        let max = candidates[0].1;
        let mut probs: Vec<f64> = candidates.iter().map(|(_, l)| f64::from(l - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            keep = probs
                .iter()
                .position(|x| {
                    cumulative += x;
                    cumulative >= f64::from(p.top_p)
                })
                .map_or(keep, |i| i + 1);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * f64::from(p.min_p);
            keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        let kept_total: f64 = probs[..keep].iter().sum();
        let mut u = self.rng.next_f64() * kept_total;
        for (i, x) in probs[..keep].iter().enumerate() {
            if u < *x {
                return candidates[i].0;
            }
            u -= x;
        }
        candidates[keep - 1].0
    }
}

/// The `n` most likely tokens and their log-probabilities, most likely first; tokens a grammar
/// ruled out (logit -inf) are not among them.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let log_z = log_sum_exp(logits);
    let mut indices: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(indices.len());
    if n == 0 {
        return Vec::new();
    }
    let by_logit_desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    indices.select_nth_unstable_by(n - 1, by_logit_desc);
    indices.truncate(n);
    indices.sort_unstable_by(by_logit_desc);
    indices.into_iter().filter(|&i| logits[i as usize].is_finite()).map(|i| (i, logits[i as usize] - log_z)).collect()
}

/// Index of the largest value (the first one on ties, as MLX's argmax).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] || values[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

fn log_sum_exp(values: &[f32]) -> f32 {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = values.iter().map(|v| f64::from(v - max).exp()).sum();
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams { seed: Some(7), ..Default::default() };
        f(&mut p);
        p
    }

    #[test]
    fn greedy_picks_the_largest_logit_and_reports_its_logprob() {
        let mut s = Sampler::new(SamplingParams::greedy());
        let mut logits = vec![0.0, 2.0, 1.0];
        let out = s.sample(&mut logits, &[]);
        assert_eq!(out.token, 1);
        let expected = 2.0 - (1.0f32.exp() + 2.0f32.exp() + 1.0).ln();
        assert!((out.logprob - expected).abs() < 1e-6);
    }

    #[test]
    fn same_seed_same_draws_and_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(|p| {
                p.temperature = 1.0;
                p.seed = Some(seed);
            }));
            (0..40).map(|_| s.sample(&mut logits.clone(), &[]).token).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_choices() {
        let logits: Vec<f32> = vec![1.0, 3.0, 2.0, 0.5];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 5.0;
            p.top_k = 1;
        }));
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits.clone(), &[]).token, 1);
        }
        let mut s = Sampler::new(params(|p| {
            p.temperature = 5.0;
            p.top_k = 2;
        }));
        for _ in 0..100 {
            assert!([1, 2].contains(&s.sample(&mut logits.clone(), &[]).token));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Probabilities ~ [0.64, 0.24, 0.09, 0.03]
        let logits: Vec<f32> = vec![3.0, 2.0, 1.0, -0.1];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.top_p = 0.8;
        }));
        for _ in 0..200 {
            assert!([0, 1].contains(&s.sample(&mut logits.clone(), &[]).token));
        }
        let mut s = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.min_p = 0.5;
        }));
        for _ in 0..200 {
            assert_eq!(s.sample(&mut logits.clone(), &[]).token, 0);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits: Vec<f32> = vec![0.0, 1.0f32.ln() + 0.0, 2.0f32.ln()];
        // probabilities 1/4, 1/4, 1/2
        let mut s = Sampler::new(params(|p| p.temperature = 1.0));
        let mut counts = [0; 3];
        for _ in 0..4000 {
            counts[s.sample(&mut logits.clone(), &[]).token as usize] += 1;
        }
        assert!((counts[2] as f64 / 4000.0 - 0.5).abs() < 0.05, "{counts:?}");
        assert!((counts[0] as f64 / 4000.0 - 0.25).abs() < 0.05, "{counts:?}");
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let mut s = Sampler::new(params(|p| p.repetition_penalty = 2.0));
        assert_eq!(s.sample(&mut [2.0, 1.5], &[0]).token, 1, "2.0/2 < 1.5");
        let mut s = Sampler::new(params(|p| p.presence_penalty = 1.0));
        assert_eq!(s.sample(&mut [2.0, 1.5], &[]).token, 0);
        assert_eq!(s.sample(&mut [2.0, 1.5], &[]).token, 1, "token 0 now penalised by 1.0");
        let mut s = Sampler::new(params(|p| p.logit_bias = vec![(0, -100.0)]));
        assert_eq!(s.sample(&mut [2.0, 1.5], &[]).token, 1, "logit_bias bans token 0");
        let mut s = Sampler::new(params(|p| p.frequency_penalty = 0.3));
        let picks: Vec<u32> = (0..4).map(|_| s.sample(&mut [2.0, 1.5], &[]).token).collect();
        assert_eq!(picks, vec![0, 0, 1, 0], "2.0-0.6=1.4 < 1.5, then 1.5-0.3=1.2 < 1.4");
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = params(|p| p.top_p = 0.0);
        assert_eq!(p.validate().unwrap_err().param, "top_p");
        let p = params(|p| p.temperature = f32::NAN);
        assert_eq!(p.validate().unwrap_err().param, "temperature");
        assert!(SamplingParams::default().validate().is_ok());
    }
}
