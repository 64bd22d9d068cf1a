//! The sequence-classification head of cross-encoder rerankers: the first token's vector through
//! a dense layer and tanh, then to the labels. BERT's checkpoints name the first layer
//! `pooler.dense` and the second `classifier`; RoBERTa's `classifier.dense` and
//! `classifier.out_proj`.

use mlx_rs::ops::indexing::TryIndexOp;
use mlx_rs::Array;

use super::config::EncoderConfig;
use crate::model::error::Result;
use crate::model::layers::Linear;
use crate::model::weights::Weights;

pub struct Classifier {
    dense: Linear,
    out: Linear,
    pub labels: usize,
}

impl Classifier {
    pub fn build(config: &EncoderConfig, labels: usize, weights: &mut Weights) -> Result<Classifier> {
        let (h, n) = (config.hidden_size, labels as i32);
        let (dense, out) = if config.is_roberta() {
            (weights.linear("classifier.dense", h, h, true)?, weights.linear("classifier.out_proj", n, h, true)?)
        } else {
            (weights.linear("pooler.dense", h, h, true)?, weights.linear("classifier", n, h, true)?)
        };
        Ok(Classifier { dense, out, labels })
    }

    /// `hidden`: `[rows, len, dim]` → one relevance score per row: the sigmoid of a single
    /// label's logit, or the last label's probability (sentence-transformers' CrossEncoder).
    pub fn scores(&self, hidden: &Array) -> Result<Vec<f32>> {
        let first = hidden.try_index((.., 0, ..))?;
        let logits = self.out.forward(&mlx_rs::ops::tanh(&self.dense.forward(&first)?)?)?;
        let logits = logits.as_dtype(mlx_rs::Dtype::Float32)?;
        let probs = if self.labels == 1 {
            mlx_rs::ops::sigmoid(&logits)?
        } else {
            mlx_rs::ops::softmax_axis(&logits, -1, None)?.try_index((.., (self.labels as i32 - 1)..))?
        };
        probs.eval()?;
        Ok(probs.as_slice::<f32>().to_vec())
    }

    pub fn arrays(&self) -> Vec<&Array> {
        self.dense.arrays().into_iter().chain(self.out.arrays()).collect()
    }
}
