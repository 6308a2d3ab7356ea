//! Attention over rows that read a shared prefix: against the float64 reference over each row's
//! positions (prefix then own), and against the same rows copied into one contiguous window.
use crate::common::attention_ref::{attention, index_scores, visible};
use crate::common::mlx_helpers::{array, host};
use crate::common::model::Rng;
use crate::{prompt, Rows, PREFIX, WIDTHS};
use latent_cache::core::attention::{Donor, MaskMode};
use latent_cache::{LatentCache, LayoutKind};

const HEADS: usize = 2;
const INDEX_HEADS: usize = 2;

/// Three rows over a prefix, holding 9, 6 and 7 positions of their own (a round's unequal
/// rollback: right-justified rows shift and pad, ragged rows end apart).
fn three_rows(layout: LayoutKind, rng: &mut Rng) -> (LatentCache, Rows) {
    let (source, first) = prompt(layout, rng);
    let prefix = source.share_prefix(0, PREFIX).unwrap();
    let mut cache = LatentCache::new(*source.geometry()).unwrap();
    cache.attach_prefix(&prefix, 3).unwrap();
    let mut rows = Rows(vec![first.0[0].clone(); 3]);
    rows.append(&mut cache, rng, 5);
    cache.spec_round_begin().unwrap();
    rows.append(&mut cache, rng, 4);
    cache.spec_round_rollback(&[4, 1, 2]).unwrap();
    rows.truncate(&[PREFIX + 9, PREFIX + 6, PREFIX + 7]);
    (cache, rows)
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= tol * (1.0 + w.abs()), "{what}: [{i}] {g} vs {w}");
    }
}

fn same(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let ok = (x == y) || (x - y).abs() <= tol * (1.0 + y.abs());
        assert!(ok, "{what}: [{i}] {x} vs {y}");
    }
}

struct Queries {
    latent: Vec<f32>,
    rope: Vec<f32>,
    lq: usize,
}

fn queries(rng: &mut Rng, batch: usize, lq: usize) -> Queries {
    Queries {
        latent: rng.uniform(batch * HEADS * lq * WIDTHS[0], 1.0),
        rope: rng.uniform(batch * HEADS * lq * WIDTHS[1], 1.0),
        lq,
    }
}

fn attend(donor: &Donor, q: &Queries, mode: MaskMode, mask: Option<&[f32]>) -> Vec<f32> {
    let b = donor.batch_size();
    let ql = array(&q.latent, &[b, HEADS, q.lq, WIDTHS[0]]);
    let qr = array(&q.rope, &[b, HEADS, q.lq, WIDTHS[1]]);
    let mask = mask.map(|m| array(m, &[b, HEADS, q.lq, donor.offset()]));
    host(&donor.attend(&ql, &qr, 0.3, mode, mask.as_ref()).unwrap())
}

/// The float64 reference of `attend` over `rows` (window position = left_pad + row position).
fn reference(rows: &Rows, pads: &[usize], window: usize, q: &Queries, causal: bool, mask: Option<&[f32]>) -> Vec<f64> {
    let (r, p) = (WIDTHS[0], WIDTHS[1]);
    let mut out = Vec::new();
    for (b, row) in rows.0.iter().enumerate() {
        for h in 0..HEADS {
            for i in 0..q.lq {
                let at = (b * HEADS + h) * q.lq + i;
                let m = |j: usize| mask.map_or(0.0, |m| m[at * window + pads[b] + j] as f64);
                let seen = visible(rows.len(b), q.lq, i, causal);
                out.extend(attention(
                    &row[0],
                    &row[1],
                    &q.latent[at * r..(at + 1) * r],
                    &q.rope[at * p..(at + 1) * p],
                    0.3,
                    &seen,
                    m,
                ));
            }
        }
    }
    out
}

#[test]
fn dense_attention_over_a_shared_prefix_is_attention_over_the_whole_row() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let mut rng = Rng::new(11);
        let (cache, rows) = three_rows(layout, &mut rng);
        assert_eq!(cache.shared_positions(), PREFIX);
        let copy = cache.materialized().unwrap().expect("a copy of a cache over a prefix");
        let (shared, copied) = (cache.capture_donor_rows().unwrap(), copy.capture_donor_rows().unwrap());
        assert_eq!(
            (shared.offset(), shared.left_pad(), shared.row_ends()),
            (copy.offset(), copy.left_pad(), copy.row_ends().to_vec())
        );
        let pads = cache.left_pad().to_vec();
        // Lq 8 > 6 + 1: the shorter rows' first causal queries are prefix positions.
        for (lq, mode) in [(1, MaskMode::None), (3, MaskMode::Causal), (8, MaskMode::Causal), (2, MaskMode::None)] {
            let q = queries(&mut rng, 3, lq);
            let what = format!("{layout:?} Lq {lq} {mode:?}");
            let got = attend(&shared, &q, mode, None);
            close(&got, &reference(&rows, &pads, cache.offset(), &q, mode == MaskMode::Causal, None), 1e-4, &what);
            same(&got, &attend(&copied, &q, mode, None), 1e-5, &format!("{what} (against the copy)"));
        }
        // A mask array over the window: some prefix and some own positions hidden, one query's
        // row hidden whole (zeros).
        let q = queries(&mut rng, 3, 2);
        let t = cache.offset();
        let mut mask: Vec<f32> =
            rng.uniform(3 * HEADS * 2 * t, 1.0).iter().map(|&x| if x > 0.6 { f32::NEG_INFINITY } else { x }).collect();
        mask[..t].iter_mut().for_each(|m| *m = f32::NEG_INFINITY);
        let got = attend(&shared, &q, MaskMode::Array, Some(&mask));
        close(&got, &reference(&rows, &pads, t, &q, false, Some(&mask)), 1e-4, &format!("{layout:?} mask array"));
        assert!(got[..WIDTHS[0]].iter().all(|&x| x == 0.0), "a query seeing nothing gives zeros");
    }
}

#[test]
fn dsa_over_a_shared_prefix_scores_and_attends_as_over_the_whole_row() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let mut rng = Rng::new(12);
        let (cache, rows) = three_rows(layout, &mut rng);
        let copy = cache.materialized().unwrap().unwrap();
        let (shared, copied) = (cache.capture_donor_rows().unwrap(), copy.capture_donor_rows().unwrap());
        let pads = cache.left_pad().to_vec();
        let t = cache.offset();
        for (lq, mode) in [(1, MaskMode::None), (3, MaskMode::Causal), (8, MaskMode::Causal)] {
            let what = format!("{layout:?} Lq {lq} {mode:?}");
            let qi = rng.uniform(3 * INDEX_HEADS * lq * WIDTHS[2], 1.0);
            let w = rng.uniform(3 * lq * INDEX_HEADS, 1.0);
            let (qi_a, w_a) = (array(&qi, &[3, INDEX_HEADS, lq, WIDTHS[2]]), array(&w, &[3, lq, INDEX_HEADS]));
            let scores = shared.index_scores(&qi_a, &w_a, mode).unwrap();
            let got = host(&scores);
            same(
                &got,
                &host(&copied.index_scores(&qi_a, &w_a, mode).unwrap()),
                1e-5,
                &format!("{what}: scores against the copy"),
            );
            // Against the reference, by window position: padding and unseen positions at -inf.
            for b in 0..3 {
                for i in 0..lq {
                    let heads: Vec<&[f32]> =
                        (0..INDEX_HEADS).map(|h| &qi[((b * INDEX_HEADS + h) * lq + i) * WIDTHS[2]..][..WIDTHS[2]]).collect();
                    let seen = visible(rows.len(b), lq, i, mode == MaskMode::Causal).len();
                    let want = index_scores(&rows.0[b][2], &heads, &w[(b * lq + i) * INDEX_HEADS..][..INDEX_HEADS], seen);
                    let row = &got[(b * lq + i) * t..][..t];
                    for (j, &score) in row.iter().enumerate() {
                        let at = j.checked_sub(pads[b]).filter(|&x| x < seen);
                        match at {
                            Some(x) => close(&[score], &[want[x]], 1e-4, &format!("{what}: score {b} {i} {j}")),
                            None => assert_eq!(score, f32::NEG_INFINITY, "{what}: unseen {b} {i} {j}"),
                        }
                    }
                }
            }
            let k = 12;
            let indices = shared.select(&scores, k).unwrap().expect("more positions than k");
            let q = queries(&mut rng, 3, lq);
            let (ql, qr) = (array(&q.latent, &[3, HEADS, lq, WIDTHS[0]]), array(&q.rope, &[3, HEADS, lq, WIDTHS[1]]));
            let got = host(&shared.attend_selected(&ql, &qr, 0.3, mode, &indices).unwrap());
            same(
                &got,
                &host(&copied.attend_selected(&ql, &qr, 0.3, mode, &indices).unwrap()),
                1e-5,
                &format!("{what}: selected"),
            );
            // And the reference over the selected positions each query sees.
            let idx: Vec<i64> = latent_cache::core::mlx::ops::to_host_i64(&indices).unwrap();
            let (r, p) = (WIDTHS[0], WIDTHS[1]);
            let mut want = Vec::new();
            for b in 0..3 {
                for h in 0..HEADS {
                    for i in 0..lq {
                        let seen = visible(rows.len(b), lq, i, mode == MaskMode::Causal).len();
                        let picked: Vec<usize> = idx[(b * lq + i) * k..][..k]
                            .iter()
                            .filter_map(|&j| (j as usize).checked_sub(pads[b]).filter(|&x| x < seen))
                            .collect();
                        let at = (b * HEADS + h) * lq + i;
                        want.extend(attention(
                            &rows.0[b][0],
                            &rows.0[b][1],
                            &q.latent[at * r..][..r],
                            &q.rope[at * p..][..p],
                            0.3,
                            &picked,
                            |_| 0.0,
                        ));
                    }
                }
            }
            close(&got, &want, 1e-4, &format!("{what}: selected against the reference"));
        }
    }
}

#[test]
fn a_forked_row_of_a_forked_row_reads_both_prefixes() {
    let mut rng = Rng::new(13);
    let (mut cache, first) = prompt(LayoutKind::RightJustified, &mut rng);
    cache.fork_row(0, 2).unwrap();
    let mut rows = Rows(vec![first.0[0].clone(); 2]);
    rows.append(&mut cache, &mut rng, 7);
    // A draft tree: row 1 (prefix + 7) becomes the prefix of three branches.
    cache.fork_row(1, 3).unwrap();
    assert_eq!((cache.shared_positions(), cache.shared_prefix().unwrap().pieces().len()), (PREFIX + 7, 2));
    let mut rows = Rows(vec![rows.0[1].clone(); 3]);
    rows.append(&mut cache, &mut rng, 3);
    crate::assert_rows(&cache, &rows, "draft tree");
    let donor = cache.capture_donor_rows().unwrap();
    let q = queries(&mut rng, 3, 4);
    let got = attend(&donor, &q, MaskMode::Causal, None);
    close(&got, &reference(&rows, &[0, 0, 0], cache.offset(), &q, true, None), 1e-4, "draft tree causal");
}
