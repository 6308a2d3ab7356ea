//! Requests joining and leaving a running batch, as MLX counts memory (its active and peak
//! memory, not the library's arithmetic): a row joining into a free slot, wherever it lies,
//! allocates about its own positions and nothing stays allocated after; a row leaving allocates
//! nothing (every kept row stays in its slot); batches through which requests churn in any order
//! keep to that. A batch rebuilt whole would allocate every row. Values are checked against
//! plain vectors. Its own binary: MLX's counters are process-wide.
mod common;

use common::mlx_helpers::released;
use latent_cache::core::mlx::eval::eval;
use latent_cache::core::mlx::memory;
use latent_cache::core::mlx::ops;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};

const WIDTHS: [usize; 2] = [512, 64];

/// MLX's counters are process-wide: the tests here measure one at a time.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());
const ROW: usize = 4096;

/// `n` positions of one row whose every value is `seed` (latent) and `-seed` (rope).
fn positions(n: usize, seed: f32) -> [mlx_rs::Array; 2] {
    let make = |w: usize, v: f32| ops::from_host(&vec![v; n * w], &[1, n, w], "positions").unwrap();
    let out = [make(WIDTHS[0], seed), make(WIDTHS[1], -seed)];
    eval(out.iter()).unwrap();
    out
}

fn request(g: Geometry, n: usize, seed: f32) -> LatentCache {
    let mut cache = LatentCache::new(g).unwrap();
    let [latent, rope] = positions(n, seed);
    cache.append(&latent, &rope, None).unwrap();
    cache.eval().unwrap();
    cache
}

fn settle() -> usize {
    let active = released();
    memory::reset_peak().unwrap();
    active
}

/// What one call allocated while it ran (peak above the start) and kept (active after).
fn measure(f: impl FnOnce()) -> (usize, isize) {
    let before = settle();
    f();
    let info = memory::info();
    (info.peak.saturating_sub(before), released() as isize - before as isize)
}

/// Every row's values equal its request's seed, and the rows' lengths are `lengths`.
fn check(cache: &LatentCache, seeds: &[f32], lengths: &[usize], what: &str) {
    assert_eq!(cache.row_offsets(), lengths, "{what}: lengths");
    for (row, (&seed, &len)) in seeds.iter().zip(lengths).enumerate() {
        let latent = cache.read_row(Family::Latent, row).unwrap();
        let rope = cache.read_row(Family::Rope, row).unwrap();
        assert_eq!(latent.len(), len * WIDTHS[0], "{what}: row {row}");
        assert!(latent.iter().all(|&v| v == seed) && rope.iter().all(|&v| v == -seed), "{what}: row {row} values");
    }
}

fn run(g: Geometry) {
    let layout = g.layout;
    let row_bytes = ROW * g.bytes_per_token();
    // Composed storage rebuilds its hot rows (about a window and a growth step each, float32)
    // at every join and leave: up to 4 rows of that on top.
    let hot_rows = match g.hot_window {
        0 => 0,
        window => 4 * (window + 64 + 256) * (WIDTHS[0] + WIDTHS[1]) * 4,
    };
    let slack = row_bytes / 4 + hot_rows;
    let what = format!("{layout:?}{}", if g.hot_window > 0 { " composed" } else { "" });
    // A running batch of three requests (the last the longest), with room for four rows.
    let (a, b, c) = (request(g, ROW / 2, 1.0), request(g, ROW / 4, 2.0), request(g, ROW, 3.0));
    let mut batch = LatentCache::new(g).unwrap();
    batch.reserve(ROW + 64).unwrap();
    batch.reserve_rows(4).unwrap();
    batch.merge_rows(&[&a, &b, &c]).unwrap();
    batch.eval().unwrap();
    drop((a, b, c));
    let held = batch.bytes_in_use();
    check(&batch, &[1.0, 2.0, 3.0], &[ROW / 2, ROW / 4, ROW], &what);

    // A request joins into the free slot: about its own positions while it runs, none after.
    let d = request(g, ROW / 2, 4.0);
    let (peak, kept) = measure(|| {
        batch.merge_rows(&[&d]).unwrap();
        batch.eval().unwrap();
    });
    assert!(peak <= row_bytes / 2 + slack, "{what}: a join allocated {peak} bytes for a {}-byte row", row_bytes / 2);
    assert!(kept <= slack as isize, "{what}: a join kept {kept} bytes");
    assert!(batch.bytes_in_use().abs_diff(held) <= hot_rows, "{what}: the join took the free slot");
    check(&batch, &[1.0, 2.0, 3.0, 4.0], &[ROW / 2, ROW / 4, ROW, ROW / 2], &what);

    // Leaves copy nothing: the first request leaves with the last row put first (each row
    // stays in its slot, read in two runs), then the first row with the order kept, then the
    // last row (the longest: the others drop the padding they no longer need).
    let nothing_moves = |batch: &mut LatentCache, keep: &[usize]| {
        let (peak, kept) = measure(|| {
            batch.filter_rows(keep).unwrap();
            batch.eval().unwrap();
        });
        assert!(peak <= slack, "{what}: filter {keep:?} allocated {peak} bytes");
        assert!(kept <= slack as isize, "{what}: filter {keep:?} kept {kept} bytes");
    };
    nothing_moves(&mut batch, &[3, 1, 2]);
    check(&batch, &[4.0, 2.0, 3.0], &[ROW / 2, ROW / 4, ROW], &what);
    nothing_moves(&mut batch, &[1, 2]);
    check(&batch, &[2.0, 3.0], &[ROW / 4, ROW], &what);

    // Two requests join into the slots before the rows (the rows wrap around their slots):
    // their own positions only.
    let tiny = request(g, 8, 7.0);
    let (peak, _) = measure(|| {
        batch.merge_rows(&[&tiny, &tiny]).unwrap();
        batch.eval().unwrap();
    });
    assert!(peak <= slack, "{what}: two joins of 8 positions allocated {peak} bytes");
    check(&batch, &[2.0, 3.0, 7.0, 7.0], &[ROW / 4, ROW, 8, 8], &what);
    assert!(batch.bytes_in_use().abs_diff(held) <= hot_rows, "{what}: the rows moved within their slots");

    // The two leave from the back, then the longest: nothing moves.
    nothing_moves(&mut batch, &[0, 1]);
    nothing_moves(&mut batch, &[0]);
    check(&batch, &[2.0], &[ROW / 4], &what);
    assert!(batch.bytes_in_use().abs_diff(held) <= hot_rows, "{what}: leaving rows keep their slots");

    // Two requests join the freed slots, one longer than the rows there (right-justified, they
    // shift right alike: position 0 moves back over the padding dropped before), and the batch
    // goes on appending.
    let (e, f) = (request(g, ROW, 5.0), request(g, 8, 6.0));
    let (peak, _) = measure(|| {
        batch.merge_rows(&[&e, &f]).unwrap();
        batch.eval().unwrap();
    });
    assert!(peak <= row_bytes + slack, "{what}: a join of {} positions allocated {peak} bytes", ROW + 8);
    assert!(batch.bytes_in_use().abs_diff(held) <= hot_rows, "{what}: the joins took free slots");
    check(&batch, &[2.0, 5.0, 6.0], &[ROW / 4, ROW, 8], &what);
    for _ in 0..3 {
        let latent = ops::from_host(&vec![7.0; 3 * WIDTHS[0]], &[3, 1, WIDTHS[0]], "latent").unwrap();
        let rope = ops::from_host(&vec![-7.0; 3 * WIDTHS[1]], &[3, 1, WIDTHS[1]], "rope").unwrap();
        batch.append(&latent, &rope, None).unwrap();
    }
    batch.eval().unwrap();
    assert_eq!(batch.row_offsets(), vec![ROW / 4 + 3, ROW + 3, 11], "{what}: appends after joins");
    let last = batch.read_row(Family::Latent, 2).unwrap();
    assert!(
        last[..8 * WIDTHS[0]].iter().all(|&v| v == 6.0) && last[8 * WIDTHS[0]..].iter().all(|&v| v == 7.0),
        "{what}: the joined row's appends"
    );

    // Without free slots, a join rebuilds the batch (every row copied): shown, not hidden.
    let (peak, _) = measure(|| {
        let g2 = request(g, 8, 8.0);
        batch.merge_rows(&[&g2, &g2]).unwrap();
        batch.eval().unwrap();
    });
    assert!(peak > 2 * row_bytes, "{what}: a join without a free slot allocated only {peak} bytes");
    assert_eq!(batch.batch_size(), 5);

    // Four leave; shrinking releases their slots' memory (the row left is copied once).
    batch.filter_rows(&[1]).unwrap();
    let slot_bytes = batch.bytes_in_use() / 5;
    let (_, kept) = measure(|| {
        batch.shrink_rows().unwrap();
        batch.eval().unwrap();
    });
    assert!(batch.bytes_in_use().abs_diff(slot_bytes) <= hot_rows, "{what}: one slot left");
    let released = -kept + hot_rows as isize;
    assert!(released >= 3 * slot_bytes as isize, "{what}: shrinking 5 slots to 1 released only {} bytes", -kept);
    assert_eq!(batch.row_offsets(), vec![ROW + 3], "{what}: the row left after shrinking");
    let row = batch.read_row(Family::Latent, 0).unwrap();
    let (old, new) = row.split_at(ROW * WIDTHS[0]);
    assert!(old.iter().all(|&v| v == 5.0) && new.iter().all(|&v| v == 7.0), "{what}: the row's values after shrinking");
}

#[test]
fn rows_join_and_leave_at_the_cost_of_their_own_positions() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = Geometry { kv_lora_rank: WIDTHS[0], rope_head_dim: WIDTHS[1], layout, ..Geometry::default() };
        run(g);
        // Composed: bfloat16 history under a float32 hot window, whose rows (about a window
        // each) are rebuilt by every join and leave; the history is not.
        let bf16 = StorageMode::Bf16;
        run(Geometry { latent_storage: bf16, rope_storage: bf16, hot_window: 64, hot_storage: StorageMode::F32, ..g });
    }
}

/// A batch of 16 requests with one spare slot, through which 24 more pass: each step one leaves
/// (the oldest, the newest, or any with the order kept) and one joins. Every join and leave
/// allocates about one row's positions at most (none to leave), whatever the order: the rows
/// wrap around their slots or leave holes and are read where they lie. Leaves from anywhere
/// gather the rows into one run once every few steps (a move of part of the batch): at most a
/// third of the steps. Attention over the wrapped batch reads each run in place: it allocates
/// far less than the batch holds.
#[test]
fn churning_batches_join_and_leave_at_the_cost_of_one_row() {
    use latent_cache::core::attention::MaskMode;
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let n = ROW / 4;
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = Geometry { kv_lora_rank: WIDTHS[0], rope_head_dim: WIDTHS[1], layout, ..Geometry::default() };
        let row_bytes = n * g.bytes_per_token();
        for churn in ["first in, first out", "last in, first out", "anywhere"] {
            let what = format!("{layout:?} {churn}");
            let mut seeds: Vec<f32> = (1..=16).map(|s| s as f32).collect();
            let mut batch = LatentCache::new(g).unwrap();
            batch.reserve(n + 64).unwrap();
            batch.reserve_rows(17).unwrap();
            let first: Vec<LatentCache> = seeds.iter().map(|&s| request(g, n, s)).collect();
            batch.merge_rows(&first.iter().collect::<Vec<_>>()).unwrap();
            batch.eval().unwrap();
            drop(first);
            let (mut costly, mut pick) = (0, 7usize);
            for step in 0..24 {
                pick = (pick * 5 + 3) % 16;
                let gone = match churn {
                    "first in, first out" => 0,
                    "last in, first out" => 15,
                    _ => pick,
                };
                let keep: Vec<usize> = (0..16).filter(|&r| r != gone).collect();
                let (leave, _) = measure(|| {
                    batch.filter_rows(&keep).unwrap();
                    batch.eval().unwrap();
                });
                seeds.remove(gone);
                let seed = 100.0 + step as f32;
                let joining = request(g, n, seed);
                let (join, kept) = measure(|| {
                    batch.merge_rows(&[&joining]).unwrap();
                    batch.eval().unwrap();
                });
                seeds.push(seed);
                check(&batch, &seeds, &[n; 16], &format!("{what} step {step}"));
                assert!(kept <= (row_bytes / 4) as isize, "{what} step {step}: a join kept {kept} bytes");
                let one_row = row_bytes + row_bytes / 4;
                match churn {
                    "anywhere" => costly += usize::from(leave > one_row || join > one_row),
                    _ => {
                        assert!(leave <= row_bytes / 4, "{what} step {step}: a leave allocated {leave} bytes");
                        assert!(join <= one_row, "{what} step {step}: a join allocated {join} bytes ({row_bytes} a row)");
                    }
                }
            }
            assert!(costly <= 8, "{what}: {costly} of 24 steps moved more than one row");
            // One decode query per row, four heads, over the batch as it lies.
            let q = |w: usize| ops::from_host(&vec![0.001; 16 * 4 * w], &[16, 4, 1, w], "q").unwrap();
            let (q_latent, q_rope) = (q(WIDTHS[0]), q(WIDTHS[1]));
            let (attended, _) = measure(|| {
                let donor = batch.capture_donor_rows().unwrap();
                let out = donor.attend(&q_latent, &q_rope, 0.1, MaskMode::None, None).unwrap();
                eval([&out]).unwrap();
            });
            assert!(
                attended < 16 * row_bytes / 4,
                "{what}: attention allocated {attended} bytes over a {}-byte batch",
                16 * row_bytes
            );
        }
    }
}
