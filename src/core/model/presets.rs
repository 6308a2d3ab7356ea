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

/// The layers at which a pipeline stage of GLM-5.2 may begin with every selection its layers
/// attend with made on the stage itself: layer 0 and every layer that runs the indexer (a stage
/// beginning at a layer without one needs the selection of an indexer layer on the stage
/// before it).
pub fn glm52_local_starts() -> Vec<usize> {
    (0..GLM52_TARGET_LAYERS).filter(|&l| glm52_selects(l)).collect()
}

/// The first layer of each of `stages` pipeline stages of GLM-5.2 (stage `s` holds the target
/// layers from `starts[s]` to the next start, the last stage also the MTP layer), as even as
/// starts that keep every selection local allow (`glm52_local_starts`): each boundary at the
/// local start nearest an even split. `None` for 0 stages or more than there are local starts.
pub fn glm52_stage_starts(stages: usize) -> Option<Vec<usize>> {
    let local = glm52_local_starts();
    if stages == 0 || stages > local.len() {
        return None;
    }
    let mut starts = vec![0];
    for s in 1..stages {
        let target = (s * GLM52_TARGET_LAYERS + stages / 2) / stages;
        // Candidates after the previous start that leave a local start for each later stage.
        let after = local.iter().position(|&l| l > *starts.last().expect("one start"))?;
        let usable = &local[after..=local.len() - (stages - s)];
        let best = usable.iter().min_by_key(|&&l| l.abs_diff(target))?;
        starts.push(*best);
    }
    Some(starts)
}

/// For a stage of GLM-5.2 beginning at target layer `start`, the layer on an earlier stage whose
/// selection (`[B, Lq, k]` int32 a step) its first layers attend with; `None` where the stage
/// makes its own (`start` runs the indexer).
pub fn glm52_crossing(start: usize) -> Option<usize> {
    (start < GLM52_TARGET_LAYERS && !glm52_selects(start)).then(|| glm52_selection_source(start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_starts_keep_every_selection_local() {
        assert_eq!(glm52_local_starts().len(), 21);
        assert_eq!(glm52_stage_starts(1), Some(vec![0]));
        assert_eq!(glm52_stage_starts(2), Some(vec![0, 38]));
        for stages in 1..=21 {
            let starts = glm52_stage_starts(stages).unwrap();
            assert_eq!(starts.len(), stages);
            assert!(starts.windows(2).all(|w| w[0] < w[1]));
            assert!(starts.iter().all(|&s| glm52_crossing(s).is_none()), "{starts:?}");
        }
        assert_eq!(glm52_stage_starts(22), None);
        assert_eq!(glm52_crossing(4), Some(2));
        assert_eq!(glm52_crossing(40), Some(38));
        assert_eq!(glm52_crossing(6), None);
    }
}
