//! Composed storage against a reference built without the library's composed code: two plain
//! models given the same operations, one holding what the compact modes read back and one what
//! the hot mode reads back, and each row's boundary computed from the documented rule (the
//! newest `hot_window` positions stay hot; boundaries move in blocks of 64, as a function of
//! the row's settled length: inside a round the positions it held when the round began, inside
//! a padded prefill those that cannot be right padding). After every step each
//! row's values equal, bit for bit, the compact model below the boundary and the hot model from
//! it on. Also: chunked prefills (with a sibling's forward split between chunks) against one
//! append, trims to `minimum_reusable_offset` against a fresh prefill, misuse refused with
//! nothing changed, the hot side staying the size of the window, and saves refused.
use crate::common::composed_ref::Reference;

use crate::common::composed_rule::{boundary, composed_layer, BLOCK};

use crate::common::core_check::widths;
use crate::common::model::{Model, Rng};

use latent_cache::core::persist;
use latent_cache::{ErrorKind, Family, Geometry, LatentCache, LayoutKind, StorageMode};

fn geometry(hot_window: usize, hot: StorageMode, modes: [StorageMode; 3], layout: LayoutKind) -> Geometry {
    composed_layer(64, hot_window, hot, modes, layout)
}

fn append(rng: &mut Rng, cache: &mut LatentCache, r: &mut Reference, batch: usize, tokens: usize) -> String {
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * r.compact.widths[f]));
    cache.append_host(batch, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
    r.both(|m| m.append(batch, tokens, &data));
    r.settle();
    format!("append {batch}x{tokens}")
}

fn run(seed: u64, g: Geometry, steps: usize) {
    let mut rng = Rng::new(seed);
    let mut batch = rng.range(1, 4);
    let mut cache = LatentCache::new(g).unwrap();
    let mut r = Reference::new(g);
    for i in 0..steps {
        let step = match rng.range(0, 11) {
            0..=3 => {
                let tokens = if rng.range(0, 3) == 0 { rng.range(1, 300) } else { rng.range(1, 20) };
                append(&mut rng, &mut cache, &mut r, batch, tokens)
            }
            4 if batch > 0 && !r.compact.rows.is_empty() => {
                let in_round = r.compact.round.is_some();
                let most = match in_round {
                    true => (0..batch).map(|b| r.compact.appended_in_round(b)).min().unwrap(),
                    false => r.compact.row_offsets().into_iter().min().unwrap(),
                };
                let n = rng.range(0, most);
                let bypass = in_round || rng.range(0, 3) == 0;
                let before = cache.converted_positions();
                match cache.trim(n, bypass) {
                    Ok(_) => {
                        assert!(bypass || r.reusable_trim(n), "trim {n} should be refused (seed {seed})");
                        r.both(|m| m.trim(n));
                        r.settle();
                    }
                    Err(e) => {
                        assert!(!bypass && !r.reusable_trim(n), "trim {n} refused: {} (seed {seed})", e.message);
                        assert_eq!(e.kind, ErrorKind::State);
                        assert_eq!(cache.converted_positions(), before);
                    }
                }
                format!("trim {n} bypass {bypass}")
            }
            5 if r.compact.round.is_none() && !r.compact.rows.is_empty() => {
                cache.spec_round_begin().unwrap();
                r.both(|m| m.begin());
                let tokens = rng.range(1, 8);
                append(&mut rng, &mut cache, &mut r, batch, tokens);
                "begin + append".into()
            }
            6 if r.compact.round.is_some() => {
                let keep: Vec<usize> = (0..batch).map(|b| rng.range(0, r.compact.appended_in_round(b))).collect();
                cache.spec_round_rollback(&keep).unwrap();
                r.both(|m| m.rollback(&keep));
                r.settle();
                format!("rollback {keep:?}")
            }
            7 if r.compact.round.is_some() => {
                cache.spec_round_commit().unwrap();
                r.both(|m| m.round = None);
                r.settle();
                "commit".into()
            }
            8 if r.compact.round.is_none() && r.compact.rows.len() > 1 => {
                let mut keep: Vec<usize> = (0..batch).filter(|_| rng.range(0, 2) > 0).collect();
                if keep.is_empty() {
                    keep.push(rng.range(0, batch - 1));
                }
                cache.filter_rows(&keep).unwrap();
                r.both(|m| m.filter(&keep));
                r.converted = keep.iter().map(|&b| r.converted[b]).collect();
                r.settle();
                batch = keep.len();
                format!("filter {keep:?}")
            }
            9 if r.compact.round.is_none() && !r.compact.rows.is_empty() => {
                // Extract a row and merge it back after the others: rows travel with their
                // boundaries.
                let row = rng.range(0, batch - 1);
                let single = cache.extract_row(row).unwrap();
                let mut merged = LatentCache::new(g).unwrap();
                merged.merge_rows(&[&cache, &single]).unwrap();
                cache = merged;
                let (ce, he) = (r.compact.extract(row), r.hot.extract(row));
                r.compact = Model::merge(&[&r.compact, &ce]);
                r.hot = Model::merge(&[&r.hot, &he]);
                let c = r.converted[row].min(r.compact.len(batch));
                r.converted.push(c);
                r.maintaining = false;
                r.settle();
                batch += 1;
                format!("extract {row} and merge it back")
            }
            10 => {
                if r.maintaining {
                    let rows: Vec<usize> = (0..r.compact.rows.len()).filter(|_| rng.range(0, 1) == 0).collect();
                    if rng.range(0, 1) == 0 && !r.compact.rows.is_empty() {
                        // Boundaries already follow the rows' lengths: a commit moves nothing.
                        cache.prefill_commit(&rows).unwrap();
                        format!("prefill_commit {rows:?}")
                    } else {
                        cache.prefill_end().unwrap();
                        r.maintaining = false;
                        r.settle();
                        "prefill_end".into()
                    }
                } else {
                    cache.prefill_begin().unwrap();
                    r.maintaining = true;
                    "prefill_begin".into()
                }
            }
            _ => continue,
        };
        if r.compact.rows.is_empty() {
            batch = batch.max(1);
        }
        r.check(&cache, &format!("step {i} ({step}), seed {seed}"));
    }
}

const Q8: StorageMode = StorageMode::Q8;
const Q4: StorageMode = StorageMode::Q4;
const FP8: StorageMode = StorageMode::Fp8;
const BF16: StorageMode = StorageMode::Bf16;
const F32: StorageMode = StorageMode::F32;

#[test]
fn random_sequences_match_the_reference_in_both_layouts() {
    for seed in 0..12 {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            let hot_window = [1, 10, 70, 200][seed as usize % 4];
            run(seed, geometry(hot_window, F32, [Q8, BF16, FP8], layout), 40);
            run(seed + 100, geometry(hot_window, BF16, [Q4, BF16, Q8], layout), 30);
        }
    }
}

#[test]
fn refused_compositions() {
    let refused = |g: Geometry| LatentCache::new(g).map(drop).unwrap_err().kind;
    assert_eq!(refused(geometry(64, F32, [F32, F32, F32], LayoutKind::RightJustified)), ErrorKind::InvalidArgument);
    assert_eq!(refused(geometry(64, Q8, [Q8, F32, F32], LayoutKind::RightJustified)), ErrorKind::InvalidArgument);
    assert_eq!(refused(geometry(64, BF16, [Q8, F32, Q8], LayoutKind::RightJustified)), ErrorKind::InvalidArgument);
    let g = geometry(64, BF16, [Q8, BF16, Q8], LayoutKind::RightJustified);
    assert!(LatentCache::new(g).is_ok());
    assert!(!g.is_composed(Family::Rope) && g.is_composed(Family::Latent));
    assert_eq!(g.signature(), "kv:composed:bf16:64:kv:mla-storage:q8-bf16-q8:kv:mla:target:dsa");
}

/// `rows` prompts prefilled as one padded append, and in chunks with maintenance: row 0's
/// prompt ends first and is committed there, while its siblings' forwards go on in chunks.
#[test]
fn chunked_prefill_with_a_sibling_split_equals_one_append() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for (hot_window, chunk) in [(100, 37), (1, 64), (500, 250), (64, 1000)] {
            let g = geometry(hot_window, F32, [Q8, BF16, FP8], layout);
            let mut rng = Rng::new(hot_window as u64);
            let prompts = [700usize, 1000, 900];
            let longest = 1000;
            let pads: Vec<usize> = prompts.iter().map(|p| longest - p).collect();
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * longest * widths(&g)[f]));
            let mut whole = LatentCache::new(g).unwrap();
            whole.append_host_padded(3, longest, &pads, &data[0], &data[1], Some(&data[2])).unwrap();

            let mut chunked = LatentCache::new(g).unwrap();
            chunked.prefill_begin().unwrap();
            let slice = |f: usize, lo: usize, hi: usize| -> Vec<f32> {
                let w = widths(&g)[f];
                (0..3).flat_map(|b| data[f][(b * longest + lo) * w..(b * longest + hi) * w].to_vec()).collect()
            };
            let mut at = 0;
            while at < longest {
                // The first chunk reaches every row's first position (padding alone is no append).
                let end = if at == 0 { chunk.max(longest - 700 + 1) } else { at + chunk }.min(longest);
                let part: [Vec<f32>; 3] = std::array::from_fn(|f| slice(f, at, end));
                if at == 0 {
                    chunked.append_host_padded(3, end, &pads, &part[0], &part[1], Some(&part[2])).unwrap();
                } else {
                    chunked.append_host(3, end - at, &part[0], &part[1], Some(&part[2])).unwrap();
                }
                at = end;
                // Boundaries follow every row's length at every chunk.
                let expected: Vec<usize> = pads.iter().map(|&p| boundary(end.saturating_sub(p), hot_window)).collect();
                assert_eq!(chunked.converted_positions(), expected, "hot {hot_window} chunk {chunk}");
            }
            chunked.prefill_commit(&[0, 1, 2]).unwrap();
            chunked.prefill_end().unwrap();
            assert_eq!(chunked.converted_positions(), whole.converted_positions());
            let expected: Vec<usize> = prompts.iter().map(|&p| boundary(p, hot_window)).collect();
            assert_eq!(whole.converted_positions(), expected);
            for family in Family::ALL {
                for row in 0..3 {
                    let a: Vec<u32> = whole.read_row(family, row).unwrap().iter().map(|v| v.to_bits()).collect();
                    let b: Vec<u32> = chunked.read_row(family, row).unwrap().iter().map(|v| v.to_bits()).collect();
                    assert_eq!(a, b, "{} row {row}, hot {hot_window} chunk {chunk} {layout:?}", family.name());
                }
            }
        }
    }
}

/// A padded batched prefill (left and right padding, in chunks) on composed storage: mid-prefill
/// boundaries count only positions that cannot be right padding; after finalize each row holds
/// its prompt, with the boundary its prompt's length gives, in both layouts.
#[test]
fn padded_prefill_with_right_padding_converts_at_finalize() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = geometry(20, F32, [Q8, BF16, FP8], layout);
        let mut rng = Rng::new(11);
        let (left, right) = ([0usize, 100, 30], [0usize, 40, 150]);
        let (mut cache, mut r) = (LatentCache::new(g).unwrap(), Reference::new(g));
        cache.prefill_prepare(None, Some(&left), Some(&right)).unwrap();
        r.right = Some(right.to_vec());
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * 200 * r.compact.widths[f]));
        cache.append_host_padded(3, 200, &left, &data[0], &data[1], Some(&data[2])).unwrap();
        r.both(|m| m.append_padded(3, 200, &left, &data));
        r.settle();
        for tokens in [37, 1, 150] {
            append(&mut rng, &mut cache, &mut r, 3, tokens);
            // Mid-prefill a row's boundary counts only positions that cannot be right padding.
            let expected: Vec<usize> = (0..3).map(|b| boundary(r.compact.len(b).saturating_sub(right[b]), 20)).collect();
            assert_eq!(cache.converted_positions(), expected, "{layout:?} mid-prefill");
            r.check(&cache, &format!("{layout:?} mid-prefill"));
        }
        cache.prefill_finalize().unwrap();
        r.right = None;
        for (b, &drop) in right.iter().enumerate() {
            let len = r.compact.len(b);
            r.both(|m| m.truncate_row(b, len - drop));
        }
        r.settle();
        let lengths = r.compact.row_offsets();
        assert_eq!(cache.converted_positions(), lengths.iter().map(|&l| boundary(l, 20)).collect::<Vec<_>>());
        r.check(&cache, &format!("{layout:?} after finalize"));
        // And it goes on decoding.
        for _ in 0..70 {
            append(&mut rng, &mut cache, &mut r, 3, 1);
        }
        r.check(&cache, &format!("{layout:?} after decoding"));
    }
}

/// Prefill maintenance defers nothing here (a boundary move copies nothing): through a long
/// chunked prefill under maintenance, boundaries follow the rows' lengths and the hot side stays
/// the size of the window; commit and end keep the seed's protocol.
#[test]
fn maintenance_keeps_the_hot_side_the_size_of_the_window() {
    let g = geometry(100, F32, [Q8, BF16, FP8], LayoutKind::Ragged);
    let compact_only = Geometry { hot_window: 0, ..g };
    let mut rng = Rng::new(7);
    let (mut cache, mut compact) = (LatentCache::new(g).unwrap(), LatentCache::new(compact_only).unwrap());
    cache.prefill_begin().unwrap();
    let per_position: usize = widths(&g).iter().sum::<usize>() * 4;
    for chunk in 0..20 {
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * 250 * widths(&g)[f]));
        for c in [&mut cache, &mut compact] {
            c.append_host(2, 250, &data[0], &data[1], Some(&data[2])).unwrap();
        }
        let len = 250 * (chunk + 1);
        assert_eq!(cache.converted_positions(), vec![boundary(len, 100); 2]);
        let hot = cache.bytes_in_use() - compact.bytes_in_use();
        assert!(hot <= 2 * 2 * (100 + BLOCK + 250) * per_position, "chunk {chunk}: hot side {hot} bytes");
    }
    cache.prefill_commit(&[0]).unwrap();
    assert_eq!(cache.prefill_commit(&[2]).unwrap_err().kind, ErrorKind::OutOfRange);
    cache.prefill_end().unwrap();
    assert_eq!(cache.converted_positions(), vec![boundary(5000, 100); 2]);
}

#[test]
fn trim_to_the_minimum_reusable_offset_equals_a_fresh_prefill() {
    for hot_window in [1, 50, 64, 130] {
        let g = geometry(hot_window, F32, [Q8, BF16, FP8], LayoutKind::RightJustified);
        let mut rng = Rng::new(hot_window as u64);
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(1000 * widths(&g)[f]));
        let mut cache = LatentCache::new(g).unwrap();
        cache.append_host(1, 1000, &data[0], &data[1], Some(&data[2])).unwrap();
        let m = cache.minimum_reusable_offset();
        assert!(m > 0 && m < 1000, "hot {hot_window}: {m}");
        // One more position is refused, with nothing changed.
        let err = cache.trim(1000 - m + 1, false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::State, "{}", err.message);
        assert_eq!(cache.offset(), 1000);
        cache.trim(1000 - m, false).unwrap();
        let prefix = |f: usize| data[f][..m * widths(&g)[f]].to_vec();
        let mut fresh = LatentCache::new(g).unwrap();
        fresh.append_host(1, m, &prefix(0), &prefix(1), Some(&prefix(2))).unwrap();
        assert_eq!(cache.converted_positions(), fresh.converted_positions());
        for family in Family::ALL {
            let a: Vec<u32> = cache.read_row(family, 0).unwrap().iter().map(|v| v.to_bits()).collect();
            let b: Vec<u32> = fresh.read_row(family, 0).unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(a, b, "{} hot {hot_window}", family.name());
        }
        // With bypass the trim goes through and the boundary stops at the row's end.
        cache.trim(m - 1, true).unwrap();
        assert_eq!(cache.converted_positions(), vec![boundary(1000, hot_window).min(1)]);
    }
}

#[test]
fn maintenance_misuse_is_refused_with_nothing_changed() {
    let g = geometry(10, F32, [Q8, BF16, FP8], LayoutKind::RightJustified);
    let mut cache = LatentCache::new(g).unwrap();
    assert_eq!(cache.prefill_commit(&[]).unwrap_err().kind, ErrorKind::State);
    assert_eq!(cache.prefill_end().unwrap_err().kind, ErrorKind::State);
    cache.prefill_begin().unwrap();
    assert_eq!(cache.prefill_begin().unwrap_err().kind, ErrorKind::State);
    assert!(cache.in_prefill_maintenance());
    cache.prefill_end().unwrap();
    assert!(!cache.in_prefill_maintenance());
    // The same calls on a cache that is not composed record the state alike.
    let mut plain = LatentCache::new(Geometry { hot_window: 0, ..g }).unwrap();
    plain.prefill_begin().unwrap();
    assert_eq!(plain.prefill_begin().unwrap_err().kind, ErrorKind::State);
    plain.prefill_end().unwrap();
    assert!(plain.converted_positions().is_empty());
}

#[test]
fn max_append_tokens_counts_to_the_next_boundary_move() {
    let g = geometry(100, F32, [Q8, BF16, FP8], LayoutKind::RightJustified);
    let mut rng = Rng::new(3);
    let mut cache = LatentCache::new(g).unwrap();
    let mut r = Reference::new(g);
    for tokens in [5, 150, 1, 63, 64, 200] {
        append(&mut rng, &mut cache, &mut r, 1, tokens);
        let n = cache.max_append_tokens();
        let len = cache.offset();
        assert_eq!(boundary(len + n, 100), boundary(len, 100), "after {len}");
        assert!(boundary(len + n + 1, 100) > boundary(len, 100), "after {len}");
    }
}

/// The hot side holds about the hot window per row, not the history: after a long prefill and
/// a long decode, a composed cache holds no more than a cache of the compact modes alone plus
/// a bounded window of hot positions.
#[test]
fn the_hot_side_stays_the_size_of_the_window() {
    let g = geometry(256, F32, [Q8, BF16, FP8], LayoutKind::RightJustified);
    let compact_only = Geometry { hot_window: 0, ..g };
    let (mut composed, mut compact) = (LatentCache::new(g).unwrap(), LatentCache::new(compact_only).unwrap());
    let mut rng = Rng::new(5);
    let per_position: usize = widths(&g).iter().sum::<usize>() * 4;
    let mut step = |tokens: usize| {
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * widths(&g)[f]));
        for cache in [&mut composed, &mut compact] {
            cache.append_host(2, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
        }
    };
    step(6000);
    for _ in 0..1500 {
        step(1);
    }
    let hot = composed.bytes_in_use() - compact.bytes_in_use();
    // Growth doubles what a row must hold hot: at most twice (window + block), or the minimum.
    let bound = 2 * 2 * (256 + 2 * BLOCK).max(256) * per_position;
    assert!(hot <= bound, "hot side {hot} bytes, bound {bound}");
    assert!(hot > 0);
}

/// A composed cache saved and loaded holds the same state (every row bit for bit, the same
/// boundaries and hot side), and goes on exactly as the original: both layouts, rows of
/// different lengths, a trim with bypass behind them.
#[test]
fn saves_hold_the_hot_side_and_loads_go_on_alike() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = geometry(30, F32, [Q8, BF16, FP8], layout);
        let mut rng = Rng::new(21);
        let (mut cache, mut r) = (LatentCache::new(g).unwrap(), Reference::new(g));
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * 300 * r.compact.widths[f]));
        cache.append_host_padded(2, 300, &[0, 120], &data[0], &data[1], Some(&data[2])).unwrap();
        r.both(|m| m.append_padded(2, 300, &[0, 120], &data));
        r.settle();
        cache.trim(40, true).unwrap();
        r.both(|m| m.trim(40));
        r.settle();
        append(&mut rng, &mut cache, &mut r, 2, 7);
        let bytes = persist::save_to_bytes(&[&cache]).unwrap();
        let mut loaded = persist::load_from_bytes(&bytes).unwrap().pop().unwrap();
        assert_eq!(loaded.signature(), cache.signature());
        r.check(&loaded, &format!("{layout:?} loaded"));
        let mut r2 = r.clone();
        for tokens in [1, 90, 3, 200] {
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * r.compact.widths[f]));
            for (c, r) in [(&mut cache, &mut r), (&mut loaded, &mut r2)] {
                c.append_host(2, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
                r.both(|m| m.append(2, tokens, &data));
                r.settle();
                r.check(c, &format!("{layout:?} after {tokens} more"));
            }
        }
    }
}

/// Files with a composed layer are format 3 (older readers refuse them rather than load them
/// without their hot side); files without one stay format 2.
#[test]
fn composed_files_are_format_3() {
    let version = |cache: &LatentCache| {
        let bytes = persist::save_to_bytes(&[cache]).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(bytes[8..8 + header_len].to_vec()).unwrap();
        let at = header.find("\"0.latent_cache.format\":\"").unwrap() + 25;
        header[at..at + 1].to_string()
    };
    let mut rng = Rng::new(2);
    for (hot_window, want) in [(10, "3"), (0, "2")] {
        let g = geometry(hot_window, F32, [Q8, BF16, FP8], LayoutKind::RightJustified);
        let (mut cache, mut r) = (LatentCache::new(g).unwrap(), Reference::new(g));
        append(&mut rng, &mut cache, &mut r, 1, 100);
        assert_eq!(version(&cache), want, "hot_window {hot_window}");
    }
}

/// The hot side holds only the composed families: rope stored in the hot mode itself is kept in
/// the main storage alone (its values are there already), so with the same appends the hot side
/// is the composed families' share of what it is when rope is composed too.
#[test]
fn the_hot_side_holds_only_the_composed_families() {
    let hot_bytes = |modes: [StorageMode; 3]| {
        let g = geometry(64, BF16, modes, LayoutKind::RightJustified);
        let compact_only = Geometry { hot_window: 0, ..g };
        let (mut composed, mut compact) = (LatentCache::new(g).unwrap(), LatentCache::new(compact_only).unwrap());
        let mut rng = Rng::new(11);
        for tokens in [300, 1, 1, 40, 1] {
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * widths(&g)[f]));
            for cache in [&mut composed, &mut compact] {
                cache.append_host(2, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
            }
        }
        (composed.bytes_in_use() - compact.bytes_in_use(), widths(&g))
    };
    let (rope_kept_out, w) = hot_bytes([Q8, BF16, Q8]);
    let (rope_composed, _) = hot_bytes([Q8, Q8, Q8]);
    assert!(rope_kept_out > 0);
    assert_eq!(rope_kept_out * (w[0] + w[1] + w[2]), rope_composed * (w[0] + w[2]), "hot side bytes");
}
