//! Edge cases of padded batched prefills, each of which a review once found broken: what a
//! prepare must refuse up front, rows leaving or merging mid-prefill, and sets whose layers differ.
use crate::common::core_check::{assert_matches, model_of};
use crate::common::mlx_helpers::geometry as geometry_of;
use crate::common::model::{Model, Rng};
use latent_cache::core::cache::set::{change_all, merge_all};
use latent_cache::{ErrorKind, Geometry, LatentCache, LayoutKind};

fn geometry(layout: LayoutKind) -> Geometry {
    geometry_of([8, 4, 4], layout)
}

fn data(rng: &mut Rng, m: &Model, batch: usize, tokens: usize) -> [Vec<f32>; 3] {
    std::array::from_fn(|f| rng.floats(batch * tokens * m.widths[f]))
}

fn append(rng: &mut Rng, c: &mut LatentCache, m: &mut Model, batch: usize, tokens: usize) -> Result<(), ErrorKind> {
    let d = data(rng, m, batch, tokens);
    c.append_host(batch, tokens, &d[0], &d[1], Some(&d[2])).map_err(|e| e.kind)?;
    m.append(batch, tokens, &d);
    Ok(())
}

fn both_layouts() -> [LayoutKind; 2] {
    [LayoutKind::RightJustified, LayoutKind::Ragged]
}

/// A prepare whose left padding no append could take (no unpadded row) is refused at once,
/// instead of blocking every append until reset.
#[test]
fn left_padding_no_append_could_take_is_refused_at_prepare() {
    let g = geometry(LayoutKind::RightJustified);
    let mut c = LatentCache::new(g).unwrap();
    let r = c.prefill_prepare(None, Some(&[1, 1]), None);
    assert!(r.is_err(), "prepare accepted left padding [1, 1] that every append then refuses");
}

/// The prepared vectors bind the coming batch: a first append of another batch is refused.
#[test]
fn a_first_append_of_another_batch_than_prepared_is_refused() {
    let g = geometry(LayoutKind::RightJustified);
    let mut rng = Rng::new(3);
    let mut c = LatentCache::new(g).unwrap();
    let mut m = model_of(&g);
    c.prefill_prepare(Some(&[3, 3, 2]), None, Some(&[0, 0, 1])).unwrap();
    let r = append(&mut rng, &mut c, &mut m, 2, 3);
    assert!(r.is_err(), "a 2-row append after a 3-row prepare was accepted");
}

/// A row extracted mid-prefill before its right padding has arrived keeps its prompt: lengths say
/// row 1's prompt is 2 positions (padded by 2 at its end); after a first chunk of 2, row 1 holds
/// its whole prompt and none of its padding.
#[test]
fn extract_before_the_padding_arrived_keeps_the_prompt() {
    for layout in both_layouts() {
        let g = geometry(layout);
        let mut rng = Rng::new(5);
        let mut c = LatentCache::new(g).unwrap();
        let mut m = model_of(&g);
        c.prefill_prepare(Some(&[4, 2]), None, Some(&[0, 2])).unwrap();
        append(&mut rng, &mut c, &mut m, 2, 2).unwrap();
        let alone = c.extract_row(1).unwrap();
        assert_matches(&alone, &m.extract(1), &format!("{layout:?}: extract of row 1 after the first chunk"));
    }
}

/// A merge into a set (`merge_all`) whose layers are in a prefill: refused like a merge into one
/// cache, and nothing changes.
#[test]
fn set_merge_into_a_prefill_is_refused() {
    let g = geometry(LayoutKind::RightJustified);
    let mut rng = Rng::new(6);
    let mut dest = LatentCache::new(g).unwrap();
    dest.prefill_prepare(Some(&[2]), None, Some(&[0])).unwrap();
    let mut src = LatentCache::new(g).unwrap();
    let mut sm = model_of(&g);
    append(&mut rng, &mut src, &mut sm, 1, 2).unwrap();
    assert_eq!(dest.merge_rows(&[&src]).unwrap_err().kind, ErrorKind::State, "one cache refuses");
    let r = merge_all(&mut [&mut dest], &[vec![&src]]);
    assert!(r.is_err(), "merge_all into a cache in a prefill succeeded");
    assert!(dest.in_prefill(), "the prefill was dropped");
}

/// A set-wide finalize over layers that disagree about the prefill (one layer was prepared
/// alone) is refused, and no layer changes.
#[test]
fn a_set_whose_layers_differ_in_their_prefill_is_refused() {
    let g = geometry(LayoutKind::RightJustified);
    let mut rng = Rng::new(7);
    let mut a = LatentCache::new(g).unwrap();
    let mut b = LatentCache::new(g).unwrap();
    let mut ma = model_of(&g);
    let mut mb = model_of(&g);
    a.prefill_prepare(None, None, Some(&[1, 0])).unwrap();
    append(&mut rng, &mut a, &mut ma, 2, 3).unwrap();
    append(&mut rng, &mut b, &mut mb, 2, 3).unwrap();
    let r = change_all(&mut [&mut a, &mut b], LatentCache::prepare_prefill_finalize);
    assert_eq!(r.unwrap_err().kind, ErrorKind::State);
    assert_matches(&a, &ma, "layer 0 unchanged");
    assert_matches(&b, &mb, "layer 1 unchanged");
    assert!(a.in_prefill() && !b.in_prefill());
}

/// A merge from a source mid-prefill takes each row's prompt without its right padding, as
/// extract does.
#[test]
fn a_source_mid_prefill_merges_its_prompts() {
    let g = geometry(LayoutKind::RightJustified);
    let mut rng = Rng::new(8);
    let mut src = LatentCache::new(g).unwrap();
    let mut sm = model_of(&g);
    src.prefill_prepare(None, None, Some(&[2, 0])).unwrap();
    append(&mut rng, &mut src, &mut sm, 2, 4).unwrap();
    let extracted = src.extract_row(0).unwrap();
    let mut dest = LatentCache::new(g).unwrap();
    let r = dest.merge_rows(&[&src]);
    if r.is_ok() {
        assert_eq!(dest.row_offsets()[0], extracted.row_offsets()[0], "merge kept row 0's right padding that extract drops");
    }
}

/// `max_append_tokens` inside a padded prefill over composed storage, as the header documents
/// it: finite where an append could move a row's boundary, counted from the positions that
/// cannot be right padding (a row's last `right_padding[b]`, or those past its declared
/// prompt length, move none), and `usize::MAX` once no append can move one (every prompt in).
/// Checked against the boundary rule computed here (`composed_rule`) and by appending: that
/// many positions leave every boundary, one more moves one.
#[test]
fn max_append_tokens_inside_a_padded_prefill_counts_settled_positions() {
    use crate::common::composed_rule::{boundary, composed_layer};
    use latent_cache::StorageMode::{Bf16, F32, Q8};
    let hot_window = 64;
    let g = Geometry { index_head_dim: 0, ..composed_layer(64, hot_window, F32, [Q8, Bf16, F32], LayoutKind::RightJustified) };
    let mut rng = Rng::new(4242);
    let append = |cache: &mut LatentCache, rng: &mut Rng, tokens: usize| {
        let (latent, rope) = (rng.floats(2 * tokens * 64), rng.floats(2 * tokens * 64));
        cache.append_host(2, tokens, &latent, &rope, None).unwrap();
    };
    // The most an append may add before a row whose settled length after `n` more is
    // `settled(b, n)` moves its boundary (usize::MAX when none ever does within `horizon`).
    let rule = |cache: &LatentCache, settled: &dyn Fn(usize, usize) -> usize, horizon: usize| {
        let converted = cache.converted_positions();
        (0..2)
            .map(|b| (0..horizon).find(|&n| boundary(settled(b, n), hot_window) != converted[b]).map_or(usize::MAX, |n| n - 1))
            .min()
            .unwrap()
    };
    let observe = |cache: &mut LatentCache, rng: &mut Rng, most: usize| {
        let before = cache.converted_positions();
        append(cache, rng, most);
        assert_eq!(cache.converted_positions(), before, "{most} positions move no boundary");
        append(cache, rng, 1);
        assert_ne!(cache.converted_positions(), before, "one more moves one");
    };

    // Right padding: of rows holding 30 positions, the last 50 and 10 to come are padding.
    let right = [50, 10];
    let mut cache = LatentCache::new(g).unwrap();
    cache.prefill_prepare(None, None, Some(&right)).unwrap();
    append(&mut cache, &mut rng, 30);
    let held = cache.row_offsets();
    let most = rule(&cache, &|b, n| (held[b] + n).saturating_sub(right[b]), 1000);
    assert_eq!(most, 107, "row 1 settles 128 positions (its boundary moves to 64) after 108 more");
    assert_eq!(cache.max_append_tokens(), most, "inside a padded prefill: finite, from settled positions");
    observe(&mut cache, &mut rng, most);

    // Declared prompt lengths: positions past a row's prompt settle nothing.
    let lengths = [100, 140];
    let mut cache = LatentCache::new(g).unwrap();
    cache.prefill_prepare(Some(&lengths), None, None).unwrap();
    append(&mut cache, &mut rng, 100);
    let held = cache.row_offsets();
    let most = rule(&cache, &|b, n| (held[b] + n).min(lengths[b]), 1000);
    assert_eq!(most, 27);
    assert_eq!(cache.max_append_tokens(), most);
    observe(&mut cache, &mut rng, most);
    // Every prompt in (row 1 at 140): no append moves a boundary before finalize.
    append(&mut cache, &mut rng, 12);
    assert_eq!(cache.max_append_tokens(), usize::MAX, "every prompt is in");
    let before = cache.converted_positions();
    append(&mut cache, &mut rng, 300);
    assert_eq!(cache.converted_positions(), before, "positions past the prompts are padding");

    // Outside prefills the count is finite (a row of 30: its boundary moves at 128); inside a
    // speculative round it is SIZE_MAX (max_tokens 0), as the header says.
    let mut cache = LatentCache::new(g).unwrap();
    append(&mut cache, &mut rng, 30);
    assert_eq!(cache.max_append_tokens(), 97);
    cache.spec_round_begin().unwrap();
    assert_eq!(cache.max_append_tokens(), usize::MAX);
}
