//! The checksums of a saved safetensors file, which has none of its own: each tensor's and the
//! metadata's (FNV-1a 64 over its entries in key order). A tensor's is FNV-1a's multiply-xor
//! (with an xor-shift) over its row-major bytes, after its dtype and shape, read where the
//! evaluated array holds them (`tensor_bytes`), in runs of any length. Format version 1 runs one
//! chain over 8-byte words; version 2 runs four chains over 32-byte blocks (word `i` of a block on
//! chain `i`) and folds them, so the hash is not one multiply's latency per word: a save hashes
//! every byte.
use mlx_rs::Array;

use crate::core::error::Result;
use crate::core::mlx::eval::eval;
use crate::core::mlx::ops;
use crate::core::persist::metadata::PREFIX;
use crate::core::persist::tensor_bytes;

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

fn word(hash: u64, w: u64) -> u64 {
    let h = (hash ^ w).wrapping_mul(PRIME);
    h ^ (h >> 29)
}

fn byte(hash: u64, b: u8) -> u64 {
    (hash ^ b as u64).wrapping_mul(PRIME)
}

fn le(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// A checksum computed over runs of bytes as they stream past (a save hashes each run as it
/// writes it, while the bytes are still in the cache); `checksum` is the same over an array.
pub struct Hasher {
    lanes: usize,
    hash: [u64; 4],
    /// A block split between runs waits here.
    pending: [u8; 32],
    held: usize,
}

impl Hasher {
    /// A hasher for a tensor of `dtype` under `shape`, as format `version` (1 or 2) computes it.
    pub fn new(dtype: mlx_rs::Dtype, shape: &[i32], version: u32) -> Hasher {
        let mut hash = [OFFSET; 4];
        for &b in format!("{dtype:?}{shape:?}").as_bytes() {
            hash[0] = byte(hash[0], b);
        }
        Hasher { lanes: if version >= 2 { 4 } else { 1 }, hash, pending: [0; 32], held: 0 }
    }

    fn blocks(&mut self, data: &[u8]) {
        let (lanes, block) = (self.lanes, 8 * self.lanes);
        for chunk in data.chunks_exact(block) {
            for (lane, h) in self.hash.iter_mut().take(lanes).enumerate() {
                *h = word(*h, le(chunk, 8 * lane));
            }
        }
    }

    /// The next run of the tensor's row-major bytes.
    pub fn update(&mut self, mut run: &[u8]) {
        let block = 8 * self.lanes;
        if self.held > 0 {
            let take = (block - self.held).min(run.len());
            self.pending[self.held..self.held + take].copy_from_slice(&run[..take]);
            self.held += take;
            run = &run[take..];
            if self.held < block {
                return;
            }
            let pending = self.pending;
            self.blocks(&pending[..block]);
            self.held = 0;
        }
        let whole = run.len() / block * block;
        self.blocks(&run[..whole]);
        self.pending[..run.len() - whole].copy_from_slice(&run[whole..]);
        self.held = run.len() - whole;
    }

    /// The checksum: 16 hex digits.
    pub fn finish(self) -> String {
        // Fold the lanes, then the tail: whole words on the folded chain, then bytes.
        let mut h = self.hash[0];
        for &lane in &self.hash[1..self.lanes] {
            h = word(h, lane);
        }
        let tail = &self.pending[..self.held];
        let words = tail.len() / 8 * 8;
        for at in (0..words).step_by(8) {
            h = word(h, le(tail, at));
        }
        for &b in &tail[words..] {
            h = byte(h, b);
        }
        format!("{h:016x}")
    }
}

/// The checksum of an evaluated array (innermost axis contiguous) under `shape`, as `version`
/// (1 or 2) of the saved format computes it: 16 hex digits.
pub fn checksum(a: &Array, shape: &[i32], version: u32) -> Result<String> {
    let mut hasher = Hasher::new(a.dtype(), shape, version);
    tensor_bytes::for_each_run(a, |run| {
        hasher.update(run);
        Ok(())
    })?;
    Ok(hasher.finish())
}

/// A tensor's checksum as format `version` computes it (`checksum.rs`), evaluated and laid out
/// along its innermost axis first where it is not.
pub fn evaluated(a: &Array, shape: &[i32], version: u32) -> Result<String> {
    eval([a])?;
    if tensor_bytes::inner_contiguous(a) {
        return checksum(a, shape, version);
    }
    let laid_out = ops::contiguous(a)?;
    eval([&laid_out])?;
    checksum(&laid_out, shape, version)
}

/// FNV-1a 64 over every metadata entry but `meta_sum` itself, in key order.
pub fn metadata_checksum<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut entries: Vec<(&str, &str)> = entries.filter(|(k, _)| *k != format!("{PREFIX}meta_sum")).collect();
    entries.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in entries {
        for &b in k.as_bytes().iter().chain([0u8].iter()).chain(v.as_bytes()).chain([0u8].iter()) {
            hash ^= b as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}
