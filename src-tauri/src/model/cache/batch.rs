//! The key/value cache of a running batch, one per layer: `[B, H, capacity, D]` buffers in
//! which each row's tokens end at the same column (`idx`) and start after that row's left
//! padding. Rows join with their own prefilled [`KvCache`] (or straight from another batch)
//! and leave when they finish; the padding all remaining rows share is trimmed away.
//! (mlx-lm's `BatchKVCache` is the model.)
//!
//! Copies are what a long shared prompt makes expensive (190 MB of f32 keys and values at 4k
//! tokens of SmolLM2), so: a batch with no rows adopts a lone row's buffers or a whole batch
//! as they are; rows that join together are copied once, in one build of the new buffers; and
//! every build leaves spare columns so the next steps write in place.
//!
//! A prompt start that several rows share (agents with one long system prompt) can be held once,
//! as a [`SharedKv`] segment: a row that uses it keeps only what follows it in its own columns,
//! and attention looks at the segment, then at the row's own columns. Without it every row of
//! the dense buffers would be as wide as the shared prompt.
//!
//! In a layer with an attention window, all rows drop the columns no later token can see
//! together (see `buffers`), each row counting the tokens it dropped (`dropped`).

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::ops::{concatenate, zeros_dtype};
use mlx_rs::Array;

use super::buffers::{spare_capacity, window_drop, Buffers};
use super::kv_tensor::{KvFormat, KvQuant, KvTensor};
use super::{AttentionMask, KvCache, LayerCache, Positions};
use crate::model::error::Result;

/// The keys and values of a prompt start shared by rows, `[1, H, P, D]` each, held once (in the
/// format of the batches that use it).
#[derive(Clone)]
pub struct SharedKv {
    /// Tells one segment from another (the same segment is set on every batch that uses it).
    pub id: u64,
    pub keys: KvTensor,
    pub values: KvTensor,
}

impl SharedKv {
    /// Its tokens: positions `0..len` of every row that uses it.
    pub fn len(&self) -> i32 {
        self.keys.dim(2)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.keys.nbytes() + self.values.nbytes()
    }
}

#[derive(Default, Clone)]
pub struct BatchKvCache {
    buffers: Buffers,
    /// How the rows' keys and values are stored (see [`KvFormat`]): one format for all rows,
    /// so the longest row decides when they are quantized; a row joining a quantized batch is
    /// quantized, a quantized row joining quantizes the batch. (`buffers.quant`: the one now.)
    format: KvFormat,
    /// Columns written so far; every row's next token goes to column `idx`.
    idx: i32,
    /// Per row: the columns before its first token.
    left_padding: Vec<i32>,
    /// The shared start, and per row whether its sequence begins with it.
    shared: Option<SharedKv>,
    after_shared: Vec<bool>,
    /// Per row: its tokens before its first column that are not in the shared segment
    /// (dropped by a windowed layer).
    dropped: Vec<i32>,
    /// A recurrent layer's state, `[rows, ..]` each (it keeps no keys: `idx` and the padding
    /// only count tokens, as in the other layers).
    states: Vec<Array>,
    /// While a step checks drafted tokens: set, and a recurrent layer's state after each of the
    /// step's positions (`[rows, L, ..]` per state), from which `keep_verified` takes each row's.
    verifying: bool,
    step_states: Vec<Array>,
}

/// Rows to add to a batch: keys and values `[rows, H, width, D]` aligned on the right, each
/// row's left padding within them (`None`: rows that hold nothing yet), and whether each row's
/// own columns follow the shared segment.
struct Part {
    contents: Option<(KvTensor, KvTensor)>,
    padding: Vec<i32>,
    after_shared: Vec<bool>,
    dropped: Vec<i32>,
    /// The rows' recurrent states (`None`: fresh rows, zeros).
    states: Option<Vec<Array>>,
    width: i32,
}

impl BatchKvCache {
    pub fn new() -> BatchKvCache {
        BatchKvCache::default()
    }

    /// An empty batch storing keys and values in `format`.
    pub fn with_format(format: KvFormat) -> BatchKvCache {
        BatchKvCache { format, ..BatchKvCache::default() }
    }

    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// How the keys and values are held now (`None`: at full precision).
    pub fn held_quant(&self) -> Option<KvQuant> {
        self.buffers.quant
    }

    /// The quantization the next forward converts the held keys and values to, if it does (its
    /// longest row has reached the format's start).
    pub fn converts_next(&self) -> Option<KvQuant> {
        let longest = self.lengths().into_iter().max().unwrap_or(0);
        self.format.due(longest).filter(|_| self.buffers.quant.is_none() && self.buffers.keys.is_some())
    }

    pub fn rows(&self) -> usize {
        self.left_padding.len()
    }

    /// Tokens cached for each row (the shared segment's included).
    pub fn lengths(&self) -> Vec<i32> {
        (0..self.rows()).map(|r| self.idx - self.left_padding[r] + self.shared_len(r) + self.dropped[r]).collect()
    }

    /// Tokens held: every row's own, and the shared segment's once.
    pub fn held_tokens(&self) -> usize {
        let own: i32 = self.left_padding.iter().map(|p| self.idx - p).sum();
        own.max(0) as usize + self.active_shared().map_or(0, |s| s.len() as usize)
    }

    /// Tokens row `row` takes from the shared segment (0 or all of it).
    fn shared_len(&self, row: usize) -> i32 {
        match &self.shared {
            Some(shared) if self.after_shared[row] => shared.len(),
            _ => 0,
        }
    }

    /// Columns in use (longest row's own part plus padding); the attention work per step
    /// besides the shared segment.
    pub fn width(&self) -> i32 {
        self.idx
    }

    /// The arrays it holds (buffers and states), to evaluate rows just added: a step's memory
    /// is then its own, not the lazy copies of rows that joined before it.
    pub fn arrays(&self) -> Vec<&Array> {
        let kv = self.buffers.keys.iter().chain(self.buffers.values.iter()).flat_map(KvTensor::parts);
        kv.chain(self.states.iter()).collect()
    }

    /// Evaluates every layer's buffers and states now: a relayout (rows joined, left, realigned)
    /// is lazy, and left so MLX would copy it inside the next forward, whose memory the governor
    /// measures against its prediction.
    pub fn settle(layers: &[BatchKvCache]) -> Result<()> {
        Ok(mlx_rs::transforms::eval(layers.iter().flat_map(BatchKvCache::arrays))?)
    }

    /// Columns the key/value buffers have room for before they must grow (0: none yet).
    pub fn capacity(&self) -> i32 {
        self.buffers.keys.as_ref().map_or(0, |k| k.dim(2))
    }

    /// Bytes of the rows' own buffers and states (the shared segment is counted by whoever
    /// holds it).
    pub fn nbytes(&self) -> usize {
        self.buffers.nbytes() + self.states.iter().map(Array::nbytes).sum::<usize>()
    }

    /// Row `row`'s recurrent state, `[1, ..]` each (none in a layer that keeps keys).
    pub fn row_states(&self, row: usize) -> Result<Vec<Array>> {
        let r = row as i32;
        self.states.iter().map(|s| Ok(s.try_index(r..r + 1)?)).collect()
    }

    /// The shared segment, when a row uses it.
    fn active_shared(&self) -> Option<&SharedKv> {
        self.shared.as_ref().filter(|_| self.after_shared.contains(&true))
    }

    /// Whether row `row` begins with the shared segment.
    pub fn is_after_shared(&self, row: usize) -> bool {
        self.after_shared[row]
    }

    /// Sets the segment rows pushed with `after_shared` follow; fails while rows use another.
    pub fn set_shared(&mut self, shared: &SharedKv) -> Result<()> {
        match &self.shared {
            Some(current) if current.id != shared.id && self.after_shared.contains(&true) => {
                Err(crate::model::ModelError::Mlx("the batch's rows use another shared segment".into()))
            }
            _ => {
                self.shared = Some(shared.clone());
                Ok(())
            }
        }
    }

    /// The format rows join in when one of them (or the batch) is held as `held`: the batch's
    /// quantization if any is quantized; a row quantized otherwise than the batch stores is an
    /// error (it comes from another engine's cache).
    fn join_quant(&self, held: Option<KvQuant>) -> Result<Option<KvQuant>> {
        match held {
            Some(q) if self.format.quant != Some(q) => Err(crate::model::ModelError::Mlx(format!(
                "keys and values quantized as {q:?} join a batch that stores them as {:?}",
                self.format.quant
            ))),
            held => Ok(held),
        }
    }

    /// Row `row`'s own keys and values, `[1, H, length, D]` each (`None` while it holds none).
    fn own_contents(&self, row: usize) -> Result<Option<(KvTensor, KvTensor)>> {
        let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) else { return Ok(None) };
        let (r, pad, idx) = (row as i32, self.left_padding[row], self.idx);
        if pad >= idx {
            return Ok(None);
        }
        let own = |t: &KvTensor| t.map(|a| Ok(a.try_index((r..r + 1, .., pad..idx, ..))?));
        Ok(Some((own(k)?, own(v)?)))
    }

    /// Row `row`'s keys and values in order, `[1, H, n, D]` each: the shared segment (when the
    /// row follows it and has dropped none of its own tokens), then its own columns; they
    /// begin at position [`Self::row_start`]. No copy.
    pub fn row_segments(&self, row: usize) -> Result<Vec<(KvTensor, KvTensor)>> {
        let mut out = Vec::with_capacity(2);
        if let Some(shared) = self.shared.as_ref().filter(|_| self.after_shared[row] && self.dropped[row] == 0) {
            out.push((shared.keys.clone(), shared.values.clone()));
        }
        out.extend(self.own_contents(row)?);
        Ok(out)
    }

    /// The position of the first token [`Self::row_segments`] gives of row `row`.
    pub fn row_start(&self, row: usize) -> i32 {
        match self.dropped[row] {
            0 => 0,
            dropped => self.shared_len(row) + dropped,
        }
    }

    /// Row `row`'s keys and values, `[1, H, length, D]` each (`None` while it holds nothing);
    /// a copy when the row follows the shared segment.
    pub fn row_contents(&self, row: usize) -> Result<Option<(KvTensor, KvTensor)>> {
        let segments = self.row_segments(row)?;
        if segments.len() < 2 {
            return Ok(segments.into_iter().next());
        }
        let (keys, values): (Vec<KvTensor>, Vec<KvTensor>) = segments.into_iter().unzip();
        Ok(Some((KvTensor::concatenate(&keys, 2)?, KvTensor::concatenate(&values, 2)?)))
    }

    /// The batch's only row as a cache of its own, sharing the buffers (no copy); `None` when
    /// it has another number of rows, the row does not start at column 0 or follows the
    /// shared segment.
    pub fn only_row(&self) -> Option<KvCache> {
        (self.rows() == 1 && self.left_padding[0] == 0 && !self.after_shared[0])
            .then(|| self.row_cache(KvCache::from_buffers(self.buffers.clone(), self.idx, self.format), 0))
            .transpose()
            .ok()
            .flatten()
    }

    /// Row `row` of a batch's layers as a cache of its own per layer (shared when it is the
    /// only row, else a copy).
    pub fn row_of(layers: &[BatchKvCache], row: usize) -> Result<Vec<KvCache>> {
        layers
            .iter()
            .map(|layer| {
                if let Some(only) = layer.only_row() {
                    return Ok(only);
                }
                let own = match layer.row_contents(row)? {
                    Some((k, v)) => KvCache::from_pieces(&[k], &[v], 0, layer.format())?,
                    None => KvCache::with_format(layer.format()),
                };
                layer.row_cache(own, row)
            })
            .collect()
    }

    /// `cache` (row `row`'s keys and values) with the row's start and recurrent state.
    pub fn row_cache(&self, cache: KvCache, row: usize) -> Result<KvCache> {
        let states = self.row_states(row)?;
        let cache = cache.starting_at(self.row_start(row));
        if states.is_empty() {
            return Ok(cache);
        }
        Ok(KvCache::recurrent(states, self.lengths()[row]))
    }

    /// Adds a sequence (its prefilled single-row cache, possibly empty) as the last row.
    pub fn push_row(&mut self, row: &KvCache) -> Result<()> {
        self.push_rows(&[row])
    }

    /// Adds sequences (their single-row caches, possibly empty) as the last rows, in one copy;
    /// a batch with no rows takes a lone row's buffers as they are.
    pub fn push_rows(&mut self, rows: &[&KvCache]) -> Result<()> {
        self.push_rows_with(&rows.iter().map(|row| (*row, false)).collect::<Vec<_>>())
    }

    /// [`Self::push_rows`] for rows `(cache, after_shared)`: an `after_shared` row's cache holds
    /// what follows the shared segment (set first with [`Self::set_shared`]).
    pub fn push_rows_with(&mut self, rows: &[(&KvCache, bool)]) -> Result<()> {
        if rows.iter().any(|(_, after)| *after) && self.shared.is_none() {
            return Err(crate::model::ModelError::Mlx("a row follows a shared segment the batch lacks".into()));
        }
        match rows {
            [] => Ok(()),
            [(row, after)] if self.rows() == 0 => {
                let mut buffers = row.buffers().clone();
                if let Some(q) = self.join_quant(buffers.quant)? {
                    if buffers.quant != Some(q) {
                        buffers.quantize(q)?;
                    }
                }
                *self = BatchKvCache {
                    buffers,
                    format: self.format,
                    idx: row.offset(),
                    left_padding: vec![0],
                    shared: self.shared.take(),
                    after_shared: vec![*after],
                    dropped: vec![row.start()],
                    states: row.states().to_vec(),
                    verifying: false,
                    step_states: Vec::new(),
                };
                Ok(())
            }
            _ => {
                let parts = rows
                    .iter()
                    .map(|(row, after)| {
                        Ok(Part {
                            contents: row.contents()?,
                            padding: vec![0],
                            after_shared: vec![*after],
                            dropped: vec![row.start()],
                            states: Some(row.states().to_vec()).filter(|s| !s.is_empty()),
                            width: row.offset(),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                self.extend(parts)
            }
        }
    }

    /// Adds rows `rows` of `other` (in that order) as the last rows, in one copy; a batch with
    /// no rows that takes all of `other`'s rows in order takes its buffers as they are. Rows
    /// that follow `other`'s shared segment follow it here too.
    pub fn push_rows_of(&mut self, other: &BatchKvCache, rows: &[usize]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if self.rows() == 0 && rows.iter().copied().eq(0..other.rows()) && self.format == other.format {
            *self = other.clone();
            return Ok(());
        }
        if let Some(shared) = other.shared.as_ref().filter(|_| rows.iter().any(|&r| other.after_shared[r])) {
            self.set_shared(shared)?;
        }
        let parts = rows
            .iter()
            .map(|&r| {
                let contents = other.own_contents(r)?;
                let width = other.idx - other.left_padding[r];
                Ok(Part {
                    contents,
                    padding: vec![0],
                    after_shared: vec![other.after_shared[r]],
                    dropped: vec![other.dropped[r]],
                    states: Some(other.row_states(r)?).filter(|s| !s.is_empty()),
                    width: width.max(0),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.extend(parts)
    }

    /// Rows `rows` (whose cached sequences begin with `shared`'s tokens, at least all of them)
    /// drop their own copy of it and follow `shared` instead; the buffers are rebuilt without
    /// the columns no row needs any more. All or nothing.
    pub fn share_rows(&mut self, shared: &SharedKv, rows: &[usize]) -> Result<()> {
        let lengths = self.lengths();
        let mut next = self.clone();
        next.set_shared(shared)?;
        for &r in rows {
            if next.after_shared[r] || lengths[r] < shared.len() {
                return Err(crate::model::ModelError::Mlx("a row cannot take the shared segment".into()));
            }
            // Its own columns from position `dropped` on: those before the segment's end go.
            let dropped = next.dropped[r];
            next.after_shared[r] = true;
            next.left_padding[r] += (shared.len() - dropped).max(0);
            next.dropped[r] = (dropped - shared.len()).max(0);
        }
        next.extend(Vec::new())?;
        *self = next;
        Ok(())
    }

    /// Rebuilds the buffers with `parts` as new last rows: every row's tokens end at the longest
    /// part's (or the batch's) last column, with spare columns after it. Padding every current
    /// row has is left out.
    fn extend(&mut self, parts: Vec<Part>) -> Result<()> {
        let trim = self.left_padding.iter().copied().min().unwrap_or(0).min(self.idx);
        let idx = self.idx;
        let used = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., trim..idx, ..))?));
        let contents = match (&self.buffers.keys, &self.buffers.values) {
            (Some(k), Some(v)) if self.idx > trim => Some((used(k)?, used(v)?)),
            _ => None,
        };
        let current = Part {
            contents,
            padding: self.left_padding.iter().map(|p| p - trim).collect(),
            after_shared: self.after_shared.clone(),
            dropped: self.dropped.clone(),
            states: Some(self.states.clone()).filter(|s| !s.is_empty()),
            width: self.idx - trim,
        };
        // All rows in one format: quantized if any of them is.
        let mut quant = self.buffers.quant;
        for held in parts.iter().filter_map(|p| p.contents.as_ref()).map(|(k, _)| k.quant()) {
            quant = self.join_quant(quant.or(held))?;
        }
        let parts: Vec<Part> = std::iter::once(current)
            .chain(parts)
            .map(|mut p| {
                p.contents = match p.contents.take() {
                    Some((k, v)) => Some((k.in_format(quant)?, v.in_format(quant)?)),
                    None => None,
                };
                Ok(p)
            })
            .collect::<Result<_>>()?;
        let idx = parts.iter().map(|p| p.width).max().unwrap_or(0);
        let rows: i32 = parts.iter().map(|p| p.padding.len() as i32).sum();
        let like = parts.iter().find_map(|p| p.contents.clone());
        let mut buffers = Buffers::new(quant);
        if let Some((like_k, like_v)) = like {
            let capacity = spare_capacity(idx);
            let mut k = KvTensor::zeros(&like_k, rows, like_k.dim(1), capacity)?;
            let mut v = KvTensor::zeros(&like_v, rows, like_v.dim(1), capacity)?;
            let mut row = 0;
            for part in &parts {
                let n = part.padding.len() as i32;
                if let Some((pk, pv)) = &part.contents {
                    let from = idx - part.width;
                    k.write_at(row..row + n, from, pk)?;
                    v.write_at(row..row + n, from, pv)?;
                }
                row += n;
            }
            (buffers.keys, buffers.values) = (Some(k), Some(v));
        }
        // Everything that can fail is done: the batch changes all at once or not at all.
        let states = merge_states(&parts)?;
        self.left_padding = parts.iter().flat_map(|p| p.padding.iter().map(move |pad| pad + idx - p.width)).collect();
        self.after_shared = parts.iter().flat_map(|p| p.after_shared.iter().copied()).collect();
        self.dropped = parts.iter().flat_map(|p| p.dropped.iter().copied()).collect();
        self.states = states;
        self.buffers = buffers;
        self.idx = idx;
        Ok(())
    }

    /// Keeps the rows at `keep` (in that order) and trims the padding they all share.
    pub fn retain(&mut self, keep: &[usize]) -> Result<()> {
        if keep.is_empty() {
            *self = BatchKvCache::with_format(self.format);
            return Ok(());
        }
        let padding: Vec<i32> = keep.iter().map(|&r| self.left_padding[r]).collect();
        let trim = padding.iter().copied().min().unwrap_or(0);
        let all_in_order = keep.iter().copied().eq(0..self.rows());
        if let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) {
            // Trimmed first (a view), so the gather below copies only what stays, spare
            // columns included.
            let (mut k, mut v) = if trim > 0 {
                let trimmed = |t: &KvTensor| t.map(|a| Ok(a.try_index((.., .., trim.., ..))?));
                (trimmed(k)?, trimmed(v)?)
            } else {
                (k.clone(), v.clone())
            };
            if !all_in_order {
                let index =
                    Array::from_slice(&keep.iter().map(|&r| r as i32).collect::<Vec<_>>(), &[keep.len() as i32]);
                let kept = |t: &KvTensor| t.map(|a| Ok(a.take_axis(&index, 0)?));
                (k, v) = (kept(&k)?, kept(&v)?);
            }
            self.buffers.keys = Some(k);
            self.buffers.values = Some(v);
        }
        self.idx -= trim;
        self.left_padding = padding.into_iter().map(|p| p - trim).collect();
        self.after_shared = keep.iter().map(|&r| self.after_shared[r]).collect();
        self.dropped = keep.iter().map(|&r| self.dropped[r]).collect();
        if !all_in_order && !self.states.is_empty() {
            let index = Array::from_slice(&keep.iter().map(|&r| r as i32).collect::<Vec<_>>(), &[keep.len() as i32]);
            self.states = self.states.iter().map(|s| s.take_axis(&index, 0)).collect::<std::result::Result<_, _>>()?;
        }
        if !self.after_shared.contains(&true) {
            self.shared = None;
        }
        Ok(())
    }

    /// After a step that wrote `written` columns for every row, row `r` keeps only the first
    /// `kept[r]` of them (speculative decoding: the tokens the model agreed with). Rows end on
    /// the same column again: a row that keeps fewer than the most is moved right by the
    /// difference (one gather over the buffers; its padding grows by as much), so rejected
    /// columns leave no trace; what lies past the last kept column is written over next step.
    /// A recurrent layer takes each row's state after its last kept token from the states the
    /// step kept per position (it ran with [`BatchKvCache::set_verifying`]).
    pub fn keep_verified(&mut self, written: i32, kept: &[i32]) -> Result<()> {
        self.verifying = false;
        let steps = std::mem::take(&mut self.step_states);
        if !self.states.is_empty() {
            if steps.len() != self.states.len() {
                return Err(crate::model::ModelError::Mlx(
                    "a recurrent layer kept no state per position for the drafted tokens".into(),
                ));
            }
            let rows = kept.len() as i32;
            let picked: Vec<i32> = kept.iter().enumerate().map(|(r, &k)| r as i32 * written + k - 1).collect();
            let index = Array::from_slice(&picked, &[rows]);
            let mut states = Vec::with_capacity(steps.len());
            for s in &steps {
                let mut flat = vec![rows * written];
                flat.extend_from_slice(&s.shape()[2..]);
                states.push(s.reshape(&flat)?.take_axis(&index, 0)?);
            }
            mlx_rs::transforms::eval(&states)?;
            self.states = states;
        }
        if kept.len() != self.rows() || kept.iter().any(|&k| k < 1 || k > written) || written > self.idx {
            return Err(crate::model::ModelError::Mlx(format!(
                "cannot keep {kept:?} of {written} columns in a batch of {} rows at column {}",
                self.rows(),
                self.idx
            )));
        }
        let most = kept.iter().copied().max().unwrap_or(written);
        self.idx += most - written;
        let shifts: Vec<i32> = kept.iter().map(|&k| most - k).collect();
        if shifts.iter().all(|&s| s == 0) {
            return Ok(());
        }
        if let (Some(k), Some(v)) = (&self.buffers.keys, &self.buffers.values) {
            let capacity = k.dim(2);
            let from: Vec<i32> = shifts.iter().flat_map(|&s| (0..capacity).map(move |c| (c - s).max(0))).collect();
            let index = Array::from_slice(&from, &[self.rows() as i32, 1, capacity, 1]);
            let shifted = |t: &KvTensor| t.map(|a| Ok(a.take_along_axis(&index, 2)?));
            let (k, v) = (shifted(k)?, shifted(v)?);
            mlx_rs::transforms::eval(k.parts().into_iter().chain(v.parts()))?;
            (self.buffers.keys, self.buffers.values) = (Some(k), Some(v));
        }
        for (pad, s) in self.left_padding.iter_mut().zip(shifts) {
            *pad += s;
        }
        Ok(())
    }

    /// The next forward checks drafted tokens (see [`LayerCache::verifying`]).
    pub fn set_verifying(&mut self) {
        self.verifying = true;
        self.step_states.clear();
    }

    /// The next forwards (one or several) write columns that [`BatchKvCache::keep_verified`]
    /// may take back, the column written last before them included (a draft model's proposals:
    /// one forward per drafted token). A recurrent layer's state now is the first position
    /// kept, the states after each later position are appended to it.
    pub fn continue_verifying(&mut self) -> Result<()> {
        self.verifying = true;
        self.step_states = self.states.iter().map(|s| s.expand_dims(1)).collect::<std::result::Result<_, _>>()?;
        Ok(())
    }

    /// The mask over the rows' own columns.
    fn own_mask(&self, new_tokens: i32, window: Option<usize>) -> Result<AttentionMask> {
        let no_padding = self.left_padding.iter().all(|&p| p == 0);
        let within_window = window.is_none_or(|w| self.idx + new_tokens <= w as i32);
        if no_padding && within_window {
            return Ok(if new_tokens == 1 { AttentionMask::None } else { AttentionMask::Causal });
        }
        let width = self.idx + new_tokens;
        let mut allowed = Vec::with_capacity(self.rows() * (new_tokens * width) as usize);
        for &pad in &self.left_padding {
            for i in 0..new_tokens {
                let column = self.idx + i;
                for j in 0..width {
                    let in_window = window.is_none_or(|w| column - j < w as i32);
                    allowed.push(j >= pad && j <= column && in_window);
                }
            }
        }
        let mask = Array::from_slice(&allowed, &[self.rows() as i32, 1, new_tokens, width]);
        Ok(AttentionMask::Explicit(mask))
    }

    /// Which shared columns each row's queries may see: `None` when every row sees all of them,
    /// else `[B, 1, 1, 1]` (rows that follow it or not) or `[B, 1, L, P]` (in a window).
    fn shared_mask(&self, shared: &SharedKv, new_tokens: i32, window: Option<usize>) -> Option<Array> {
        let rows = self.rows() as i32;
        let lengths = self.lengths();
        let p = shared.len();
        // Query `i` of row `b` sits at position `lengths[b] + i`; shared column `j` at `j`.
        let window = window.filter(|&w| lengths.iter().any(|&len| len + new_tokens > w as i32));
        match window {
            None if !self.after_shared.contains(&false) => None,
            None => Some(Array::from_slice(&self.after_shared, &[rows, 1, 1, 1])),
            Some(w) => {
                let mut allowed = Vec::with_capacity((rows * new_tokens * p) as usize);
                for (b, &len) in lengths.iter().enumerate() {
                    for i in 0..new_tokens {
                        allowed.extend((0..p).map(|j| self.after_shared[b] && len + i - j < w as i32));
                    }
                }
                Some(Array::from_slice(&allowed, &[rows, 1, new_tokens, p]))
            }
        }
    }
}

impl LayerCache for BatchKvCache {
    fn positions(&self) -> Result<Positions> {
        let offsets: Vec<i32> = self.lengths();
        let max = offsets.iter().copied().max().unwrap_or(0);
        if offsets.iter().all(|&o| o == max) {
            return Ok(Positions::Scalar(max));
        }
        Ok(Positions::Rows { offsets: Array::from_slice(&offsets, &[offsets.len() as i32]), max })
    }

    /// Row `b`'s query `i` (column `idx + i`) may see its own column `j` when the row has a
    /// token there (`j >= left_padding[b]`), it is not in the future, and it is inside the
    /// window; and the shared segment when the row follows it (within the window).
    fn mask(&self, new_tokens: i32, window: Option<usize>) -> Result<AttentionMask> {
        let own = self.own_mask(new_tokens, window)?;
        Ok(match self.active_shared() {
            Some(shared) => {
                AttentionMask::Shared { prefix: self.shared_mask(shared, new_tokens, window), own: Box::new(own) }
            }
            None => own,
        })
    }

    fn shared(&self) -> Option<&SharedKv> {
        self.active_shared()
    }

    /// Quantizes the rows first when the longest is due (see [`KvFormat`]).
    fn update(&mut self, keys: &Array, values: &Array) -> Result<(KvTensor, KvTensor)> {
        let longest = self.lengths().into_iter().max().unwrap_or(0);
        if let (Some(quant), None) = (self.format.due(longest), self.buffers.quant) {
            self.buffers.quantize(quant)?;
        }
        let out = self.buffers.write(self.idx, keys, values)?;
        self.idx += keys.dim(2);
        Ok(out)
    }

    fn states(&self) -> &[Array] {
        &self.states
    }

    fn set_states(&mut self, states: Vec<Array>) {
        self.states = states;
    }

    fn verifying(&self) -> bool {
        self.verifying
    }

    fn set_step_states(&mut self, states: Vec<Array>) {
        // After `continue_verifying`, each forward's positions follow those kept before it.
        if self.step_states.len() == states.len() {
            if let Ok(joined) = self
                .step_states
                .iter()
                .zip(&states)
                .map(|(before, now)| concatenate(&[before, now], 1))
                .collect::<std::result::Result<Vec<_>, _>>()
            {
                self.step_states = joined;
                return;
            }
        }
        self.step_states = states;
    }

    fn advance(&mut self, n: i32) {
        self.idx += n;
    }

    /// Drops the leading columns of every row at once (a row's padding first, then its
    /// oldest tokens).
    fn drop_outside(&mut self, window: usize) -> Result<()> {
        let drop = window_drop(self.idx, window);
        if drop == 0 || self.buffers.keys.is_none() {
            return Ok(());
        }
        self.buffers.drop_front(drop, self.idx)?;
        for (pad, dropped) in self.left_padding.iter_mut().zip(&mut self.dropped) {
            *dropped += (drop - *pad).max(0);
            *pad = (*pad - drop).max(0);
        }
        self.idx -= drop;
        Ok(())
    }
}

/// The rows' recurrent states in part order, one `[rows, ..]` array per state; rows that have
/// none yet get zeros (a fresh sequence's state). Empty when no part has one.
fn merge_states(parts: &[Part]) -> Result<Vec<Array>> {
    let Some(like) = parts.iter().find_map(|p| p.states.as_ref()) else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(like.len());
    for (i, template) in like.iter().enumerate() {
        let mut pieces = Vec::with_capacity(parts.len());
        for part in parts.iter().filter(|p| !p.padding.is_empty()) {
            pieces.push(match &part.states {
                Some(states) => states[i].clone(),
                None => {
                    let mut shape = template.shape().to_vec();
                    shape[0] = part.padding.len() as i32;
                    zeros_dtype(&shape, template.dtype())?
                }
            });
        }
        out.push(if pieces.len() == 1 { pieces.pop().expect("one") } else { concatenate(&pieces, 0)? });
    }
    Ok(out)
}
