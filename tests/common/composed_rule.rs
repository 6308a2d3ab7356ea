//! Composed storage's documented rule, as the tests compute it without the library: a row's
//! boundary from its settled length, and the layers the composed tests build.
#![allow(dead_code)]

use latent_cache::{Geometry, LayoutKind, StorageMode};

/// Positions a boundary moves by.
pub const BLOCK: usize = 64;

/// The documented boundary of a row whose settled length is `len`.
pub fn boundary(len: usize, hot_window: usize) -> usize {
    len.saturating_sub(hot_window) / BLOCK * BLOCK
}

/// A DSA layer (rope 64, index keys 128) with a `latent`-wide latent, composed as given.
pub fn composed_layer(
    latent: usize,
    hot_window: usize,
    hot: StorageMode,
    modes: [StorageMode; 3],
    layout: LayoutKind,
) -> Geometry {
    Geometry {
        kv_lora_rank: latent,
        rope_head_dim: 64,
        index_head_dim: 128,
        latent_storage: modes[0],
        rope_storage: modes[1],
        index_storage: modes[2],
        layout,
        hot_window,
        hot_storage: hot,
        ..Geometry::default()
    }
}
