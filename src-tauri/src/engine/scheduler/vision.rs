//! Images in prefill: before a chunk that meets an image's tokens, the image is encoded (from
//! the engine's cache of encoded images when the same picture came lately, else in one vision
//! tower call for every image the chunk's rows need, under the memory governor), and the chunk's
//! input takes the features at those tokens, with every row's M-RoPE positions. Decode and verify
//! steps give positions too while a running row has images (its later tokens sit at their index
//! plus the prompt's delta).

use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use super::Scheduler;
use crate::model::transformer::ImageInputs;
use crate::model::vision::VisionFeatures;
use crate::model::ModelError;

/// A step's inputs beside its token ids: image features, where the chunk meets images, and
/// M-RoPE positions `[3, rows, width]` for the families that take them.
pub(super) struct StepExtras {
    pub images: Option<ImageInputs>,
    pub positions: Option<Array>,
}

impl Scheduler {
    /// The extras of the group's next chunk of `n` tokens per member, its images encoded first;
    /// `None` when no member has images.
    pub(super) fn group_extras(&mut self, n: usize) -> Result<Option<StepExtras>, ModelError> {
        if !self.group.seqs.iter().any(|s| s.request.images.is_some()) {
            return Ok(None);
        }
        self.encode_images_for(n)?;
        let rows = self.group.len();
        let members = &self.group.seqs;
        let positions =
            self.model.transformer.has_mrope().then(|| positions_of(members.iter().map(|s| (s, s.prefilled)), n));
        // Each (row, image) the chunk meets: its features, and the chunk's columns it fills.
        let mut parts: Vec<&VisionFeatures> = Vec::new();
        let mut gather = vec![0i32; rows * n];
        let mut mask = vec![false; rows * n];
        // Where a family's image tokens see each other: [row, query, key] of the chunk, true
        // where the key is a later token of the query's image.
        let whole = self.model.vision.as_ref().is_some_and(|v| v.processor.attention.whole_images());
        let mut later = if whole { vec![false; rows * n * n] } else { Vec::new() };
        let mut base = 0usize;
        for (r, seq) in members.iter().enumerate() {
            let Some(images) = &seq.request.images else { continue };
            let (from, to) = (seq.prefilled, seq.prefilled + n);
            for (k, image) in images.overlapping(from, to) {
                let features = seq.image_features[k]
                    .as_ref()
                    .ok_or_else(|| ModelError::Mlx(format!("image {k} of request {} was not encoded", seq.id)))?;
                let (lo, hi) = (image.start.max(from), (image.start + image.tokens).min(to));
                for index in lo..hi {
                    mask[r * n + index - from] = true;
                    gather[r * n + index - from] = (base + index - image.start) as i32;
                    if whole {
                        let (i, row) = (index - from, r * n * n);
                        later[row + i * n + (i + 1)..row + i * n + (hi - from)].fill(true);
                    }
                }
                base += image.tokens;
                parts.push(features);
            }
        }
        if parts.is_empty() {
            return Ok(Some(StepExtras { images: None, positions }));
        }
        let shape = [rows as i32, n as i32];
        let gather = Array::from_slice(&gather, &[(rows * n) as i32]);
        let placed = |pick: &dyn Fn(&VisionFeatures) -> &Array| -> Result<Array, ModelError> {
            let all: Vec<&Array> = parts.iter().map(|f| pick(f)).collect();
            let all = concatenate(&all, 0)?;
            let hidden = all.dim(-1);
            Ok(all.take_axis(&gather, 0)?.reshape(&[shape[0], shape[1], hidden])?)
        };
        let embeds = placed(&|f| &f.merged)?;
        let layers = parts[0].deepstack.len();
        let deepstack = (0..layers).map(|j| placed(&|f| &f.deepstack[j])).collect::<Result<Vec<_>, _>>()?;
        let mask = Array::from_slice(&mask, &[shape[0], shape[1], 1]);
        let attention = self.model.vision.as_ref().map(|v| v.processor.attention).unwrap_or_default();
        let later = (whole && later.contains(&true)).then(|| crate::model::transformer::LaterImageTokens {
            keys: Array::from_slice(&later, &[shape[0], 1, shape[1], shape[1]]),
            full: attention.full,
            sliding: attention.sliding,
        });
        Ok(Some(StepExtras { images: Some(ImageInputs { mask, embeds, deepstack, later }), positions }))
    }

    /// The images the group's next `n` tokens per member meet that are not encoded yet (neither
    /// held by their row nor in the cache of encoded images): (row, image) pairs.
    fn images_to_encode(&self, n: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (r, seq) in self.group.seqs.iter().enumerate() {
            let Some(images) = &seq.request.images else { continue };
            for (k, image) in images.overlapping(seq.prefilled, seq.prefilled + n) {
                if seq.image_features[k].is_none() && !self.encoded.contains(&image.hash) {
                    out.push((r, k));
                }
            }
        }
        out
    }

    /// The working memory the vision tower would need to encode what the group's next `n`
    /// tokens per member meet (0: nothing to encode).
    pub(super) fn encode_bytes(&self, n: usize) -> usize {
        let Some(vision) = self.model.vision.as_ref() else { return 0 };
        let mut seen: Vec<[u8; 32]> = Vec::new();
        let mut patches = Vec::new();
        for (r, k) in self.images_to_encode(n) {
            let image = &self.group.seqs[r].request.images.as_ref().expect("has images").images[k];
            if !seen.contains(&image.hash) {
                seen.push(image.hash);
                patches.push(image.pixels.patches());
            }
        }
        if patches.is_empty() {
            return 0;
        }
        vision.encode_bytes(&patches, crate::mlx::gpu_available(), self.model.transformer.dtype_bytes())
    }

    /// Tokens per member the group may prefill before the first image (within the next `n`) that
    /// still needs encoding: where a chunk stops when the encoding does not fit in memory yet.
    pub(super) fn tokens_before_encoding(&self, n: usize) -> usize {
        self.images_to_encode(n)
            .into_iter()
            .map(|(r, k)| {
                let seq = &self.group.seqs[r];
                let image = &seq.request.images.as_ref().expect("has images").images[k];
                image.start.saturating_sub(seq.prefilled)
            })
            .min()
            .unwrap_or(n)
    }

    /// Every image the group's next `n` tokens per member meet has its features: taken from the
    /// cache of encoded images, or encoded now, all in one tower call.
    fn encode_images_for(&mut self, n: usize) -> Result<(), ModelError> {
        let mut missing: Vec<(usize, usize)> = Vec::new();
        for (r, seq) in self.group.seqs.iter_mut().enumerate() {
            let Some(images) = seq.request.images.clone() else { continue };
            for (k, image) in images.overlapping(seq.prefilled, seq.prefilled + n) {
                if seq.image_features[k].is_some() {
                    continue;
                }
                match self.encoded.get(&image.hash) {
                    Some(features) => seq.image_features[k] = Some(features),
                    None => missing.push((r, k)),
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let vision =
            self.model.vision.as_ref().ok_or_else(|| ModelError::Mlx("the model has no vision tower".into()))?;
        // One encoding per distinct picture.
        let mut hashes: Vec<[u8; 32]> = Vec::new();
        let mut pixels = Vec::new();
        for &(r, k) in &missing {
            let image = &self.group.seqs[r].request.images.as_ref().expect("has images").images[k];
            if !hashes.contains(&image.hash) {
                hashes.push(image.hash);
                pixels.push(&image.pixels);
            }
        }
        let patches: usize = pixels.iter().map(|p| p.grid.iter().product::<usize>()).sum();
        let predicted = self.encode_bytes(n);
        let began = std::time::Instant::now();
        let in_flight = self.memory.begin_step(predicted);
        let features = vision.encode(&pixels);
        let features = features.and_then(|features| {
            let arrays = features.iter().flat_map(|f| std::iter::once(&f.merged).chain(&f.deepstack));
            mlx_rs::transforms::eval(arrays)?;
            Ok(features)
        });
        self.memory.end_step();
        drop(in_flight);
        let features = features?;
        let calibration = self.memory.calibration();
        tracing::debug!(
            "vision: {} images, {patches} patches encoded in {:.0} ms ({} MB of working memory predicted, {} MB measured)",
            hashes.len(),
            began.elapsed().as_secs_f64() * 1e3,
            calibration.predicted_bytes >> 20,
            calibration.measured_bytes >> 20
        );
        self.metrics.images_encoded_total += hashes.len() as u64;
        for (hash, f) in hashes.iter().zip(&features) {
            self.encoded.insert(*hash, f.clone());
        }
        for (r, k) in missing {
            let seq = &mut self.group.seqs[r];
            let hash = seq.request.images.as_ref().expect("has images").images[k].hash;
            let at = hashes.iter().position(|h| *h == hash).expect("encoded");
            seq.image_features[k] = Some(features[at].clone());
        }
        Ok(())
    }

    /// Whether a chunk of `m` tokens per member ends outside every member's images (always, for
    /// families whose image tokens do not see later ones).
    fn ends_outside_images(&self, m: usize) -> bool {
        self.group.seqs.iter().all(|seq| {
            let end = seq.prefilled + m;
            seq.request
                .images
                .as_ref()
                .is_none_or(|im| im.images.iter().all(|i| end <= i.start || end >= i.start + i.tokens))
        })
    }

    fn images_whole(&self) -> bool {
        self.model.vision.as_ref().is_some_and(|v| v.processor.attention.whole_images())
    }

    /// The most of `n` tokens per member that ends outside every member's images (0: none does).
    pub(super) fn chunk_before_images(&self, n: usize) -> usize {
        if !self.images_whole() {
            return n;
        }
        (1..=n).rev().find(|&m| self.ends_outside_images(m)).unwrap_or(0)
    }

    /// The chunk of about `n` tokens per member (each at most `shortest` to go) for a family whose
    /// image tokens see their image's later tokens: an image's keys and values are right only
    /// when its forward held the whole image, so no chunk ends inside one. The most of `n` that
    /// ends outside every image, else the least above it (a chunk that starts at or inside an
    /// image reaches its end); `None` when the members' images leave no such length.
    pub(super) fn whole_image_chunk(&self, n: usize, shortest: usize) -> Option<usize> {
        if !self.images_whole() {
            return Some(n);
        }
        let below = self.chunk_before_images(n);
        if below > 0 {
            return Some(below);
        }
        let mut ends: Vec<usize> = self
            .group
            .seqs
            .iter()
            .flat_map(|seq| {
                let images = seq.request.images.as_ref().map(|im| im.images.as_slice()).unwrap_or_default();
                images.iter().map(move |i| (i.start + i.tokens).saturating_sub(seq.prefilled))
            })
            .filter(|&m| m > n && m <= shortest)
            .collect();
        ends.push(shortest);
        ends.sort_unstable();
        ends.into_iter().find(|&m| self.ends_outside_images(m))
    }

    /// After a chunk: features of images a member has prefilled past are let go.
    pub(super) fn drop_prefilled_images(&mut self) {
        for seq in &mut self.group.seqs {
            let Some(images) = seq.request.images.clone() else { continue };
            for (k, image) in images.images.iter().enumerate() {
                if image.start + image.tokens <= seq.prefilled {
                    seq.image_features[k] = None;
                }
            }
        }
    }

    /// M-RoPE positions for a step of `width` tokens per running row, when a row has images.
    pub(super) fn running_positions(&self, width: usize) -> Option<Array> {
        if !self.model.transformer.has_mrope() || !self.running.seqs.iter().any(|s| s.request.images.is_some()) {
            return None;
        }
        // A row's next input is its last token, not yet in its cache.
        Some(positions_of(self.running.seqs.iter().map(|s| (s, s.tokens().len() - 1)), width))
    }
}

/// `[3, rows, width]` positions of `width` tokens per row from each row's `start` index.
fn positions_of<'a>(rows: impl Iterator<Item = (&'a crate::engine::sequence::Sequence, usize)>, width: usize) -> Array {
    let rows: Vec<_> = rows.collect();
    let mut data = vec![0i32; 3 * rows.len() * width];
    for (r, (seq, start)) in rows.iter().enumerate() {
        for i in 0..width {
            let p = seq.rope_position(start + i);
            for (axis, value) in p.into_iter().enumerate() {
                data[(axis * rows.len() + r) * width + i] = value;
            }
        }
    }
    Array::from_slice(&data, &[3, rows.len() as i32, width as i32])
}
