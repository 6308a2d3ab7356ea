//! Model presets: the geometries of a whole model's layers, as this library knows them.
use crate::core::model::geometry::{Geometry, Role};

/// GLM-5.2's layers as this library presets them: 78 target layers (kv_lora_rank 512, rope 64)
/// with index keys (128) on 21 of them, spread evenly (layer `l` has them when
/// `floor(l * 21 / 78) != floor((l + 1) * 21 / 78)`), then the MTP layer (no index keys).
/// A checkpoint that names other index-key layers sets `index_head_dim` per layer itself.
pub fn glm52_layers() -> Vec<Geometry> {
    const LAYERS: usize = 78;
    const DSA: usize = 21;
    let layer =
        |index_head_dim, role| Geometry { kv_lora_rank: 512, rope_head_dim: 64, index_head_dim, role, ..Geometry::default() };
    let mut layers: Vec<Geometry> =
        (0..LAYERS).map(|l| layer(if (l * DSA) / LAYERS != ((l + 1) * DSA) / LAYERS { 128 } else { 0 }, Role::Target)).collect();
    layers.push(layer(0, Role::Mtp));
    layers
}
