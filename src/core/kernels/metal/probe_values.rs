//! The values the Metal kernels' probes run on (`mla_decode_probe`, `dsa_scores`, `dsa_topk`): a
//! fixed xorshift stream, so that each probe is the same small problem in every process.

/// A fixed xorshift stream from a seed.
pub(super) struct Draws(u64);

impl Draws {
    pub(super) fn new(seed: u64) -> Self {
        Draws(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` values k / 64 for k in [-32, 32]: exact in float32, bfloat16 and float16.
    pub(super) fn exact(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| ((self.next() % 65) as f32 - 32.0) / 64.0).collect()
    }
}
