//! The safetensors writer over what it may meet: every storage mode, both layouts, batches 1..8 with
//! padding, strided views (reserve), mid-round, after uneven rollbacks, zero-position rows and
//! donors sharing the buffers; save -> load bit-exact against the source cache, and
//! save_to_bytes equal to the file save writes.
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::Rng;

use latent_cache::core::persist;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};

fn width(mode: StorageMode, float: usize) -> usize {
    match mode {
        StorageMode::Q8 | StorageMode::Q4 => 64,
        StorageMode::Fp8 => 128,
        _ => float,
    }
}

fn geometry(modes: [StorageMode; 3], dsa: bool, layout: LayoutKind) -> Geometry {
    let widths = [width(modes[0], 5), width(modes[1], 3), if dsa { width(modes[2], 7) } else { 0 }];
    geometry_in(widths, modes, layout)
}

fn append(rng: &mut Rng, c: &mut LatentCache, batch: usize, tokens: usize, pads: Option<&[usize]>) {
    let g = *c.geometry();
    let keys = (g.index_head_dim > 0).then(|| rng.floats(batch * tokens * g.index_head_dim));
    let (l, r) = (rng.floats(batch * tokens * g.kv_lora_rank), rng.floats(batch * tokens * g.rope_head_dim));
    match pads {
        Some(p) => c.append_host_padded(batch, tokens, p, &l, &r, keys.as_deref()).unwrap(),
        None => c.append_host(batch, tokens, &l, &r, keys.as_deref()).unwrap(),
    }
}

/// A cache in one of several states; `donor` keeps a capture alive when asked.
fn scenario(rng: &mut Rng, g: Geometry, batch: usize, which: usize) -> LatentCache {
    let mut c = LatentCache::new(g).unwrap();
    if which == 7 {
        return c; // empty
    }
    if which % 2 == 1 {
        c.reserve(40).unwrap(); // capacity > offset: strided views
    }
    // Padded first append; the last row unpadded, row 0 may be all padding (zero positions).
    let tokens = 3 + which % 3;
    let pads: Vec<usize> = (0..batch)
        .map(|b| {
            if b + 1 == batch {
                0
            } else if b == 0 && which >= 4 {
                tokens
            } else {
                rng.range(0, tokens - 1)
            }
        })
        .collect();
    append(rng, &mut c, batch, tokens, Some(&pads));
    append(rng, &mut c, batch, 1 + which % 2, None);
    if which >= 2 {
        c.spec_round_begin().unwrap();
        append(rng, &mut c, batch, 3, None);
        let keep: Vec<usize> = (0..batch).map(|b| if b == 0 { 0 } else { rng.range(0, 3) }).collect();
        c.spec_round_rollback(&keep).unwrap();
    }
    if which == 3 || which == 5 {
        // Mid-round.
        c.spec_round_begin().unwrap();
        append(rng, &mut c, batch, 2, None);
    }
    if which == 6 {
        // Every position trimmed away: rows without positions.
        let n = c.row_offsets().into_iter().min().unwrap();
        c.trim(n, false).unwrap();
    }
    c
}

fn bits(c: &LatentCache, f: Family, row: usize) -> Vec<u32> {
    c.read_row(f, row).unwrap().iter().map(|v| v.to_bits()).collect()
}

fn assert_same(a: &LatentCache, b: &LatentCache, what: &str) {
    assert_eq!(a.geometry(), b.geometry(), "{what}");
    assert_eq!(a.batch_size(), b.batch_size(), "{what}");
    assert_eq!(a.offset(), b.offset(), "{what}");
    assert_eq!(a.left_pad(), b.left_pad(), "{what}");
    assert_eq!(a.row_ends(), b.row_ends(), "{what}");
    for f in Family::ALL {
        if a.geometry().width(f).is_none() {
            continue;
        }
        for row in 0..a.batch_size() {
            assert_eq!(bits(a, f, row), bits(b, f, row), "{what}: {} row {row}", f.name());
        }
    }
}

#[test]
fn every_mode_layout_batch_and_state_round_trips() {
    use StorageMode::*;
    let mut rng = Rng::new(77);
    let dir = std::env::temp_dir().join(format!("review-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mode_sets = [[F32; 3], [Bf16; 3], [F16; 3], [Q8; 3], [Q4; 3], [Fp8; 3], [Q4, Bf16, Fp8], [Fp8, F16, Q8]];
    let mut n = 0;
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for batch in 1..=8 {
            for which in 0..8 {
                let mut sources = Vec::new();
                let mut donors = Vec::new();
                for (k, modes) in mode_sets.iter().enumerate() {
                    let g = geometry(*modes, k % 2 == 0, layout);
                    let mut c = scenario(&mut rng, g, batch, which);
                    if which == 4 && c.batch_size() > 0 {
                        // A live donor shares the buffers; the cache appends (copying) after it.
                        donors.push(c.capture_donor_rows().unwrap());
                        append(&mut rng, &mut c, batch, 1, None);
                        donors.push(c.capture_donor_rows().unwrap());
                    }
                    sources.push(c);
                }
                let what = format!("{layout:?} batch {batch} scenario {which}");
                let path = dir.join("s.safetensors");
                if sources.iter().any(|c| c.in_spec_round()) {
                    // Files hold caches at rest: a save mid-round is refused, nothing written.
                    let refs: Vec<&LatentCache> = sources.iter().collect();
                    for e in [persist::save(&refs, &path).err(), persist::save_to_bytes(&refs).err()] {
                        assert_eq!(e.map(|e| e.kind), Some(latent_cache::ErrorKind::State), "{what}: a save mid-round");
                    }
                    for c in sources.iter_mut().filter(|c| c.in_spec_round()) {
                        c.spec_round_commit().unwrap();
                    }
                }
                let refs: Vec<&LatentCache> = sources.iter().collect();
                persist::save(&refs, &path).unwrap_or_else(|e| panic!("{what}: save: {e:?}"));
                let file = std::fs::read(&path).unwrap();
                let bytes = persist::save_to_bytes(&refs).unwrap();
                assert!(file == bytes, "{what}: save_to_bytes differs from the file ({} vs {} bytes)", bytes.len(), file.len());
                let loaded = persist::load(&path).unwrap_or_else(|e| panic!("{what}: load: {e:?}"));
                assert_eq!(loaded.len(), sources.len());
                for (i, (a, b)) in sources.iter().zip(&loaded).enumerate() {
                    assert_same(a, b, &format!("{what} layer {i}"));
                }
                // Both go on identically: one more append to each.
                for (i, (a, b)) in sources.iter_mut().zip(loaded).enumerate() {
                    let mut b = b;
                    if a.in_spec_round() {
                        a.spec_round_commit().unwrap();
                    }
                    let rows = a.batch_size().max(1);
                    let seed = rng.next();
                    append(&mut Rng::new(seed), a, rows, 2, None);
                    append(&mut Rng::new(seed), &mut b, rows, 2, None);
                    assert_same(a, &b, &format!("{what} layer {i} after an append"));
                }
                drop(donors);
                n += 1;
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(n, 2 * 8 * 8);
}
