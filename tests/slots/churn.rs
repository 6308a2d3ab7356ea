//! Batches that churn as engines run them: requests leaving first-in-first-out, last-in-first-
//! out or from anywhere with the order kept, each followed by a join and a decode step, for
//! hundreds of requests. The rows then lie in several runs of slots (a ring, holes); every
//! stored value, the whole-batch views, and attention over them (dense, causal, DSA's index
//! scores, selection and selected attention, over a shared prefix and composed storage too) are
//! checked against the reference model and the float64 attention reference.
use super::*;
use common::attention_ref::{attention, index_scores, seen, visible};
use common::mlx_helpers::{array, host};
use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::ops;

#[derive(Clone, Copy, Debug)]
enum Churn {
    FirstInFirstOut,
    LastInFirstOut,
    Anywhere,
}

/// The row that leaves next.
fn leaving(churn: Churn, rng: &mut Rng, rows: usize) -> usize {
    match churn {
        Churn::FirstInFirstOut => 0,
        Churn::LastInFirstOut => rows - 1,
        Churn::Anywhere => rng.range(0, rows - 1),
    }
}

/// Every row's stored window through the whole-batch views (`state`): each row's valid
/// positions equal the model's.
fn check_views(cache: &LatentCache, model: &Model, what: &str) {
    let state = cache.state().unwrap();
    let (t, pads) = (cache.offset(), model.left_pad());
    for (f, values) in [(0, Some(&state.latent)), (1, Some(&state.rope)), (2, state.index_keys.as_ref())] {
        let (Some(values), w) = (values, model.widths[f]) else { continue };
        let got = host(&ops::astype(values, mlx_rs::Dtype::Float32).unwrap());
        for (b, row) in model.rows.iter().enumerate() {
            let at = (b * t + pads[b]) * w;
            let want = &row.families[f];
            assert_eq!(&got[at..at + want.len()], want.as_slice(), "{what}: family {f} row {b} through the views");
        }
    }
}

/// Within `tolerance` of `scale` (the size of the values averaged: an attention output near 0
/// is a mean of values thousands large).
fn close(got: f32, want: f64, tolerance: f64, scale: f64) -> bool {
    (got as f64 - want).abs() <= tolerance * (1.0 + scale.max(want.abs()))
}

fn largest(values: &[f32]) -> f64 {
    values.iter().fold(0f64, |m, v| m.max(v.abs() as f64))
}

/// Attention over the batch as it lies (dense in both mask modes; with index keys, DSA's scores,
/// its top 3 and attention over them), against the float64 reference over the model's rows.
fn check_attention(cache: &LatentCache, model: &Model, rng: &mut Rng, tolerance: f64, what: &str) {
    let donor = cache.capture_donor_rows().unwrap();
    let [wl, wr, wi] = model.widths;
    let (batch, heads, lq, t) = (model.rows.len(), 2, 2, donor.offset());
    let pads = model.left_pad();
    let ql = rng.uniform(batch * heads * lq * wl, 1.0 / 8192.0);
    let qr = rng.uniform(batch * heads * lq * wr, 1.0 / 8192.0);
    let (q_latent, q_rope) = (array(&ql, &[batch, heads, lq, wl]), array(&qr, &[batch, heads, lq, wr]));
    let at = |b: usize, h: usize, i: usize| (b * heads + h) * lq + i;
    for mode in [MaskMode::None, MaskMode::Causal] {
        let got = host(&donor.attend(&q_latent, &q_rope, 0.3, mode, None).unwrap());
        for (b, row) in model.rows.iter().enumerate() {
            for (h, i) in (0..heads).flat_map(|h| (0..lq).map(move |i| (h, i))) {
                let k = at(b, h, i);
                let positions = visible(model.len(b), lq, i, mode == MaskMode::Causal);
                let want = attention(
                    &row.families[0],
                    &row.families[1],
                    &ql[k * wl..][..wl],
                    &qr[k * wr..][..wr],
                    0.3,
                    &positions,
                    |_| 0.0,
                );
                for (c, w) in want.iter().enumerate() {
                    let g = got[k * wl + c];
                    assert!(
                        close(g, *w, tolerance, largest(&row.families[0])),
                        "{what} {mode:?}: row {b} head {h} query {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
    if wi == 0 {
        return;
    }
    let qi = rng.uniform(batch * heads * lq * wi, 1.0 / 8192.0);
    let weights = rng.uniform(batch * lq * heads, 1.0);
    let (q_index, w) = (array(&qi, &[batch, heads, lq, wi]), array(&weights, &[batch, lq, heads]));
    let scores = host(&donor.index_scores(&q_index, &w, MaskMode::Causal).unwrap());
    let top = 3;
    let selected = donor.index_select(&q_index, &w, MaskMode::Causal, top).unwrap();
    let picked = selected.as_ref().map(|s| host(&ops::astype(s, mlx_rs::Dtype::Float32).unwrap()));
    for (b, row) in model.rows.iter().enumerate() {
        for i in 0..lq {
            let queries: Vec<&[f32]> = (0..heads).map(|h| &qi[at(b, h, i) * wi..][..wi]).collect();
            let head_weights: Vec<f32> = (0..heads).map(|h| weights[(b * lq + i) * heads + h]).collect();
            let sees = seen(model.len(b), lq, i, true);
            let want = index_scores(&row.families[2], &queries, &head_weights, sees);
            let got = &scores[(b * lq + i) * t..][..t];
            for (p, g) in got.iter().enumerate() {
                match p.checked_sub(pads[b]).filter(|&j| j < sees) {
                    Some(j) => assert!(
                        close(*g, want[j], 1e-4, 0.0),
                        "{what}: score of row {b} query {i} position {j}: {g} vs {}",
                        want[j]
                    ),
                    None => assert_eq!(*g, f32::NEG_INFINITY, "{what}: row {b} query {i} sees window position {p}"),
                }
            }
            let Some(picked) = &picked else { continue };
            if sees < top {
                continue;
            }
            // The selection's reference scores are the top 3 (ties, ReLU's zeros among them,
            // may pick any of the tied positions), all of positions the query sees.
            let mut ranked = want.clone();
            ranked.sort_by(|x, y| y.total_cmp(x));
            let mut chosen: Vec<f64> = picked[(b * lq + i) * top..][..top]
                .iter()
                .map(|&p| {
                    let j = (p as usize).checked_sub(pads[b]).filter(|&j| j < sees);
                    want[j.unwrap_or_else(|| panic!("{what}: row {b} query {i} selected window position {p}"))]
                })
                .collect();
            chosen.sort_by(|x, y| y.total_cmp(x));
            for (c, r) in chosen.iter().zip(&ranked) {
                assert!(
                    (c - r).abs() <= 1e-4 * (1.0 + r.abs()),
                    "{what}: row {b} query {i} selected {chosen:?}, the top is {ranked:?}"
                );
            }
        }
    }
    let (Some(selected), Some(picked)) = (selected, picked) else { return };
    let got = host(&donor.attend_selected(&q_latent, &q_rope, 0.3, MaskMode::Causal, &selected).unwrap());
    for (b, row) in model.rows.iter().enumerate() {
        for (h, i) in (0..heads).flat_map(|h| (0..lq).map(move |i| (h, i))) {
            let k = at(b, h, i);
            let sees = seen(model.len(b), lq, i, true);
            let positions: Vec<usize> = picked[(b * lq + i) * top..][..top]
                .iter()
                .filter_map(|&p| (p as usize).checked_sub(pads[b]).filter(|&j| j < sees))
                .collect();
            let want =
                attention(&row.families[0], &row.families[1], &ql[k * wl..][..wl], &qr[k * wr..][..wr], 0.3, &positions, |_| 0.0);
            for (c, w) in want.iter().enumerate() {
                let g = got[k * wl + c];
                assert!(
                    close(g, *w, tolerance, largest(&row.families[0])),
                    "{what}: selected attention of row {b} head {h} query {i}: {g} vs {w}"
                );
            }
        }
    }
}

/// Attention and index scores over `cache`'s rows as they lie equal those over the same rows
/// extracted and merged into a new batch (one run of slots).
fn check_as_fresh(cache: &LatentCache, rng: &mut Rng, what: &str) {
    let g = *cache.geometry();
    let rows: Vec<LatentCache> = (0..cache.batch_size()).map(|b| cache.extract_row(b).unwrap()).collect();
    let mut fresh = LatentCache::new(g).unwrap();
    fresh.merge_rows(&rows.iter().collect::<Vec<_>>()).unwrap();
    let (batch, heads, lq) = (cache.batch_size(), 2, 2);
    let q = |rng: &mut Rng, w: usize| array(&rng.uniform(batch * heads * lq * w, 1.0 / 8192.0), &[batch, heads, lq, w]);
    let (ql, qr, qi) = (q(rng, g.kv_lora_rank), q(rng, g.rope_head_dim), q(rng, g.index_head_dim));
    let weights = array(&rng.uniform(batch * lq * heads, 1.0), &[batch, lq, heads]);
    let (ours, theirs) = (cache.capture_donor_rows().unwrap(), fresh.capture_donor_rows().unwrap());
    for mode in [MaskMode::None, MaskMode::Causal] {
        let got = host(&ours.attend(&ql, &qr, 0.3, mode, None).unwrap());
        let want = host(&theirs.attend(&ql, &qr, 0.3, mode, None).unwrap());
        assert_eq!(got, want, "{what} {mode:?}: attention over the churned rows");
        let got = host(&ours.index_scores(&qi, &weights, mode).unwrap());
        let want = host(&theirs.index_scores(&qi, &weights, mode).unwrap());
        assert_eq!(got, want, "{what} {mode:?}: index scores over the churned rows");
    }
}

/// `requests` requests through a batch of `rows` rows with one spare slot: each step a row
/// leaves as `churn` says, a request joins, and every row appends one position.
fn churn_through(g: Geometry, churn: Churn, rows: usize, requests: usize, prefix: bool, seed: u64) {
    let kind = if prefix {
        " over a prefix"
    } else if g.hot_window > 0 {
        " composed"
    } else {
        ""
    };
    let what = format!("{churn:?} {:?} {:?}{kind}", g.layout, g.latent_storage);
    let tolerance = if g.latent_storage == StorageMode::F32 { 1e-5 } else { 2e-2 };
    let mut rng = Rng::new(seed);
    // Over a prefix: every request reads the same positions below its own.
    let (base, base_model) = request(g, &mut rng, 1, 12, false);
    let shared = prefix.then(|| {
        let n = base_model.len(0).min(9);
        let mut m = base_model.extract(0);
        m.truncate_row(0, n);
        (base.share_prefix(0, n).unwrap(), m)
    });
    let new_request = |rng: &mut Rng| match &shared {
        None => request(g, rng, 1, 40, false),
        Some((p, pm)) => {
            let (mut c, mut m) = (LatentCache::new(g).unwrap(), pm.clone());
            c.attach_prefix(p, 1).unwrap();
            let tokens = rng.range(1, 30);
            append(rng, &mut c, &mut m, 1, tokens);
            (c, m)
        }
    };
    let mut cache = LatentCache::new(g).unwrap();
    cache.reserve_rows(rows + 1).unwrap();
    let first: Vec<(LatentCache, Model)> = (0..rows).map(|_| new_request(&mut rng)).collect();
    cache.merge_rows(&first.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
    let mut model = Model::merge(&first.iter().map(|r| &r.1).collect::<Vec<_>>());
    for step in 0..requests {
        let gone = leaving(churn, &mut rng, rows);
        let keep: Vec<usize> = (0..rows).filter(|&r| r != gone).collect();
        cache.filter_rows(&keep).unwrap();
        model.filter(&keep);
        let (j, jm) = new_request(&mut rng);
        cache.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        append(&mut rng, &mut cache, &mut model, rows, 1);
        let what = format!("{what} step {step}");
        if g.hot_window > 0 {
            // Composed rows read their hot positions over the compact ones (the plain model
            // does not say which): attention as over the same rows merged afresh.
            if step % 5 == 4 {
                check_as_fresh(&cache, &mut rng, &what);
            }
            continue;
        }
        assert_matches(&cache, &model, &what);
        if step % 5 == 4 {
            check_views(&cache, &model, &what);
            check_attention(&cache, &model, &mut rng, tolerance, &what);
        }
    }
}

#[test]
fn churning_batches_read_and_attend_as_the_model() {
    use StorageMode::*;
    for layout in LAYOUTS {
        for churn in [Churn::FirstInFirstOut, Churn::LastInFirstOut, Churn::Anywhere] {
            churn_through(geometry([8, 4, 6], layout), churn, 6, 40, false, 41);
            churn_through(geometry_in([64, 32, 0], [Q8, Bf16, Bf16], layout), churn, 5, 20, false, 42);
            churn_through(geometry([8, 4, 6], layout), churn, 5, 20, true, 43);
            churn_through(composed_layer(64, 8, F32, [Q8, Bf16, Fp8], layout), churn, 5, 20, false, 44);
        }
    }
}
