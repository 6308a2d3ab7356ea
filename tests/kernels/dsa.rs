//! DSA selection over donor rows, against a float64 computation on the values the reference
//! model holds: index scores (weighted ReLU of query-key products, summed over index heads),
//! the top-k positions per query, and attention over those positions alone, with padded rows in
//! both layouts and both storage kinds of index keys. On MLX's CUDA backend the index scores over
//! bfloat16 keys are the library's kernel's (`kernels::cuda::dsa_scores`; each case checks whether it ran).
use std::collections::BTreeSet;

use crate::common::attention_ref::{attention, index_scores, seen};
use crate::common::mlx_helpers::{array, geometry, geometry_in, host};
use crate::common::model::{Model, Rng};
use crate::COUNTING;
use latent_cache::core::attention::MaskMode;

use latent_cache::core::kernels::cuda;
use latent_cache::core::kernels::cuda::launch;
use latent_cache::core::kernels::metal;
use latent_cache::core::mlx::ops;
use latent_cache::{LatentCache, LayoutKind, StorageMode};
use mlx_rs::Array;

const WIDTHS: [usize; 3] = [64, 32, 64];

/// Values in [0.1, 1.1): every query-key product is positive and distinct, so ReLU never ties.
fn positive(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 0.1 + (rng.next() >> 40) as f32 / (1u64 << 24) as f32).collect()
}

/// Three rows from a padded append; with `churn`, row 0 (the longest) then leaves and a request
/// of 14 positions takes its slot (reserved), so the kernels read views over a spare slot from a
/// moved first position (right-justified rows drop the padding they no longer need).
fn filled(rng: &mut Rng, layout: LayoutKind, index_storage: StorageMode, pads: [usize; 3], churn: bool) -> (LatentCache, Model) {
    let modes = [StorageMode::F32, StorageMode::F32, index_storage];
    let mut cache = LatentCache::new(geometry_in(WIDTHS, modes, layout)).unwrap();
    let mut model = Model::with_modes(WIDTHS, modes);
    model.ragged = layout == LayoutKind::Ragged;
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| positive(rng, 3 * 16 * WIDTHS[f]));
    cache.append_host_padded(3, 16, &pads, &data[0], &data[1], Some(&data[2])).unwrap();
    model.append_padded(3, 16, &pads, &data);
    if churn {
        let mut joiner = LatentCache::new(*cache.geometry()).unwrap();
        let mut joiner_model = model.empty_like();
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| positive(rng, 14 * WIDTHS[f]));
        joiner.append_host(1, 14, &data[0], &data[1], Some(&data[2])).unwrap();
        joiner_model.append(1, 14, &data);
        cache.reserve_rows(4).unwrap();
        cache.merge_rows(&[&joiner]).unwrap();
        cache.filter_rows(&[3, 1, 2]).unwrap();
        model = Model::merge(&[&model, &joiner_model]);
        model.filter(&[3, 1, 2]);
    }
    (cache, model)
}

#[test]
fn index_scores_selection_and_selected_attention_match_a_float64_reference() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(91);
    let (heads, k) = (2usize, 6usize);
    // MLX's CUDA backend runs float32 matmuls at TF32 precision (10-bit mantissas).
    let tolerance = match mlx_rs::Device::default().get_type().unwrap() {
        mlx_rs::DeviceType::Gpu => 1e-2,
        _ => 1e-5,
    };
    // Padded rows; whole rows (no mask is built where no query misses a position), with two
    // queries (causal still masks) and one.
    // Rows that left and joined in the batch's slots (see `filled`).
    for (pads, queries, churn) in [([0, 7, 3], 2usize, false), ([0, 7, 3], 2, true), ([0, 0, 0], 2, false), ([0, 0, 0], 1, false)]
    {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            for index_storage in [StorageMode::F32, StorageMode::Bf16] {
                for mode in [MaskMode::None, MaskMode::Causal] {
                    let what = format!("{layout:?} {index_storage:?} {mode:?} pads {pads:?} {queries} queries, churn {churn}");
                    let (cache, model) = filled(&mut rng, layout, index_storage, pads, churn);
                    let donor = cache.capture_donor_rows().unwrap();
                    let batch = 3usize;
                    let q_index = positive(&mut rng, batch * heads * queries * WIDTHS[2]);
                    let weights = positive(&mut rng, batch * queries * heads);
                    let before = cuda::dsa_scores::KERNEL.launches();
                    let scores = donor
                        .index_scores(
                            &array(&q_index, &[batch, heads, queries, WIDTHS[2]]),
                            &array(&weights, &[batch, queries, heads]),
                            mode,
                        )
                        .unwrap();
                    // (Once per run of slots the rows lie in: churned rows lie in two.)
                    let kernel = launch::on_cuda() && index_storage == StorageMode::Bf16;
                    let ran = cuda::dsa_scores::KERNEL.launches() - before;
                    assert_eq!(ran > 0, kernel, "{what}: the kernel for 16-bit keys on CUDA");
                    let got_scores = host(&scores);
                    let indices = donor.select(&scores, k).unwrap().expect("the window holds more than k positions");
                    let got_indices = host(&indices);
                    // The selection in one call picks the same positions (on CUDA, from the
                    // index-score kernel's own count of the top-k histogram).
                    let direct = donor
                        .index_select(
                            &array(&q_index, &[batch, heads, queries, WIDTHS[2]]),
                            &array(&weights, &[batch, queries, heads]),
                            mode,
                            k,
                        )
                        .unwrap()
                        .expect("the window holds more than k positions");
                    assert_eq!(host(&direct), got_indices, "{what}: index_select as select of index_scores");
                    let q_latent = positive(&mut rng, batch * heads * queries * WIDTHS[0]);
                    let q_rope = positive(&mut rng, batch * heads * queries * WIDTHS[1]);
                    let out = donor
                        .attend_selected(
                            &array(&q_latent, &[batch, heads, queries, WIDTHS[0]]),
                            &array(&q_rope, &[batch, heads, queries, WIDTHS[1]]),
                            0.05,
                            mode,
                            &indices,
                        )
                        .unwrap();
                    let got_out = host(&out);
                    let pads = model.left_pad();
                    for b in 0..batch {
                        let row = &model.rows[b];
                        let len = model.len(b);
                        for i in 0..queries {
                            let seen = seen(len, queries, i, mode == MaskMode::Causal);
                            // Scores: window position pads[b] + j holds row position j.
                            let q: Vec<&[f32]> = (0..heads)
                                .map(|h| &q_index[((b * heads + h) * queries + i) * WIDTHS[2]..][..WIDTHS[2]])
                                .collect();
                            let want = index_scores(&row.families[2], &q, &weights[(b * queries + i) * heads..][..heads], seen);
                            for t in 0..donor.offset() {
                                let got = got_scores[(b * queries + i) * donor.offset() + t];
                                match t.checked_sub(pads[b]).filter(|&j| j < seen) {
                                    Some(j) => {
                                        assert!(
                                            (got as f64 - want[j]).abs() <= 10.0 * tolerance * want[j].abs(),
                                            "{what}: score {b},{i},{t}"
                                        )
                                    }
                                    None => assert_eq!(got, f32::NEG_INFINITY, "{what}: unseen position {b},{i},{t}"),
                                }
                            }
                            // Selection: the visible selected positions are the top min(k, seen).
                            let selected: BTreeSet<usize> =
                                got_indices[(b * queries + i) * k..][..k].iter().map(|&x| x as usize).collect();
                            assert_eq!(selected.len(), k, "{what}: distinct indices");
                            let mut order: Vec<usize> = (0..seen).collect();
                            order.sort_by(|&x, &y| want[y].partial_cmp(&want[x]).unwrap());
                            let top: BTreeSet<usize> = order.iter().take(k.min(seen)).map(|&j| pads[b] + j).collect();
                            let visible: BTreeSet<usize> =
                                selected.iter().copied().filter(|&p| p >= pads[b] && p - pads[b] < seen).collect();
                            assert_eq!(visible, top, "{what}: top-{k} of row {b} query {i}");
                            // Attention over the selected visible positions only.
                            for h in 0..heads {
                                let at = (b * heads + h) * queries + i;
                                let ql = &q_latent[at * WIDTHS[0]..][..WIDTHS[0]];
                                let qr = &q_rope[at * WIDTHS[1]..][..WIDTHS[1]];
                                let js: Vec<usize> = top.iter().map(|&p| p - pads[b]).collect();
                                let want = attention(&row.families[0], &row.families[1], ql, qr, 0.05, &js, |_| 0.0);
                                for (c, &want) in want.iter().enumerate() {
                                    let got = got_out[at * WIDTHS[0] + c] as f64;
                                    assert!(
                                        (got - want).abs() <= tolerance * (1.0 + want.abs()),
                                        "{what}: out {b},{h},{i},{c}: {got} vs {want}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn selection_falls_back_to_dense_and_refuses_misuse() {
    let mut rng = Rng::new(92);
    let (cache, _) = filled(&mut rng, LayoutKind::RightJustified, StorageMode::F32, [0, 7, 3], false);
    let donor = cache.capture_donor_rows().unwrap();
    let scores = Array::from_slice(&[0f32; 3 * 16], &[3, 1, 16]);
    assert!(donor.select(&scores, 16).unwrap().is_none(), "no more positions than k: dense");
    // All scores equal: any 15 distinct positions of the 16.
    let tied = host(&donor.select(&scores, 15).unwrap().expect("more positions than k"));
    for row in tied.chunks(15) {
        let distinct: BTreeSet<usize> = row.iter().map(|&p| p as usize).collect();
        assert!(distinct.len() == 15 && distinct.iter().all(|&p| p < 16), "15 distinct positions: {row:?}");
    }
    assert_eq!(donor.select(&scores, 0).unwrap_err().kind, latent_cache::ErrorKind::InvalidArgument);
    for bad in [&[3, 1, 15][..], &[2, 1, 16], &[3, 16]] {
        let scores = Array::from_slice(&vec![0f32; bad.iter().product::<i32>() as usize], bad);
        assert_eq!(donor.select(&scores, 4).unwrap_err().kind, latent_cache::ErrorKind::Shape, "scores {bad:?}");
    }
    let q = Array::from_slice(&vec![0.5f32; 3 * 64], &[3, 1, 1, 64]);
    let w = Array::from_slice(&[1f32; 3], &[3, 1, 1]);
    assert_eq!(donor.index_scores(&q, &w, MaskMode::Array).unwrap_err().kind, latent_cache::ErrorKind::InvalidArgument);
    let bad_w = Array::from_slice(&[1f32; 6], &[3, 1, 2]);
    assert_eq!(donor.index_scores(&q, &bad_w, MaskMode::None).unwrap_err().kind, latent_cache::ErrorKind::Shape);
    // The selection in one call refuses what either call refuses, and gives none where the
    // window holds no more than k positions.
    use latent_cache::ErrorKind::{InvalidArgument, Shape};
    assert_eq!(donor.index_select(&q, &w, MaskMode::None, 0).unwrap_err().kind, InvalidArgument);
    assert_eq!(donor.index_select(&q, &w, MaskMode::Array, 4).unwrap_err().kind, InvalidArgument);
    assert_eq!(donor.index_select(&q, &bad_w, MaskMode::None, 4).unwrap_err().kind, Shape);
    assert!(donor.index_select(&q, &w, MaskMode::None, donor.offset()).unwrap().is_none(), "no more positions than k");
    // A layer without index keys has no index scores.
    let mut plain = LatentCache::new(geometry([64, 32, 0], LayoutKind::RightJustified)).unwrap();
    plain.append_host(1, 2, &vec![0.5; 128], &vec![0.5; 64], None).unwrap();
    let q1 = Array::from_slice(&vec![0.5f32; 64], &[1, 1, 1, 64]);
    let w1 = Array::from_slice(&[1f32], &[1, 1, 1]);
    let plain = plain.capture_donor_rows().unwrap();
    assert_eq!(plain.index_scores(&q1, &w1, MaskMode::None).unwrap_err().kind, InvalidArgument);
    assert_eq!(plain.index_select(&q1, &w1, MaskMode::None, 1).unwrap_err().kind, InvalidArgument);
}

/// Attention over selected positions in a decode step (one query per row) over float, 16-bit and
/// packed latents, in both layouts, rows whole and padded: against float64 over the values the
/// model says each row holds. Where rows span the window, on CUDA (16-bit and packed latents)
/// and on Apple GPUs (float storage), it is the split-K kernel over the gathered positions, and
/// each case checks that it ran (and, for padded rows, that MLX's ops did); elsewhere MLX's ops.
#[test]
fn decode_attention_over_selected_positions_matches_a_float64_reference() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    use StorageMode::*;
    let mut rng = Rng::new(93);
    let (rank, rope, heads, k, tokens) = (128usize, 64usize, 8usize, 40usize, 300usize);
    let signed = |rng: &mut Rng, n: usize| -> Vec<f32> { positive(rng, n).iter().map(|v| 2.0 * v - 1.2).collect() };
    // Queries exact in every float dtype (multiples of 1/32 in [-2, 2]).
    let exact =
        |rng: &mut Rng, n: usize| -> Vec<f32> { (0..n).map(|_| ((rng.next() >> 40) % 129) as f32 / 32.0 - 2.0).collect() };
    let modes = [(F32, F32), (Bf16, Bf16), (F16, F16), (Q8, Bf16), (Fp8, Bf16)];
    let layouts = [LayoutKind::RightJustified, LayoutKind::Ragged];
    for ((latent_mode, rope_mode), layout, pads) in
        modes.iter().flat_map(|&m| layouts.iter().flat_map(move |&l| [(m, l, [0usize, 0]), (m, l, [0, 5])]))
    {
        let what = format!("{latent_mode:?} latent, {rope_mode:?} rope, {layout:?}, pads {pads:?}");
        let modes = [latent_mode, rope_mode, F32];
        let mut cache = LatentCache::new(geometry_in([rank, rope, 0], modes, layout)).unwrap();
        let mut model = Model::with_modes([rank, rope, 0], modes);
        model.ragged = layout == LayoutKind::Ragged;
        let data = [signed(&mut rng, 2 * tokens * rank), signed(&mut rng, 2 * tokens * rope), vec![]];
        cache.append_host_padded(2, tokens, &pads, &data[0], &data[1], None).unwrap();
        model.append_padded(2, tokens, &pads, &data);
        let donor = cache.capture_donor_rows().unwrap();
        // k distinct positions of each row, in no order, as window positions.
        let left = model.left_pad();
        let mut selected = Vec::new();
        for (b, &pad) in left.iter().enumerate() {
            let mut rows: Vec<usize> = (0..model.len(b)).collect();
            for i in 0..k {
                let j = i + (rng.next() as usize) % (rows.len() - i);
                rows.swap(i, j);
            }
            selected.push(rows[..k].iter().map(|&j| pad + j).collect::<Vec<_>>());
        }
        let flat: Vec<i32> = selected.iter().flatten().map(|&p| p as i32).collect();
        let indices = Array::from_slice(&flat, &[2, 1, k as i32]);
        let dtype = match latent_mode {
            F32 => mlx_rs::Dtype::Float32,
            F16 => mlx_rs::Dtype::Float16,
            _ => mlx_rs::Dtype::Bfloat16,
        };
        let (q_latent, q_rope) = (exact(&mut rng, 2 * heads * rank), exact(&mut rng, 2 * heads * rope));
        let arr = |v: &[f32], w: usize| ops::astype(&Array::from_slice(v, &[2, heads as i32, 1, w as i32]), dtype).unwrap();
        let scale = 0.05;
        let sizes = cuda::mla_decode::Shape { batch: 2, heads, queries: 1, positions: k, rank, rope, scale };
        let kernel = match latent_mode {
            F32 | Bf16 | F16 => {
                cuda::mla_decode::applies(dtype, dtype, &sizes) || metal::mla_decode::applies(dtype, dtype, &sizes, false, true)
            }
            Q8 => cuda::mla_decode::applies_packed(latent_cache::core::model::storage_mode::Packing::Affine(8), dtype, &sizes),
            _ => cuda::mla_decode::applies_packed(latent_cache::core::model::storage_mode::Packing::Fp8, dtype, &sizes),
        };
        assert!(!launch::on_cuda() || kernel || latent_mode == F32, "{what}: the kernel applies on this GPU");
        let float = matches!(latent_mode, F32 | Bf16 | F16);
        assert!(!metal::on_metal() || kernel || !float, "{what}: the Metal kernel applies (see stderr for its check)");
        // Padded rows: MLX's ops (they mask a selected position the row lacks).
        let kernel = kernel && pads == [0, 0];
        // Either backend's kernel, each counting its own launches.
        let launches = || cuda::mla_decode::KERNEL.launches() + metal::mla_decode::KERNEL.launches();
        let before = launches();
        let out = donor.attend_selected(&arr(&q_latent, rank), &arr(&q_rope, rope), scale, MaskMode::Causal, &indices).unwrap();
        let got = host(&out);
        assert_eq!(launches() - before, kernel as usize, "{what}: where a kernel applies it runs");
        for (b, positions) in selected.iter().enumerate() {
            let row = &model.rows[b];
            for h in 0..heads {
                let at = b * heads + h;
                let js: Vec<usize> = positions.iter().map(|&p| p - left[b]).collect();
                let (ql, qr) = (&q_latent[at * rank..][..rank], &q_rope[at * rope..][..rope]);
                let want = attention(&row.families[0], &row.families[1], ql, qr, scale as f64, &js, |_| 0.0);
                for (c, &want) in want.iter().enumerate() {
                    let got = got[at * rank + c] as f64;
                    assert!((got - want).abs() <= 1e-2 * (1.0 + want.abs()), "{what}: out {b},{h},{c}: {got} vs {want}");
                }
            }
        }
    }
}

/// Top-k over windows of hundreds to tens of thousands of positions (some not a multiple of a
/// warp, some fewer than the kernel's threads), batch 2 x 2 queries, with negative, positive,
/// -inf and repeated scores: the selection holds every position scoring above the k-th largest
/// score and the rest at it, k distinct positions. Where the CUDA kernel runs (each case checks
/// that it did, up to its most positions), the ties it takes are the first by position, as `kernels::cuda::dsa_topk`
/// documents, and a second run gives the same positions.
#[test]
fn selection_over_a_long_window_takes_the_k_largest() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(94);
    let (batch, queries) = (2usize, 2usize);
    // The CUDA kernel reads a row once where the k-th largest score's bin (its top 11 bits) holds
    // at most 4096 keys, and narrows the bin by further reads first where it holds more: few
    // levels over many positions make such bins (150K positions of 4096 levels: about 12K keys
    // in the top bins; 100K of 3 levels: 33K keys a level, so the k-th is a tie among them).
    for (positions, k, levels) in [
        (5000usize, 300usize, 50u64),
        (700, 699, 3),
        (1000, 1, 1000),
        (32_768, 2048, 40),
        (40_000, 2048, 1 << 30),
        (150_000, 2048, 1 << 12),
        (100_000, 2048, 3),
    ] {
        let mut cache = LatentCache::new(geometry([64, 32, 64], LayoutKind::RightJustified)).unwrap();
        let n = batch * positions;
        cache.append_host(batch, positions, &vec![0.5; n * 64], &vec![0.5; n * 32], Some(&vec![0.5; n * 64])).unwrap();
        let donor = cache.capture_donor_rows().unwrap();
        // Scores from `levels` values (many ties where few), some -inf (unseen positions).
        let scores: Vec<f32> = (0..n * queries)
            .map(|_| match rng.next() % (levels + 1) {
                0 => f32::NEG_INFINITY,
                r => (r as f32 - levels as f32 / 2.0) * 0.75,
            })
            .collect();
        let scores = Array::from_slice(&scores, &[batch as i32, queries as i32, positions as i32]);
        let before = cuda::dsa_topk::KERNEL.launches();
        let got = host(&donor.select(&scores, k).unwrap().unwrap());
        let kernel = cuda::dsa_topk::KERNEL.launches() - before == 1;
        assert_eq!(kernel, launch::on_cuda(), "{positions} positions: the kernel runs on CUDA, at every length");
        if kernel {
            assert_eq!(host(&donor.select(&scores, k).unwrap().unwrap()), got, "{positions} positions: the same again");
        }
        let scores = host(&scores);
        for r in 0..batch * queries {
            let what = format!("{positions} positions, k {k}, row-query {r}");
            let row = &scores[r * positions..][..positions];
            let chosen: Vec<usize> = got[r * k..][..k].iter().map(|&p| p as usize).collect();
            let distinct: BTreeSet<usize> = chosen.iter().copied().collect();
            assert_eq!(distinct.len(), k, "{what}: k distinct positions");
            let mut sorted: Vec<f32> = row.to_vec();
            sorted.sort_by(|x, y| y.partial_cmp(x).unwrap());
            let kth = sorted[k - 1];
            assert!(distinct.iter().all(|&p| p < positions && row[p] >= kth), "{what}: nothing below the k-th score");
            let above = (0..positions).filter(|&p| row[p] > kth).count();
            assert_eq!(distinct.iter().filter(|&&p| row[p] > kth).count(), above, "{what}: every score above the k-th");
            if kernel {
                // The positions above the k-th score in order, then the first ties in order.
                let want: Vec<usize> = (0..positions)
                    .filter(|&p| row[p] > kth)
                    .chain((0..positions).filter(|&p| row[p] == kth).take(k - above))
                    .collect();
                assert_eq!(chosen, want, "{what}: the kernel's order and ties");
            }
        }
    }
}

/// Scores are the caller's: rows of NaN (every bit set, and the quiet NaN), of -inf alone and of
/// zeros of both signs, read through a strided view, still select `k` distinct positions of the
/// window on every path (the kernels' order keys count every position), and the same ones again;
/// on CUDA the zeros are one tie (-0 is +0), so the kernel takes the first `k` positions.
#[test]
fn selection_over_degenerate_scores_stays_in_the_window() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (batch, queries, positions, k) = (2usize, 2usize, 9000usize, 2048usize);
    let mut cache = LatentCache::new(geometry([64, 32, 64], LayoutKind::RightJustified)).unwrap();
    let n = batch * positions;
    cache.append_host(batch, positions, &vec![0.5; n * 64], &vec![0.5; n * 32], Some(&vec![0.5; n * 64])).unwrap();
    let donor = cache.capture_donor_rows().unwrap();
    let rows: [f32; 4] = [f32::from_bits(0xffff_ffff), f32::NAN, f32::NEG_INFINITY, 0.0];
    // `[B, T, Lq]` seen as `[B, Lq, T]`: a strided view (positions `queries` values apart).
    let stored: Vec<f32> = (0..batch * positions * queries)
        .map(|i| {
            let (r, t) = ((i / (positions * queries)) * queries + i % queries, i / queries % positions);
            // The zeros' row alternates their signs.
            if r == 3 && t % 2 == 1 {
                -0.0
            } else {
                rows[r]
            }
        })
        .collect();
    let stored = Array::from_slice(&stored, &[batch as i32, positions as i32, queries as i32]);
    let scores = latent_cache::core::mlx::math::swapaxes(&stored, 1, 2).unwrap();
    let before = cuda::dsa_topk::KERNEL.launches();
    let got = host(&donor.select(&scores, k).unwrap().unwrap());
    assert_eq!(cuda::dsa_topk::KERNEL.launches() - before, launch::on_cuda() as usize, "the kernel on CUDA");
    assert_eq!(host(&donor.select(&scores, k).unwrap().unwrap()), got, "the same positions again");
    for r in 0..batch * queries {
        let chosen: BTreeSet<i64> = got[r * k..][..k].iter().map(|&p| p as i64).collect();
        assert_eq!(chosen.len(), k, "row-query {r} ({}): k distinct positions", rows[r]);
        assert!(chosen.iter().all(|&p| (0..positions as i64).contains(&p)), "row-query {r}: in the window");
    }
    if launch::on_cuda() {
        let zeros: Vec<i64> = got[3 * k..][..k].iter().map(|&p| p as i64).collect();
        assert_eq!(zeros, (0..k as i64).collect::<Vec<_>>(), "zeros of both signs: one tie, the first k positions");
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as a float32.
fn bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits((bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff_0000)
}

/// Index scores at GLM-5.2's indexer shape (32 heads of 128 channels), over bfloat16 keys of
/// both signs (so ReLU cuts), with queries in bfloat16 and in float32 (which the CUDA kernel
/// multiplies as two bfloat16 parts), a window that is not a whole number of the kernel's
/// blocks, and causal queries: each score against a float64 sum, within a bound on float32
/// rounding of the products' magnitudes.
#[test]
fn index_scores_at_the_glm52_indexer_shape_match_a_float64_reference() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(95);
    let (batch, positions, heads, width) = (2usize, 1000usize, 32usize, 128usize);
    let mut signed =
        |n: usize| -> Vec<f32> { (0..n).map(|_| bf16((rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)).collect() };
    let modes = [StorageMode::F32, StorageMode::F32, StorageMode::Bf16];
    let mut cache = LatentCache::new(geometry_in([16, 16, width], modes, LayoutKind::RightJustified)).unwrap();
    let keys = signed(batch * positions * width);
    let n = batch * positions;
    cache.append_host(batch, positions, &vec![0.5; n * 16], &vec![0.5; n * 16], Some(&keys)).unwrap();
    let donor = cache.capture_donor_rows().unwrap();
    for (queries, mode, q_dtype) in [
        (1usize, MaskMode::None, mlx_rs::Dtype::Bfloat16),
        (1, MaskMode::None, mlx_rs::Dtype::Float32),
        (3, MaskMode::Causal, mlx_rs::Dtype::Float32),
    ] {
        let what = format!("{queries} queries, {mode:?}, {q_dtype:?} queries");
        // Float32 queries off the bfloat16 grid, so their second part matters.
        let q: Vec<f32> = signed(batch * heads * queries * width)
            .iter()
            .map(|&x| if q_dtype == mlx_rs::Dtype::Float32 { x * 1.001 } else { x })
            .collect();
        let w: Vec<f32> = signed(batch * queries * heads).iter().map(|x| x.abs() + 0.1).collect();
        let q_array = ops::astype(&array(&q, &[batch, heads, queries, width]), q_dtype).unwrap();
        let before = cuda::dsa_scores::KERNEL.launches();
        let scores = donor.index_scores(&q_array, &array(&w, &[batch, queries, heads]), mode).unwrap();
        let got = host(&scores);
        assert_eq!(cuda::dsa_scores::KERNEL.launches() - before, launch::on_cuda() as usize, "{what}: the kernel on CUDA");
        // The selection in one call (on CUDA the scores kernel counts the top-k's histogram over
        // its blocks): the k highest of these scores, the first positions among ties.
        let k = 100;
        let direct = donor.index_select(&q_array, &array(&w, &[batch, queries, heads]), mode, k).unwrap().expect("k < T");
        let picked = host(&direct);
        for row in 0..batch * queries {
            let scores = &got[row * positions..][..positions];
            let mut order: Vec<usize> = (0..positions).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let want: BTreeSet<usize> = order[..k].iter().copied().collect();
            let got: BTreeSet<usize> = picked[row * k..][..k].iter().map(|&p| p as usize).collect();
            assert_eq!(got, want, "{what}: row {row}'s top {k}");
        }
        for b in 0..batch {
            for i in 0..queries {
                let seen = seen(positions, queries, i, mode == MaskMode::Causal);
                let qs: Vec<&[f32]> = (0..heads).map(|h| &q[((b * heads + h) * queries + i) * width..][..width]).collect();
                let ws = &w[(b * queries + i) * heads..][..heads];
                let row = &keys[b * positions * width..][..positions * width];
                let want = index_scores(row, &qs, ws, seen);
                for t in 0..positions {
                    let got = got[(b * queries + i) * positions + t];
                    if t >= seen {
                        assert_eq!(got, f32::NEG_INFINITY, "{what}: unseen position {b},{i},{t}");
                        continue;
                    }
                    let magnitude: f64 = qs
                        .iter()
                        .zip(ws)
                        .map(|(qh, &wh)| {
                            wh as f64 * qh.iter().zip(&row[t * width..]).map(|(a, c)| (*a as f64 * *c as f64).abs()).sum::<f64>()
                        })
                        .sum();
                    let bound = 1e-4 * magnitude + 1e-6;
                    assert!(
                        (got as f64 - want[t]).abs() <= bound,
                        "{what}: score {b},{i},{t}: {got} vs {} (bound {bound})",
                        want[t]
                    );
                }
            }
        }
    }
}

/// Indices are the caller's: ones outside the window read the nearest position of it (never
/// outside the stored buffers), on every path: a decode step the kernel takes (rows spanning the
/// window, 16-bit storage on CUDA) and padded rows (MLX's ops).
#[test]
fn selected_positions_outside_the_window_read_clamped() {
    let _counting = COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(95);
    let (rank, rope, heads, tokens) = (128usize, 64usize, 4usize, 100usize);
    for pads in [[0usize, 0], [0, 9]] {
        let modes = [StorageMode::Bf16, StorageMode::Bf16, StorageMode::F32];
        let mut cache = LatentCache::new(geometry_in([rank, rope, 0], modes, LayoutKind::RightJustified)).unwrap();
        let data = [rng.uniform(2 * tokens * rank, 1.0), rng.uniform(2 * tokens * rope, 1.0)];
        cache.append_host_padded(2, tokens, &pads, &data[0], &data[1], None).unwrap();
        let donor = cache.capture_donor_rows().unwrap();
        let t = donor.offset() as i32;
        let wild = [-5, 3, t + 100, 7, i32::MIN, 20, i32::MAX, 40];
        let tame = [0, 3, t - 1, 7, 0, 20, t - 1, 40];
        let mut q = |w: usize| {
            let v = rng.uniform(2 * heads * w, 1.0);
            ops::astype(&Array::from_slice(&v, &[2, heads as i32, 1, w as i32]), mlx_rs::Dtype::Bfloat16).unwrap()
        };
        let (ql, qr) = (q(rank), q(rope));
        let attend = |indices: &[i32]| {
            let indices = Array::from_slice(indices, &[2, 1, 4]);
            host(&donor.attend_selected(&ql, &qr, 0.05, MaskMode::None, &indices).unwrap())
        };
        assert_eq!(attend(&wild), attend(&tame), "pads {pads:?}: out-of-window indices read clamped");
    }
}
