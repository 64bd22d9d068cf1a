//! The named tensors of a checkpoint, handed out to the layers that own them: shapes checked,
//! dtypes converted to the compute dtype once at load, quantization read from the tensors.

use std::collections::HashMap;
use std::path::PathBuf;

use mlx_rs::{Array, Dtype};

use crate::model::config::{QuantMode, QuantSpec};
use crate::model::error::{ModelError, Result};
use crate::model::layers::{quant_ops, Embedding, LayerNorm, Linear, RmsNorm, SwitchLinear, SwitchMatrix};

/// How the checkpoint says its linear layers are quantized.
#[derive(Debug, Clone, Default)]
pub struct QuantConfig {
    /// The default for every quantized layer (MLX layout: `config.json` "quantization").
    pub default: Option<QuantSpec>,
    /// Per-layer overrides by module path (e.g. `model.layers.0.mlp.down_proj`).
    pub overrides: HashMap<String, QuantSpec>,
    /// GGUF blocks are always 32 wide; the bit width follows from the packed shape.
    pub infer_bits_with_group: Option<i32>,
}

pub struct Weights {
    tensors: HashMap<String, Array>,
    /// The file or folder the tensors came from, for error messages.
    pub source: PathBuf,
    pub quant: QuantConfig,
    /// Floating-point tensors are converted to this dtype.
    pub dtype: Dtype,
    /// Quantized layers are dequantized to `dtype` instead of kept packed.
    pub expand_quantized: bool,
}

impl Weights {
    pub fn new(tensors: HashMap<String, Array>, source: PathBuf, quant: QuantConfig, dtype: Dtype) -> Weights {
        Weights { tensors, source, quant, dtype, expand_quantized: false }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn remove(&mut self, name: &str) -> Option<Array> {
        self.tensors.remove(name)
    }

    pub fn insert(&mut self, name: String, array: Array) {
        self.tensors.insert(name, array);
    }

    /// Renames every tensor through `rename` (`None` drops it).
    pub fn rename_all(&mut self, rename: impl Fn(&str) -> Option<String>) {
        let old = std::mem::take(&mut self.tensors);
        self.tensors = old.into_iter().filter_map(|(k, v)| rename(&k).map(|k| (k, v))).collect();
    }

    /// Renames every tensor through `rename` (`None` drops it) and the per-module quantization
    /// overrides with them (a module `m` renamed as its `m.weight` is), for a family whose
    /// layout is rewritten after the checkpoint's names were read.
    pub fn rename_modules(&mut self, rename: impl Fn(&str) -> Option<String>) {
        self.rename_all(&rename);
        let old = std::mem::take(&mut self.quant.overrides);
        self.quant.overrides = old
            .into_iter()
            .filter_map(|(k, v)| {
                let renamed = rename(&format!("{k}.weight"))?;
                Some((renamed.strip_suffix(".weight").unwrap_or(&renamed).to_string(), v))
            })
            .collect();
    }

    pub fn take(&mut self, name: &str) -> Result<Array> {
        self.tensors
            .remove(name)
            .ok_or_else(|| ModelError::MissingTensor { path: self.source.clone(), name: name.to_string() })
    }

    /// A floating-point tensor of exactly `shape`, in the compute dtype.
    pub fn take_float(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self.take(name)?;
        self.check_shape(name, &array, shape)?;
        self.to_compute(name, array)
    }

    /// A floating-point tensor of exactly `shape` in the dtype it is stored in (where the
    /// reference computes in that dtype before casting, as Mamba-2's `exp(A_log)`).
    pub fn take_stored(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self.take(name)?;
        self.check_shape(name, &array, shape)?;
        self.to_compute(name, array.clone())?;
        Ok(array)
    }

    /// A floating-point tensor of exactly `shape` in f32, from the precision it is stored in:
    /// what the references keep out of the compute dtype (decay rates, routing biases).
    pub fn take_f32(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = self.take(name)?;
        self.check_shape(name, &array, shape)?;
        self.to_compute(name, array.clone())?;
        Ok(array.as_dtype(Dtype::Float32)?)
    }

    fn check_shape(&self, name: &str, array: &Array, expected: &[i32]) -> Result<()> {
        if array.shape() != expected {
            return Err(ModelError::Shape {
                path: self.source.clone(),
                name: name.to_string(),
                expected: expected.to_vec(),
                got: array.shape().to_vec(),
            });
        }
        Ok(())
    }

    fn to_compute(&self, name: &str, array: Array) -> Result<Array> {
        match array.dtype() {
            Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float64 => {
                if array.dtype() == self.dtype {
                    Ok(array)
                } else {
                    Ok(array.as_dtype(self.dtype)?)
                }
            }
            other => Err(ModelError::Weights {
                path: self.source.clone(),
                message: format!("tensor {name:?} has dtype {other:?}, expected a floating-point type"),
            }),
        }
    }

    pub fn norm(&mut self, prefix: &str, dim: i32, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: self.take_float(&format!("{prefix}.weight"), &[dim])?, eps })
    }

    /// The LayerNorm at `prefix` over `dim` features (with a bias unless `bias` is false).
    pub fn layer_norm(&mut self, prefix: &str, dim: i32, eps: f32, bias: bool) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.take_float(&format!("{prefix}.weight"), &[dim])?,
            bias: if bias { Some(self.take_float(&format!("{prefix}.bias"), &[dim])?) } else { None },
            eps,
        })
    }

    /// The linear layer at `prefix` mapping `inputs` to `outputs` features.
    pub fn linear(&mut self, prefix: &str, outputs: i32, inputs: i32, bias: bool) -> Result<Linear> {
        let bias = if bias { Some(self.take_float(&format!("{prefix}.bias"), &[outputs])?) } else { None };
        match self.quantized_parts(prefix, outputs, inputs)? {
            Some((weight, scales, biases, quant)) if self.expand_quantized => {
                Ok(Linear::Dense { weight: dequantize(&weight, &scales, &biases, quant, self.dtype)?, bias })
            }
            Some((weight, scales, biases, quant)) => Ok(Linear::Quantized { weight, scales, biases, bias, quant }),
            None => {
                Ok(Linear::Dense { weight: self.take_float(&format!("{prefix}.weight"), &[outputs, inputs])?, bias })
            }
        }
    }

    pub fn embedding(&mut self, prefix: &str, vocab: i32, hidden: i32) -> Result<Embedding> {
        match self.quantized_parts(prefix, vocab, hidden)? {
            Some((weight, scales, biases, quant)) if self.expand_quantized => {
                Ok(Embedding::Dense { weight: dequantize(&weight, &scales, &biases, quant, self.dtype)? })
            }
            Some((weight, scales, biases, quant)) => Ok(Embedding::Quantized { weight, scales, biases, quant }),
            None => Ok(Embedding::Dense { weight: self.take_float(&format!("{prefix}.weight"), &[vocab, hidden])? }),
        }
    }

    /// Every expert's `[outputs, inputs]` matrix at `prefix`, stacked `[experts, outputs, inputs]`
    /// (with a `[experts, outputs]` bias when `bias`).
    pub fn switch_linear(
        &mut self,
        prefix: &str,
        experts: i32,
        outputs: i32,
        inputs: i32,
        bias: bool,
    ) -> Result<SwitchLinear> {
        let bias = if bias { Some(self.take_float(&format!("{prefix}.bias"), &[experts, outputs])?) } else { None };
        let matrix = match self.quantized_parts_stacked(prefix, &[experts], outputs, inputs)? {
            Some((weight, scales, biases, quant)) if self.expand_quantized => {
                SwitchMatrix::Dense { weight: dequantize(&weight, &scales, &biases, quant, self.dtype)? }
            }
            Some((weight, scales, biases, quant)) => SwitchMatrix::Quantized { weight, scales, biases, quant },
            None => SwitchMatrix::Dense {
                weight: self.take_float(&format!("{prefix}.weight"), &[experts, outputs, inputs])?,
            },
        };
        Ok(SwitchLinear { matrix, bias })
    }

    /// Hugging Face checkpoints keep each expert apart (`{block}.experts.N.gate_proj`, ...);
    /// stacks them into `{block}.switch_mlp.*` as MLX checkpoints store them. A no-op for
    /// checkpoints already stacked.
    pub fn stack_experts(&mut self, block: &str, experts: usize) -> Result<()> {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            for part in ["weight", "scales", "biases"] {
                let first = format!("{block}.experts.0.{proj}.{part}");
                if !self.contains(&first) {
                    continue;
                }
                let parts = (0..experts)
                    .map(|e| self.take(&format!("{block}.experts.{e}.{proj}.{part}")))
                    .collect::<Result<Vec<_>>>()?;
                let stacked = mlx_rs::ops::stack(&parts, 0)?;
                self.insert(format!("{block}.switch_mlp.{proj}.{part}"), stacked);
            }
        }
        Ok(())
    }

    /// `(weight, scales, biases, spec)` when `prefix` is stored quantized, checked against
    /// an `[outputs, inputs]` matrix.
    fn quantized_parts(&mut self, prefix: &str, outputs: i32, inputs: i32) -> Result<Option<Packed>> {
        self.quantized_parts_stacked(prefix, &[], outputs, inputs)
    }

    /// [`Self::quantized_parts`] of `lead`-shaped stacks of such matrices.
    fn quantized_parts_stacked(
        &mut self,
        prefix: &str,
        lead: &[i32],
        outputs: i32,
        inputs: i32,
    ) -> Result<Option<Packed>> {
        let scales_name = format!("{prefix}.scales");
        if !self.contains(&scales_name) {
            return Ok(None);
        }
        let weight_name = format!("{prefix}.weight");
        let weight = self.take(&weight_name)?;
        let scales = self.take(&scales_name)?;
        let spec = self.quant_spec(prefix, &weight, &scales, inputs)?;
        let affine = spec.mode == QuantMode::Affine;
        let biases_name = format!("{prefix}.biases");
        let biases = match (affine, self.remove(&biases_name)) {
            (true, Some(b)) => Some(b),
            (true, None) => return Err(self.quant_error(prefix, "no `biases`, which the affine mode needs")),
            (false, Some(_)) => {
                return Err(self.quant_error(prefix, format!("`biases` in {:?} mode, which has none", spec.mode)))
            }
            (false, None) => None,
        };
        if weight.dtype() != Dtype::Uint32 {
            return Err(
                self.quant_error(prefix, format!("packed weight has dtype {:?}, expected uint32", weight.dtype()))
            );
        }
        if !spec.is_supported() {
            return Err(self.quant_error(
                prefix,
                format!("{:?} mode with {} bits, group size {}", spec.mode, spec.bits, spec.group_size),
            ));
        }
        if inputs % spec.group_size != 0 {
            return Err(
                self.quant_error(prefix, format!("{inputs} inputs do not divide into groups of {}", spec.group_size))
            );
        }
        let shape = |last: i32| -> Vec<i32> { lead.iter().copied().chain([outputs, last]).collect() };
        self.check_shape(&weight_name, &weight, &shape(inputs * spec.bits / 32))?;
        let groups = shape(inputs / spec.group_size);
        self.check_shape(&scales_name, &scales, &groups)?;
        let (scales, biases) = match biases {
            Some(biases) => {
                self.check_shape(&biases_name, &biases, &groups)?;
                (self.to_compute(&scales_name, scales)?, Some(self.to_compute(&biases_name, biases)?))
            }
            // The float modes' scales are 8-bit floats stored as uint8: kept as they are.
            None if scales.dtype() == Dtype::Uint8 => (scales, None),
            None => {
                return Err(self.quant_error(
                    prefix,
                    format!("{:?} scales have dtype {:?}, expected uint8", spec.mode, scales.dtype()),
                ))
            }
        };
        Ok(Some((weight, scales, biases, spec)))
    }

    /// How `prefix` is packed: as the config names it for that module, else read from the
    /// tensors' shapes and scale dtype (as mlx-lm does, so mixed-precision exports that list
    /// only some modules load).
    fn quant_spec(&self, prefix: &str, weight: &Array, scales: &Array, inputs: i32) -> Result<QuantSpec> {
        if let Some(spec) = self.quant.overrides.get(prefix) {
            return Ok(*spec);
        }
        if self.quant.default.is_none() && self.quant.infer_bits_with_group.is_none() {
            return Err(self.quant_error(prefix, "quantized tensors but no \"quantization\" in config.json"));
        }
        let (packed, groups) = (weight.dim(-1), scales.dim(-1));
        if inputs <= 0 || groups <= 0 || inputs % groups != 0 || (packed * 32) % inputs != 0 {
            return Err(self.quant_error(
                prefix,
                format!("packed shape {:?} and scales {:?} do not fit {inputs} inputs", weight.shape(), scales.shape()),
            ));
        }
        let (group_size, bits) = (inputs / groups, packed * 32 / inputs);
        if let Some(group) = self.quant.infer_bits_with_group {
            return Ok(QuantSpec::affine(group, bits));
        }
        if scales.dtype() != Dtype::Uint8 {
            return Ok(QuantSpec::affine(group_size, bits));
        }
        let mode = match (bits, group_size) {
            (4, 16) => QuantMode::Nvfp4,
            (4, 32) => QuantMode::Mxfp4,
            (8, 32) => QuantMode::Mxfp8,
            _ => {
                return Err(
                    self.quant_error(prefix, format!("uint8 scales with {bits} bits and group size {group_size}"))
                )
            }
        };
        Ok(QuantSpec { group_size, bits, mode })
    }

    fn quant_error(&self, prefix: &str, message: impl Into<String>) -> ModelError {
        ModelError::Quantization { path: self.source.clone(), name: prefix.to_string(), message: message.into() }
    }
}

/// A packed matrix: `(weight, scales, biases, spec)`.
type Packed = (Array, Array, Option<Array>, QuantSpec);

/// The dense matrix a packed one stands for, in `dtype`.
fn dequantize(weight: &Array, scales: &Array, biases: &Option<Array>, quant: QuantSpec, dtype: Dtype) -> Result<Array> {
    let dense = quant_ops::dequantize(weight, scales, biases.as_ref(), quant)?;
    Ok(if dense.dtype() == dtype { dense } else { dense.as_dtype(dtype)? })
}
