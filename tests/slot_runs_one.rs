//! `LATENT_CACHE_SLOT_RUNS=1` (read once per process, so its own binary): every batch stays in
//! one run of slots, whatever order requests leave and join in. A first-in-first-out join then
//! moves the rows back into one run (as before runs of slots) and attention reads one run; the
//! stored values and the attention still match the reference model and a fresh merge.
#[path = "common/mod.rs"]
mod common;

use common::core_check::{assert_matches, model_of};
use common::mlx_helpers::{array, geometry, host};
use common::model::{Model, Rng};
use latent_cache::core::attention::MaskMode;
use latent_cache::core::layout::slots::run_limit;
use latent_cache::{LatentCache, LayoutKind};

/// A one-row request of `tokens` positions and its model.
fn request(rng: &mut Rng, tokens: usize) -> (LatentCache, Model) {
    let g = geometry([8, 4, 6], LayoutKind::Ragged);
    let (mut cache, mut model) = (LatentCache::new(g).unwrap(), model_of(&g));
    let d: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(tokens * model.widths[f]));
    cache.append_host(1, tokens, &d[0], &d[1], Some(&d[2])).unwrap();
    model.append(1, tokens, &d);
    (cache, model)
}

#[test]
fn one_run_of_slots_when_the_process_asks() {
    std::env::set_var("LATENT_CACHE_SLOT_RUNS", "1");
    assert_eq!(run_limit(), 1);
    let mut rng = Rng::new(7);
    let first: Vec<(LatentCache, Model)> = (0..6).map(|_| request(&mut rng, 20)).collect();
    let mut batch = LatentCache::new(*first[0].0.geometry()).unwrap();
    batch.reserve_rows(7).unwrap();
    batch.merge_rows(&first.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
    let mut model = Model::merge(&first.iter().map(|r| &r.1).collect::<Vec<_>>());
    for step in 0..20 {
        // The oldest leaves (step even) or one from the middle with the order kept.
        let gone = if step % 2 == 0 { 0 } else { 2 };
        let keep: Vec<usize> = (0..6).filter(|&r| r != gone).collect();
        batch.filter_rows(&keep).unwrap();
        model.filter(&keep);
        let (j, jm) = request(&mut rng, 5 + step);
        batch.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        assert_matches(&batch, &model, &format!("step {step}"));
    }
    // Attention over the batch equals attention over the same rows merged afresh.
    let rows: Vec<LatentCache> = (0..6).map(|b| batch.extract_row(b).unwrap()).collect();
    let mut fresh = LatentCache::new(*batch.geometry()).unwrap();
    fresh.merge_rows(&rows.iter().collect::<Vec<_>>()).unwrap();
    let q = |rng: &mut Rng, w: usize| array(&rng.uniform(6 * 2 * w, 1.0 / 8192.0), &[6, 2, 1, w]);
    let (ql, qr) = (q(&mut rng, 8), q(&mut rng, 4));
    let got = host(&batch.capture_donor_rows().unwrap().attend(&ql, &qr, 0.3, MaskMode::None, None).unwrap());
    let want = host(&fresh.capture_donor_rows().unwrap().attend(&ql, &qr, 0.3, MaskMode::None, None).unwrap());
    assert_eq!(got, want);
}
