//! A prefill chunk's attention over selected positions: one row, many queries, each with a
//! selection of its own (GLM-5.2's chunked prefill under DSA), at GLM-5.2's widths and head
//! count, against the float64 reference over the values the row holds. The selections name
//! positions a query does not see (later ones, under the causal mask), which must be masked, and
//! a position past the window, which reads the last one. On CUDA the split-K kernel computes it
//! with each query a row of its own (each case checks that it ran), in each of its forms (the
//! one-pass decode, the wgmma partial pass, the mma.sync one); on an Apple GPU the Metal kernel
//! does, rows alike (checked that it ran); elsewhere MLX's operations do (the Metal kernel's
//! rows are checked here in `tests/attention/metal_emulation.rs`).
use crate::common::attention_ref::{attention, seen};
use crate::common::mlx_helpers::{array, geometry_in, host};
use crate::common::model::Rng;
use crate::COUNTING;
use latent_cache::core::attention::MaskMode;
use latent_cache::core::kernels::cuda::launch;
use latent_cache::core::kernels::{cuda, metal};
use latent_cache::core::mlx::ops;
use latent_cache::{LayoutKind, StorageMode};
use mlx_rs::{Array, Dtype};

const RANK: usize = 512;
const ROPE: usize = 64;
const HEADS: usize = 64;
const LEN: usize = 300;
const QUERIES: usize = 20;
const K: usize = 40;

/// `v` rounded to bfloat16 (as MLX's cast rounds), so the cache stores exactly these values.
fn bf16(v: Vec<f32>) -> Vec<f32> {
    let a = ops::astype(&array(&v, &[v.len()]), Dtype::Bfloat16).unwrap();
    host(&ops::astype(&a, Dtype::Float32).unwrap())
}

fn bf16_array(v: &[f32], shape: &[usize]) -> Array {
    ops::astype(&array(v, shape), Dtype::Bfloat16).unwrap()
}

#[test]
fn each_query_of_a_chunk_attends_over_its_own_selection_masked_to_what_it_sees() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(2048);
    let modes = [StorageMode::Bf16, StorageMode::Bf16, StorageMode::F32];
    let mut cache = latent_cache::LatentCache::new(geometry_in([RANK, ROPE, 0], modes, LayoutKind::RightJustified)).unwrap();
    let latent = bf16(rng.uniform(LEN * RANK, 1.0));
    let rope = bf16(rng.uniform(LEN * ROPE, 1.0));
    cache.append_host(1, LEN, &latent, &rope, None).unwrap();
    let donor = cache.capture_donor_rows().unwrap();
    // Queries large enough that the scores spread (a wrong rope or scale moves the outputs).
    let q_latent = bf16(rng.uniform(HEADS * QUERIES * RANK, 2.0));
    let q_rope = bf16(rng.uniform(HEADS * QUERIES * ROPE, 2.0));
    // Query i's selection: K distinct positions of the row (later ones included), its own
    // position among them, and for the last query a position past the window (read as the last).
    let mut selections: Vec<Vec<usize>> = Vec::new();
    for i in 0..QUERIES {
        let own = LEN - QUERIES + i;
        let mut chosen = vec![own];
        while chosen.len() < K {
            let p = rng.range(0, LEN - 1);
            if !chosen.contains(&p) {
                chosen.push(p);
            }
        }
        if i == QUERIES - 1 {
            chosen[K - 1] = LEN + 3;
        }
        selections.push(chosen);
    }
    let flat: Vec<i32> = selections.iter().flatten().map(|&p| p as i32).collect();
    let indices = ops::indices(&flat, &[1, QUERIES, K]);
    let scale = 1.0 / ((RANK + ROPE) as f32).sqrt();
    let wgmma = launch::on_cuda() && cuda::mla_decode_wgmma::KERNEL.enabled();
    // The kernel's forms on CUDA (one-pass where MLX runs without its CUDA graphs, else the
    // wgmma two passes; wgmma two-pass; mma.sync); the Metal kernel on an Apple GPU; the ops'
    // path elsewhere.
    let on_gpu = launch::on_cuda() || metal::on_metal();
    let forms: &[(&str, bool, bool)] = match (launch::on_cuda(), metal::on_metal()) {
        (true, _) => &[("one-pass (without MLX's graphs)", true, true), ("wgmma", true, false), ("mma.sync", false, false)],
        (_, true) => &[("Metal", false, false)],
        _ => &[("MLX's operations", false, false)],
    };
    // The process-wide switches are put back however the test ends.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            cuda::mla_decode_wgmma::KERNEL.set_enabled(true);
            cuda::mla_decode_wgmma::ONE_PASS.set_enabled(true);
        }
    }
    let _restore = Restore;
    for &(form, use_wgmma, one_pass) in forms {
        cuda::mla_decode_wgmma::KERNEL.set_enabled(use_wgmma && wgmma);
        cuda::mla_decode_wgmma::ONE_PASS.set_enabled(one_pass);
        for mode in [MaskMode::Causal, MaskMode::None] {
            let what = format!("{form}, {mode:?}");
            let launches = || cuda::mla_decode::KERNEL.launches() + metal::mla_decode::KERNEL.launches();
            let before = launches();
            let out = donor
                .attend_selected(
                    &bf16_array(&q_latent, &[1, HEADS, QUERIES, RANK]),
                    &bf16_array(&q_rope, &[1, HEADS, QUERIES, ROPE]),
                    scale,
                    mode,
                    &indices,
                )
                .unwrap();
            let got = host(&out);
            let ran = launches() - before;
            assert_eq!(ran > 0, on_gpu, "{what}: the kernel runs on a GPU and only there");
            let tolerance = if on_gpu { 1e-2 } else { 3e-2 };
            for (i, chosen) in selections.iter().enumerate() {
                let sees = seen(LEN, QUERIES, i, mode == MaskMode::Causal);
                let positions: Vec<usize> = chosen.iter().map(|&p| p.min(LEN - 1)).filter(|&p| p < sees).collect();
                for h in 0..HEADS {
                    let at = (h * QUERIES + i) * RANK;
                    let ql = &q_latent[at..at + RANK];
                    let qr = &q_rope[(h * QUERIES + i) * ROPE..][..ROPE];
                    let want = attention(&latent, &rope, ql, qr, scale as f64, &positions, |_| 0.0);
                    for (c, w) in want.iter().enumerate() {
                        let g = got[at + c] as f64;
                        assert!(
                            (g - w).abs() <= tolerance * (1.0 + w.abs()),
                            "{what}: query {i} head {h} channel {c}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
