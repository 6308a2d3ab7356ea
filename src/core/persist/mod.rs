//! The `persist` room: a model's caches as files and bytes, in two formats, written whole or not
//! at all and checked whole before anything is made from them. It may import `error`, `layout`,
//! `mlx`, `model`, `storage` and `cache`; nothing below it imports it.
//!
//! | file | its job |
//! |---|---|
//! | `save.rs`, `load.rs` | the safetensors entry points: `save`, `save_to_bytes`, `load`, `load_from_bytes` |
//! | `mlx_lm.rs` | mlx-lm's own prompt-cache layout: float layers written as it writes them, its files imported |
//! | `metadata.rs` | our metadata's text: versions, keys, a layer's geometry, lists |
//! | `hot.rs` | a composed layer's hot side (format 3) |
//! | `contents.rs` | what a save writes (`Contents`) and a read tensor's extents as counts |
//! | `checksum.rs` | tensor and metadata checksums |
//! | `safetensors.rs`, `tensor_bytes.rs` | writing safetensors, streaming tensors' bytes where they lie |
//! | `mlx_read.rs` | reading safetensors through MLX, path and frame checked first |
//! | `segment/` | segments: a row's positions `[from, to)` saved apart, restored and extended as a chain |
//! | `mlxbun/` | the seed's `.mlxbun` files (mlx-bun's `MLXBUNKV2`), with `wyhash.rs`, Bun's hash, and `sha256.rs`, its block names |
//! | `file.rs` | the one atomic file writer both formats save through |
//! | `json.rs` | the one JSON string escaper both formats' headers use |
//!
//! The safetensors format:
//!
//! - Layers whose families are all float (f32, bf16, f16) are laid out as mlx-lm 0.32.2's
//!   `save_prompt_cache` lays out a GLM-5 prompt cache: layer `i` is a `CacheList(KVCache,
//!   KVCache)`, the latent `[B, 1, T, kv_lora_rank]` as the first cache's keys (`i.0.0.0`), the
//!   rope key as its values (`i.0.0.1`), the index keys as the second cache's keys (`i.1.0.0`,
//!   with zeros as values, as mlx-lm's indexer keeps them; an empty cache on a layer without
//!   index keys), offsets as scalars, and mlx-lm's class names and scalar table in the metadata.
//! - Layers with a quantized family store their parts under names of our own
//!   (`latent_cache.<i>.<family>.<part>`): no mlx-lm class holds them.
//! - Our metadata (in mlx-lm's user metadata, keys `0.latent_cache.*`): the format version, each
//!   layer's geometry, storage, layout, role, left pads and row ends, and a 64-bit checksum of
//!   every tensor (over dtype, shape and bytes) and of the metadata, since safetensors has none.
//! - Composed layers (format 3) add their composition, each row's boundary and where the hot
//!   values start, and the hot values of each composed family (`latent_cache.<i>.hot.<family>`).
//!
//! A load checks everything (version, geometry, every tensor's presence, dtype, shape and
//! checksum, the row layout) before it creates anything. A file mlx-lm wrote (no metadata of
//! ours) is imported: float storage in the file's dtype, rows right-justified, no padding.
pub mod checksum;
mod contents;
pub(crate) mod file;
mod hot;
mod json;
mod load;
mod metadata;
mod mlx_lm;
mod mlx_read;
pub mod mlxbun;
mod save;
mod streamed;
pub mod safetensors;
pub mod segment;
pub mod tensor_bytes;
pub mod wyhash;
pub(crate) mod sha256;

pub use load::{load, load_from_bytes};
pub use save::{save, save_to_bytes};
