//! The seed's own prompt-cache files (mlx-bun's persistence, magic `MLXBUNKV2\n`, format version 3
//! as its `CACHE_CODECS` "mlx-cache-v3" write it) for the MLA kinds `mla`, `mla-dsa` and
//! `mtp-mla`, so a prompt cache written by the seed's implementation for GLM-5.2 loads here and
//! ours loads there.
//!
//! Layout: the magic, a u32 header length, a u32 data start and a u64 `Bun.hash` (wyhash) of the
//! JSON header, all little-endian; the JSON header at byte 26; zeros up to the data start (a
//! multiple of 16 KiB); each tensor at the data start plus its `off` (16 KiB-aligned), float32
//! `[B, offset, width]` row-major, hashed in the header as 16 hex digits. mlx-bun keeps one offset
//! per layer and no padding, so only caches whose rows all hold the same positions are written;
//! its float32-only caches mean only float32 storage is written.
//!
//! Format version 5 (`blocks.rs`): the file is a manifest, the same frame and header with no
//! tensor bytes after it, each tensor listing blocks of its bytes held in files named by their
//! SHA-256 in a `blocks` folder beside it; saved by `save_blocks`, read by `load`.
//!
//! Files: `write.rs` (saving, the header written in mlx-bun's key order), `header.rs` (the
//! prefix and JSON header read and verified, the info), `read.rs` (every cache entry checked,
//! tensors read and verified, caches built), `blocks.rs` (version 5's block files).
mod blocks;
mod header;
mod read;
mod write;

use crate::core::model::geometry::{Family, Geometry, Role};

pub use blocks::{DEFAULT_BLOCK_BYTES, MAX_BLOCK_BYTES};
pub use header::read_info;
pub use read::{load, load_from_bytes};
pub use write::{save, save_blocks, save_to_bytes};

const MAGIC: &[u8; 10] = b"MLXBUNKV2\n";
const PREFIX_LEN: u64 = 26;
const ALIGN: u64 = 16384;
const CODEC_PROVIDER: &str = "mlx-cache-v3";
/// mlx-c's `MLX_FLOAT32`, as mlx-bun records a tensor's dtype.
const FLOAT32: u64 = 10;
/// `Number.MAX_SAFE_INTEGER`: mlx-bun's `maxTokens` of a cache without a limit (our 0).
const NO_LIMIT: u64 = 9_007_199_254_740_991;
/// Headers beyond this are refused before they are read (a damaged length field).
const MAX_HEADER: u64 = 1 << 30;
const MAX_LAYERS: usize = 4096;

/// What a file says besides the caches: the token prefix the state encodes, and the identity
/// strings mlx-bun's server checks before it reuses a file (left out when `None`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MlxbunInfo {
    pub tokens: Vec<u32>,
    pub model_id: Option<String>,
    pub config_fingerprint: Option<String>,
    pub tokenizer_hash: Option<String>,
    /// The adapter namespace; mlx-bun's SSD tier expects the key, `""` for the base model.
    pub ns: Option<String>,
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

fn kind(g: &Geometry) -> &'static str {
    match (g.role, g.index_head_dim) {
        (Role::Mtp, _) => "mtp-mla",
        (_, 0) => "mla",
        _ => "mla-dsa",
    }
}

fn families(g: &Geometry) -> Vec<(Family, usize)> {
    let mut f = vec![(Family::Latent, g.kv_lora_rank), (Family::Rope, g.rope_head_dim)];
    if g.index_head_dim > 0 {
        f.push((Family::IndexKeys, g.index_head_dim));
    }
    f
}
