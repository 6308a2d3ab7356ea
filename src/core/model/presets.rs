//! Model presets: the geometries of a whole model's layers, as this library knows them.
use crate::core::model::geometry::{Geometry, Role};

/// GLM-5.2's target layers.
pub const GLM52_TARGET_LAYERS: usize = 78;

/// Whether GLM-5.2's layer `l` runs its DSA indexer: the layers its config's `indexer_types`
/// calls "full", 0, 1 and 2 and then every fourth from 6 to 74 (21 of the 78). The others
/// ("shared") have no indexer, store no index keys, and reuse the selection of the nearest
/// indexer layer before them (as vLLM's IndexCache and oMLX's GLM-5 model thread it through).
pub fn glm52_selects(layer: usize) -> bool {
    layer < GLM52_TARGET_LAYERS && (layer < 3 || (layer >= 6 && (layer - 6) % 4 == 0))
}

/// The layer whose top-k selection GLM-5.2's target layer `l` attends with: `l` itself where it
/// runs the indexer, otherwise the nearest indexer layer before it.
pub fn glm52_selection_source(layer: usize) -> usize {
    (0..=layer).rev().find(|&l| glm52_selects(l)).unwrap_or(0)
}

/// GLM-5.2's layers as this library presets them: 78 target layers (kv_lora_rank 512, rope 64)
/// with index keys (128) on the 21 that run the indexer (`glm52_selects`), then the MTP layer
/// (no index keys).
pub fn glm52_layers() -> Vec<Geometry> {
    let layer =
        |index_head_dim, role| Geometry { kv_lora_rank: 512, rope_head_dim: 64, index_head_dim, role, ..Geometry::default() };
    let mut layers: Vec<Geometry> =
        (0..GLM52_TARGET_LAYERS).map(|l| layer(if glm52_selects(l) { 128 } else { 0 }, Role::Target)).collect();
    layers.push(layer(0, Role::Mtp));
    layers
}
