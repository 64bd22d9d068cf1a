//! A draft model (`--draft-model`): a small model with the target's vocabulary proposes each
//! row's next tokens, greedily, one forward of all its rows per drafted token. It keeps its own
//! batch of keys and values, one row per request that drafts, kept in step with the target's
//! rows by request id rather than by mirroring every relayout of the running batch:
//!
//! - A request the draft has not seen catches up first: its tokens are prefilled into the draft
//!   a chunk per step ([`CATCH_UP`]), while the row decodes without drafts, then it joins.
//! - Each row's draft cache holds a prefix of the row's tokens (`fed`). Before drafting, the
//!   tokens past it are fed in one forward (the target's token of the last step, and the last
//!   drafted token when a whole draft was accepted; more after steps that did not draft), right-
//!   padded to the longest and realigned (`keep_verified`), which gives the first drafted token.
//! - The drafted tokens' columns are then kept only as far as the target accepted them
//!   ([`DraftModel::verified`]); recurrent layers take their state after the last accepted one
//!   (`continue_verifying` keeps each position's state over the drafting forwards).
//!
//! A proposal is a fixed token, so what the target emits is what it emits without drafting;
//! the draft model changes only the speed.

use mlx_rs::ops::indexing::{argmax_axis, TryIndexOp};
use mlx_rs::{Array, Dtype};

use crate::engine::memory::{self, CostModel, Governor};
use crate::engine::request::RequestId;
use crate::model::{BatchKvCache, KvCache, LayerCache, LoadedModel, ModelError};
use crate::tokenizer::Tokenizer;

/// Prompt tokens a joining row feeds the draft model per step at most: the draft's prefill of a
/// long prompt is spread over steps, so it never stalls the running rows for long.
pub const CATCH_UP: usize = 256;

/// Vocabulary sizes further apart than this are not the same tokenizer (llama.cpp's bound:
/// checkpoints of one family pad their vocabularies differently, by tens of tokens).
const VOCAB_SLACK: usize = 128;

/// A row that wants drafts: its request, its tokens so far (the last is the next input), and
/// how many tokens it may take this step (0: none now, but it stays in the draft batch).
pub struct Want<'a> {
    pub id: RequestId,
    pub tokens: &'a [u32],
    pub most: usize,
}

struct Row {
    id: RequestId,
    /// The row's tokens the draft cache holds (a prefix of them).
    fed: usize,
}

struct Joining {
    id: RequestId,
    cache: Vec<BatchKvCache>,
    fed: usize,
}

pub struct DraftModel {
    model: LoadedModel,
    cost: CostModel,
    /// The target's vocabulary: a proposal past it is cut there.
    target_vocab: usize,
    rows: Vec<Row>,
    cache: Vec<BatchKvCache>,
    joining: Option<Joining>,
    /// Tokens drafted per row by the last proposal, whose columns wait for `verified`.
    pending: Option<usize>,
}

impl DraftModel {
    pub fn new(model: LoadedModel, target_vocab: usize, gpu: bool) -> DraftModel {
        let t = &model.transformer;
        let act_bytes = if t.dtype == Dtype::Float32 { 4 } else { 2 };
        let cost = CostModel::new(&t.config, act_bytes, gpu);
        let layers = t.config.kv_cache_layers();
        DraftModel {
            model,
            cost,
            target_vocab,
            rows: Vec::new(),
            cache: (0..layers).map(|_| BatchKvCache::new()).collect(),
            joining: None,
            pending: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.model.name
    }

    pub fn weights_bytes(&self) -> usize {
        self.model.weights_bytes
    }

    pub fn kv_bytes_per_token(&self) -> usize {
        self.model.transformer.kv_bytes_per_token()
    }

    /// Bytes of its keys, values and states.
    pub fn nbytes(&self) -> usize {
        let joining = self.joining.iter().flat_map(|j| &j.cache);
        self.cache.iter().chain(joining).map(BatchKvCache::nbytes).sum()
    }

    /// Drafts for `want` (in its order; empty where a row has none this step). A row joins the
    /// draft batch once caught up; rows no longer wanted leave it. Nothing is drafted where the
    /// draft's forwards would not fit under the memory ceiling. The caller gives the verify
    /// step's outcome to [`DraftModel::verified`].
    pub fn propose(&mut self, want: &[Want], governor: &Governor) -> Vec<Vec<u32>> {
        match self.try_propose(want, governor) {
            Ok(drafts) => drafts,
            Err(e) => {
                // Drafts only ever speed things up: the draft starts afresh, the rows go on.
                tracing::warn!("draft model {}: {e}; its rows start again", self.model.name);
                self.reset();
                vec![Vec::new(); want.len()]
            }
        }
    }

    /// Each drafting row accepted `accepted[i]` of its drafted tokens (rows of the last
    /// proposal, by request id; a row not listed accepted none): the drafted columns past them
    /// are taken back.
    pub fn verified(&mut self, accepted: &[(RequestId, usize)]) {
        let Some(drafted) = self.pending.take() else { return };
        // Columns written by the proposal: the last fed token's and one per drafted token but
        // the last (which was never fed).
        let written = drafted as i32;
        let kept: Vec<i32> = self
            .rows
            .iter()
            .map(|r| {
                let a = accepted.iter().find(|(id, _)| *id == r.id).map_or(0, |&(_, a)| a);
                1 + a.min(drafted - 1) as i32
            })
            .collect();
        let result = self.cache.iter_mut().try_for_each(|layer| layer.keep_verified(written, &kept));
        if let Err(e) = result {
            tracing::warn!("draft model {}: cannot take back its drafts: {e}", self.model.name);
            return self.reset();
        }
        for (row, k) in self.rows.iter_mut().zip(kept) {
            row.fed += k as usize - 1;
        }
    }

    /// Every row out (after a failure, or when a proposal went unchecked).
    pub fn reset(&mut self) {
        self.rows.clear();
        self.cache.iter_mut().for_each(|c| *c = BatchKvCache::new());
        self.joining = None;
        self.pending = None;
    }

    fn try_propose(&mut self, want: &[Want], governor: &Governor) -> Result<Vec<Vec<u32>>, ModelError> {
        if self.pending.is_some() {
            // A proposal nobody checked: which of its columns to keep is unknown.
            self.reset();
        }
        self.follow(want)?;
        self.catch_up(want, governor)?;
        let mut drafts = vec![Vec::new(); want.len()];
        if self.rows.is_empty() {
            return Ok(drafts);
        }
        let order: Vec<usize> =
            self.rows.iter().map(|r| want.iter().position(|w| w.id == r.id).expect("followed")).collect();
        let drafted = order.iter().map(|&i| want[i].most).max().unwrap_or(0);
        if drafted == 0 {
            return Ok(drafts);
        }
        let Some(first) = self.feed_rows(want, &order, governor)? else { return Ok(drafts) };
        let mut chains: Vec<Vec<u32>> = first.iter().map(|&t| vec![t]).collect();
        if drafted > 1 {
            self.cache.iter_mut().try_for_each(BatchKvCache::continue_verifying)?;
            self.pending = Some(drafted);
            let mut last = first;
            for _ in 1..drafted {
                let ids = Array::from_slice(&last, &[last.len() as i32, 1]);
                last = self.greedy(&ids, None)?;
                chains.iter_mut().zip(&last).for_each(|(c, &t)| c.push(t));
            }
        }
        for (chain, &i) in chains.into_iter().zip(&order) {
            let mut draft: Vec<u32> = chain.into_iter().take(want[i].most).collect();
            if let Some(cut) = draft.iter().position(|&t| t as usize >= self.target_vocab) {
                draft.truncate(cut);
            }
            drafts[i] = draft;
        }
        Ok(drafts)
    }

    /// Rows no longer wanted leave the draft batch (and a joining row no longer wanted stops).
    fn follow(&mut self, want: &[Want]) -> Result<(), ModelError> {
        let wanted = |id: RequestId| want.iter().any(|w| w.id == id);
        if self.joining.as_ref().is_some_and(|j| !wanted(j.id)) {
            self.joining = None;
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&r| wanted(self.rows[r].id)).collect();
        if keep.len() == self.rows.len() {
            return Ok(());
        }
        for layer in &mut self.cache {
            layer.retain(&keep)?;
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&r| rows[r].take().expect("kept once")).collect();
        BatchKvCache::settle(&self.cache)
    }

    /// One step of a joining row's catch-up (the first wanted row the draft does not hold, when
    /// none is joining): up to [`CATCH_UP`] of its tokens, all but its last (whose logits give
    /// the first draft once it drafts). Caught up, it joins the draft batch.
    fn catch_up(&mut self, want: &[Want], governor: &Governor) -> Result<(), ModelError> {
        if self.joining.is_none() {
            let held = |id: RequestId| self.rows.iter().any(|r| r.id == id);
            if let Some(w) = want.iter().find(|w| !held(w.id) && w.tokens.len() > 1) {
                let mut cache: Vec<BatchKvCache> = self.cache.iter().map(|_| BatchKvCache::new()).collect();
                cache.iter_mut().try_for_each(|c| c.push_row(&KvCache::new()))?;
                self.joining = Some(Joining { id: w.id, cache, fed: 0 });
            }
        }
        let Some(joining) = self.joining.as_mut() else { return Ok(()) };
        let tokens = want.iter().find(|w| w.id == joining.id).expect("followed").tokens;
        let goal = tokens.len() - 1;
        let n = (goal - joining.fed).min(CATCH_UP);
        if n > 0 {
            let buffers = memory::buffers_of(&joining.cache);
            let predicted = self.cost.prefill_bytes(1, n, &buffers, 0, 0);
            if predicted > governor.headroom(0) {
                return Ok(());
            }
            let _held = memory::hold(predicted);
            let ids = Array::from_slice(&tokens[joining.fed..joining.fed + n], &[1, n as i32]);
            let hidden = self.model.transformer.forward_hidden(&ids, &mut joining.cache)?;
            let states = joining.cache.iter().flat_map(|c| c.states().iter());
            mlx_rs::transforms::eval(std::iter::once(&hidden).chain(states))?;
            joining.fed += n;
        }
        if joining.fed == goal {
            let joining = self.joining.take().expect("joining");
            for (layer, row) in self.cache.iter_mut().zip(&joining.cache) {
                layer.push_rows_of(row, &[0])?;
            }
            BatchKvCache::settle(&self.cache)?;
            self.rows.push(Row { id: joining.id, fed: joining.fed });
        }
        Ok(())
    }

    /// Feeds each row the tokens past what it holds (at least its next input), in one forward
    /// right-padded to the longest, and realigns the rows; returns each row's greedy next token
    /// (`None`: no room under the memory ceiling).
    fn feed_rows(
        &mut self,
        want: &[Want],
        order: &[usize],
        governor: &Governor,
    ) -> Result<Option<Vec<u32>>, ModelError> {
        let lags: Vec<usize> = self.rows.iter().zip(order).map(|(r, &i)| want[i].tokens.len() - r.fed).collect();
        let width = lags.iter().copied().max().unwrap_or(1);
        let rows = self.rows.len();
        let buffers = memory::buffers_of(&self.cache);
        // The feeding forward, then the drafting ones: the first is the larger.
        let predicted = self.cost.prefill_bytes(rows, width, &buffers, 0, rows);
        if predicted > governor.headroom(0) {
            return Ok(None);
        }
        let _held = memory::hold(predicted);
        let mut ids = Vec::with_capacity(rows * width);
        for (r, &i) in self.rows.iter().zip(order) {
            let fresh = &want[i].tokens[r.fed..];
            ids.extend_from_slice(fresh);
            // Padding columns, taken back below.
            ids.extend(std::iter::repeat_n(*fresh.last().expect("lag >= 1"), width - fresh.len()));
        }
        let ids = Array::from_slice(&ids, &[rows as i32, width as i32]);
        let last: Vec<i32> = lags.iter().enumerate().map(|(r, &lag)| (r * width + lag - 1) as i32).collect();
        self.cache.iter_mut().for_each(BatchKvCache::set_verifying);
        let next = self.greedy(&ids, Some(&last))?;
        let kept: Vec<i32> = lags.iter().map(|&l| l as i32).collect();
        self.cache.iter_mut().try_for_each(|layer| layer.keep_verified(width as i32, &kept))?;
        for (r, &i) in self.rows.iter_mut().zip(order) {
            r.fed = want[i].tokens.len();
        }
        Ok(Some(next))
    }

    /// One forward of the draft batch over `ids` (`[rows, L]`): each row's greedy next token
    /// after position `at[row]` of the flattened `[rows * L]` positions (the last one when
    /// `None`).
    fn greedy(&mut self, ids: &Array, at: Option<&[i32]>) -> Result<Vec<u32>, ModelError> {
        let t = &self.model.transformer;
        let hidden = t.forward_hidden(ids, &mut self.cache)?;
        let (rows, len) = (hidden.dim(0), hidden.dim(1));
        let picked = match at {
            Some(at) => {
                let flat = hidden.reshape(&[rows * len, hidden.dim(2)])?;
                flat.take_axis(Array::from_slice(at, &[rows]), 0)?
            }
            None => hidden.try_index((.., len - 1, ..))?,
        };
        let tokens = argmax_axis(&t.logits(&picked)?, -1, None)?.as_dtype(Dtype::Uint32)?;
        let states = self.cache.iter().flat_map(|c| c.states().iter());
        mlx_rs::transforms::eval(std::iter::once(&tokens).chain(states))?;
        Ok(tokens.as_slice::<u32>().to_vec())
    }
}

/// Whether `draft` may propose tokens for `target`: the same token at every id both have
/// (named at the first that differs), vocabularies of about the same size, and the target's
/// end-of-sequence ids known to the draft.
pub fn check_vocabularies(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t.abs_diff(d) > VOCAB_SLACK {
        return Err(format!(
            "its vocabulary has {d} tokens and the model's {t}: a draft model must use the model's tokenizer"
        ));
    }
    for id in 0..t.min(d) as u32 {
        let (a, b) = (target.id_to_token(id), draft.id_to_token(id));
        if a != b {
            return Err(format!(
                "token {id} is {} for the model and {} for the draft: a draft model must use the model's tokenizer",
                a.map_or("missing".into(), |s| format!("{s:?}")),
                b.map_or("missing".into(), |s| format!("{s:?}")),
            ));
        }
    }
    if let Some(eos) = target.eos_ids.iter().find(|&&id| id as usize >= d) {
        return Err(format!("the model's end token {eos} is outside the draft's vocabulary ({d} tokens)"));
    }
    Ok(())
}
