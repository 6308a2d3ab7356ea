//! The read path against mlx-lm 0.32.2's own GLM-5 attention (deepseek_v32's
//! DeepseekV32Attention and Indexer, which glm_moe_dsa.Model uses): tests/interop/mlx_lm_attention.py
//! runs it with small random weights and its own cache (a prefill of 12, then one decode step,
//! batch 2) and saves the cache it filled, the queries it formed (its absorbed q_latent, q_rope,
//! the indexer's queries and weights), its index scores, selections and attention outputs. Here
//! the same latent, rope and index keys go into a LatentCache and the donor recomputes them:
//! `attend` (dense), `index_scores`, `select` (same index sets, ties aside) and `attend_selected`
//! (sparse), with the causal mask at prefill and none at decode, in both row layouts. Needs
//! Python with mlx and mlx-lm at `LATENT_CACHE_MLX_LM_PYTHONPATH`.
use crate::common::mlx_helpers::host;
use std::collections::{BTreeSet, HashMap};

use latent_cache::core::attention::{Donor, MaskMode};

use latent_cache::core::mlx::math;
use latent_cache::core::mlx::ops;
use latent_cache::{Geometry, LatentCache, LayoutKind};
use mlx_rs::Array;

const TOPK: usize = 6;

/// Elementwise within `tol * (1 + |want|)`; -inf only where mlx-lm has -inf. Prints the
/// largest difference (`--nocapture` shows it).
fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() { g == w } else { (g - w).abs() <= tol * (1.0 + w.abs()) };
        assert!(ok, "{what}: element {i}: ours {g} vs mlx-lm {w}");
        worst = if w.is_infinite() { worst } else { worst.max((g - w).abs()) };
    }
    eprintln!("{what}: {} values, largest difference {worst:.2e}", got.len());
}

/// `[B, 1, T, w]` positions `from..to` of an mlx-lm cache array as `[B, N, w]`, the append shape.
fn positions(a: &Array, from: usize, to: usize) -> Array {
    let s: Vec<usize> = a.shape().iter().map(|&d| d as usize).collect();
    let part = ops::slice(a, &[0, 0, from, 0], &[s[0], 1, to, s[3]]).unwrap();
    ops::reshape(&part, &[s[0], to - from, s[3]]).unwrap()
}

/// The selected positions each query sees (finite mlx-lm score), ours against mlx-lm's: equal
/// sets, except positions tied with mlx-lm's k-th score.
fn same_selection(what: &str, ours: &[f32], theirs: &[f32], scores: &[f32], tol: f32) {
    let t = scores.len() * TOPK / ours.len();
    for q in 0..ours.len() / TOPK {
        let row = &scores[q * t..][..t];
        let visible =
            |sel: &[f32]| -> BTreeSet<usize> { sel.iter().map(|&p| p as usize).filter(|&p| row[p].is_finite()).collect() };
        let (a, b) = (visible(&ours[q * TOPK..][..TOPK]), visible(&theirs[q * TOPK..][..TOPK]));
        assert_eq!(a.len(), b.len(), "{what} query {q}: {a:?} vs mlx-lm {b:?}");
        let kth = b.iter().map(|&p| row[p]).fold(f32::INFINITY, f32::min);
        for p in a.symmetric_difference(&b) {
            assert!((row[*p] - kth).abs() <= tol * (1.0 + kth.abs()), "{what} query {q}: {a:?} vs mlx-lm {b:?} (not a tie)");
        }
    }
}

/// Checks one step (`p`: prefill, causal; `d`: decode) of both runs against the donor.
fn check_step(donor: &Donor, f: &HashMap<String, Array>, step: &str, tol: f32) {
    let get = |key: &str| f.get(key).unwrap_or_else(|| panic!("{key} missing from mlx-lm's file"));
    let mode = if step == "p" { MaskMode::Causal } else { MaskMode::None };
    // mlx-lm attends in value-head space at prefill: its output is ours through its unembed_out.
    let unembed = math::swapaxes(get("unembed_out"), -1, -2).unwrap();
    let finish = |out: Array| if step == "p" { math::matmul(&out, &unembed).unwrap() } else { out };
    for run in ["dense", "sparse"] {
        let key = |name: &str| format!("{run}.{step}.{name}");
        let (q_latent, q_rope) = (get(&key("q_latent")), get(&key("q_rope")));
        let scale = host(get(&key("scale")))[0];
        let what = format!("{run} {}", if step == "p" { "prefill" } else { "decode" });
        let out = if run == "dense" {
            donor.attend(q_latent, q_rope, scale, mode, None).unwrap()
        } else {
            let scores = donor.index_scores(get(&key("q_index")), get(&key("index_weights")), mode).unwrap();
            let theirs = host(get(&key("index_scores")));
            close(&format!("{what} index scores"), &host(&scores), &theirs, tol);
            let indices = donor.select(&scores, TOPK).unwrap().expect("more positions than top-k");
            let queries = q_latent.shape()[2] as usize;
            let (ours, mlx_lm) = (host(&indices), host(get(&key("selected"))));
            for b in 0..donor.batch_size() {
                let per = |v: &[f32], w: usize| v[b * queries * w..][..queries * w].to_vec();
                let what = format!("{what} row {b}");
                same_selection(&what, &per(&ours, TOPK), &per(&mlx_lm, TOPK), &per(&theirs, donor.offset()), tol);
            }
            donor.attend_selected(q_latent, q_rope, scale, mode, &indices).unwrap()
        };
        close(&format!("{what} attention"), &host(&finish(out)), &host(get(&key("out"))), tol);
    }
}

#[test]
#[ignore = "needs mlx-lm: run with LATENT_CACHE_MLX_LM_PYTHONPATH pointing at mlx and mlx-lm 0.32.2"]
fn attention_and_selection_match_mlx_lm_glm5_attention() {
    let pythonpath = std::env::var("LATENT_CACHE_MLX_LM_PYTHONPATH").expect("LATENT_CACHE_MLX_LM_PYTHONPATH");
    let dir = std::env::temp_dir().join(format!("latent-cache-attention-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mlx-lm-attention.safetensors");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mlx_lm_attention.py");
    let out =
        std::process::Command::new("python3").arg(script).arg(&file).env("PYTHONPATH", pythonpath).output().expect("python3");
    assert!(out.status.success(), "mlx-lm's side failed: {}", String::from_utf8_lossy(&out.stderr));
    let f = Array::load_safetensors(&file).unwrap();
    // Loaded lazily on this thread's own stream: evaluate here, as an engine evaluates its own
    // arrays, before handing them to the library (which evaluates on a thread of its own).
    mlx_rs::transforms::eval(f.values()).unwrap();
    // MLX's CUDA backend runs float32 matmuls at TF32 precision (10-bit mantissas).
    let tol = match mlx_rs::Device::default().get_type().unwrap() {
        mlx_rs::DeviceType::Gpu => 1e-2,
        _ => 1e-4,
    };
    let (latent, rope, keys) = (&f["latent"], &f["rope"], &f["index_keys"]);
    let width = |a: &Array| a.shape()[3] as usize;
    let (prefill, total) = (f["dense.p.q_latent"].shape()[2] as usize, latent.shape()[2] as usize);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = Geometry {
            kv_lora_rank: width(latent),
            rope_head_dim: width(rope),
            index_head_dim: width(keys),
            layout,
            ..Geometry::default()
        };
        let mut cache = LatentCache::new(g).unwrap();
        let mut append = |from, to| {
            let k = positions(keys, from, to);
            cache.append(&positions(latent, from, to), &positions(rope, from, to), Some(&k)).unwrap();
            cache.capture_donor_rows().unwrap()
        };
        let after_prefill = append(0, prefill);
        let after_decode = append(prefill, total);
        check_step(&after_prefill, &f, "p", tol);
        check_step(&after_decode, &f, "d", tol);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
