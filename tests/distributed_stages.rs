//! GLM-5.2's 78-layer schedule (and its MTP layer) split into two pipeline stages on two
//! processes over MLX's ring backend, at a small width, where the split cuts between an indexer
//! layer and the layers that reuse its selection: stage 0 holds layers 0-3, stage 1 layers
//! 4-77 and the MTP layer, and layer 2's top-k selection (`[1, 1, k]` int32 a step) crosses to
//! stage 1 for layers 4 and 5 (`glm52_crossing(4)`). A 40-position prefill, then 6 decode steps;
//! every layer's attention output at every step equals, bit for bit, that of one process running
//! every layer (float32). The ranks are this test binary run again (`stage_rank`, ignored unless a
//! parent names it); the parent kills them after two minutes.
#[path = "common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::mlx_helpers::{array, host};
use common::model::Rng;
use common::ranks::run_ranks;

use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::distributed::Group;
use latent_cache::core::model::presets::{glm52_crossing, glm52_selection_source, glm52_selects, GLM52_TARGET_LAYERS};
use latent_cache::{Geometry, LatentCache, Role};
use mlx_rs::{Array, Dtype};

const PREFILL: usize = 40;
const STEPS: usize = 6;
const K: usize = 16;
const HEADS: usize = 2;
const SPLIT: usize = 4;
const W: [usize; 3] = [32, 8, 16];

fn geometry(l: usize) -> Geometry {
    let mtp = l == GLM52_TARGET_LAYERS;
    let index = if !mtp && glm52_selects(l) { W[2] } else { 0 };
    let role = if mtp { Role::Mtp } else { Role::Target };
    Geometry { kv_lora_rank: W[0], rope_head_dim: W[1], index_head_dim: index, role, ..Geometry::default() }
}

fn random(seed: u64, shape: &[usize]) -> Array {
    array(&Rng::new(seed).uniform(shape.iter().product(), 1.0), shape)
}

fn append(cache: &mut LatentCache, l: usize, pos: usize, n: usize) {
    let seed = (l as u64) << 32 | pos as u64;
    let keys = glm52_selects(l).then(|| random(seed ^ 3, &[1, n, W[2]]));
    cache.append(&random(seed ^ 1, &[1, n, W[0]]), &random(seed ^ 2, &[1, n, W[1]]), keys.as_ref()).unwrap();
}

/// Runs layers `layers` (the MTP layer is `GLM52_TARGET_LAYERS`) through the prefill and the
/// decode steps; `recv` gives the selection of a layer on an earlier stage for a step, `send`
/// takes the selections a later stage needs. Returns every layer's outputs, step by step.
fn run(
    layers: &[usize],
    recv: &mut dyn FnMut(usize, usize) -> Array,
    send: &mut dyn FnMut(usize, usize, &Array),
    sent: &[usize],
) -> Vec<f32> {
    let mut caches: Vec<LatentCache> = layers.iter().map(|&l| LatentCache::new(geometry(l)).unwrap()).collect();
    for (cache, &l) in caches.iter_mut().zip(layers) {
        append(cache, l, 0, PREFILL);
    }
    let mut out = Vec::new();
    for step in 0..STEPS {
        let mut selections: HashMap<usize, Array> = HashMap::new();
        for (cache, &l) in caches.iter_mut().zip(layers) {
            append(cache, l, PREFILL + step, 1);
            let donor = cache.capture_donor_rows().unwrap();
            let seed = (l as u64) << 40 | (step as u64) << 8;
            let (ql, qr) = (random(seed ^ 1, &[1, HEADS, 1, W[0]]), random(seed ^ 2, &[1, HEADS, 1, W[1]]));
            let scale = 0.125;
            let output = if l == GLM52_TARGET_LAYERS {
                donor.attend(&ql, &qr, scale, MaskMode::None, None).unwrap()
            } else {
                if glm52_selects(l) {
                    let (qi, weights) = (random(seed ^ 3, &[1, HEADS, 1, W[2]]), random(seed ^ 4, &[1, 1, HEADS]));
                    let top = donor.index_select(&qi, &weights, MaskMode::None, K).unwrap().expect("more than k positions");
                    selections.insert(l, top);
                }
                let source = glm52_selection_source(l);
                let selection = selections.entry(source).or_insert_with(|| recv(source, step));
                donor.attend_selected(&ql, &qr, scale, MaskMode::None, selection).unwrap()
            };
            out.extend(host(&output));
        }
        for &l in sent {
            send(l, step, &selections[&l]);
        }
    }
    out
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

/// Run by the parent below only: one stage, its outputs written to the ranks' shared folder.
#[test]
#[ignore]
fn stage_rank() {
    let Ok(dir) = std::env::var("LC_RANK_DIR") else {
        return;
    };
    let group = Group::init("ring", true).unwrap();
    let crossing = glm52_crossing(SPLIT).expect("the split cuts a selection");
    let outputs = if group.rank() == 0 {
        let layers: Vec<usize> = (0..SPLIT).collect();
        run(
            &layers,
            &mut |_, _| unreachable!("stage 0 makes every selection"),
            &mut |_, _, sel| group.send(sel, 1).unwrap(),
            &[crossing],
        )
    } else {
        let layers: Vec<usize> = (SPLIT..=GLM52_TARGET_LAYERS).collect();
        let mut recv = |source: usize, _step: usize| {
            assert_eq!(source, crossing, "only layer {crossing}'s selection crosses");
            group.recv(&[1, 1, K], Dtype::Int32, 0).unwrap()
        };
        run(&layers, &mut recv, &mut |_, _, _| unreachable!("the last stage sends nothing"), &[])
    };
    std::fs::write(Path::new(&dir).join(format!("stage-{}.bin", group.rank())), bytes(&outputs)).unwrap();
}

#[test]
fn two_stages_with_a_selection_crossing_the_split_match_one_process() {
    run_ranks("stage_rank", |codes, dir| {
        assert_eq!(codes, [Some(true), Some(true)], "both stages finished within two minutes");
        compare(&[dir.join("stage-0.bin"), dir.join("stage-1.bin")]);
    });
}

/// The stages' outputs, step by step, against one process running every layer.
fn compare(outs: &[PathBuf]) {
    // One process, every layer.
    let all: Vec<usize> = (0..=GLM52_TARGET_LAYERS).collect();
    let whole = run(&all, &mut |_, _| unreachable!(), &mut |_, _, _| unreachable!(), &[]);
    let per_layer = HEADS * W[0];
    let (stage0, stage1) = (std::fs::read(&outs[0]).unwrap(), std::fs::read(&outs[1]).unwrap());
    let mut joined = Vec::new();
    for step in 0..STEPS {
        let (a, b) = (SPLIT * per_layer * 4, (GLM52_TARGET_LAYERS + 1 - SPLIT) * per_layer * 4);
        joined.extend_from_slice(&stage0[step * a..(step + 1) * a]);
        joined.extend_from_slice(&stage1[step * b..(step + 1) * b]);
    }
    assert_eq!(joined.len(), whole.len() * 4);
    assert!(joined == bytes(&whole), "the stages' outputs equal one process's, bit for bit");
}
