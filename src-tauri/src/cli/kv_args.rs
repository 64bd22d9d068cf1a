//! `--kv-bits`, `--kv-group-size`, `--kv-start`: how the keys and values of the model are
//! stored (the same flags for `serve`, `generate` and `bench`).

use clap::Args;

use crate::model::KvFormat;

#[derive(Args, Clone, Debug)]
pub struct KvArgs {
    /// Quantize the KV cache to 8 or 4 bits (as mlx-lm's --kv-bits): 8-bit keys and values take
    /// about half of bf16's memory with outputs barely changed, 4-bit a quarter. 0: off.
    #[arg(long, env = "FASTMLX_KV_BITS", default_value_t = 0)]
    pub kv_bits: i32,
    /// Elements of a head's vector per scale and bias (32, 64 or 128; it must divide the head
    /// size).
    #[arg(long, env = "FASTMLX_KV_GROUP_SIZE", default_value_t = crate::model::cache::DEFAULT_KV_GROUP_SIZE)]
    pub kv_group_size: i32,
    /// Keep a sequence's keys and values at full precision until it is this many tokens long
    /// (mlx-lm's --quantized-kv-start): short conversations stay exact, long ones take the
    /// memory saving.
    #[arg(long, env = "FASTMLX_KV_START", default_value_t = 0)]
    pub kv_start: i32,
}

impl KvArgs {
    /// The format these flags ask for, checked.
    pub fn format(&self) -> anyhow::Result<KvFormat> {
        KvFormat::from_settings(self.kv_bits, self.kv_group_size, self.kv_start).map_err(anyhow::Error::msg)
    }
}
