//! Precision boundaries of composed storage, as pure integer logic (no MLX), tested on its own.
//!
//! In a composed cache each row's first `converted` valid positions are read in the compact
//! mode and the rest in the hot (float) mode. A row's boundary is a function of the length of
//! its *settled* positions, those no operation in progress can take back, `converted_for(len)`:
//! the newest `hot_window` positions (plus up to one block) stay hot, and the boundary moves in
//! whole blocks. Outside rounds and padded prefills every position is settled. Because the
//! boundary depends on nothing but that length, a prompt prefilled in one append or in chunks of
//! any sizes ends with the same boundary, and so with bit-identical state (every position is
//! encoded on its own, see `codec`).

/// Positions a boundary moves by at once.
pub const CONVERSION_BLOCK: usize = 64;

/// The boundary of a row of `len` positions with conversions up to date.
pub fn converted_for(len: usize, hot_window: usize) -> usize {
    len.saturating_sub(hot_window) / CONVERSION_BLOCK * CONVERSION_BLOCK
}

/// Brings boundaries in line with row lengths after any change: never past a row's end (a
/// trim with bypass cuts into converted positions), and advanced to `converted_for` the row's
/// settled length (its length outside rounds and padded prefills; see `LatentCache::settled`).
pub fn settle(converted: &mut [usize], lengths: &[usize], settled: &[usize], hot_window: usize) {
    for ((c, &len), &settled) in converted.iter_mut().zip(lengths).zip(settled) {
        *c = (*c).min(len).max(converted_for(settled.min(len), hot_window));
    }
}

/// The most positions every row may drop so that each row's state stays what a fresh cache given
/// the same positions would hold: `converted_for(len - n) >= converted` for every row that has
/// converted positions. `None` when no row has any (every trim keeps that identity).
pub fn max_reusable_trim(converted: &[usize], lengths: &[usize], hot_window: usize) -> Option<usize> {
    converted
        .iter()
        .zip(lengths)
        .filter(|(&c, _)| c > 0)
        .map(|(&c, &len)| len.saturating_sub(hot_window + c.div_ceil(CONVERSION_BLOCK) * CONVERSION_BLOCK))
        .min()
}

/// The settled length at which a boundary standing at `converted` next moves.
pub fn next_move(converted: usize, hot_window: usize) -> usize {
    (converted / CONVERSION_BLOCK + 1) * CONVERSION_BLOCK + hot_window
}

/// Where each row's hot positions start in the stored window: `left_pad + converted`, or the
/// row's end when it has none.
pub fn hot_starts(left_pad: &[usize], converted: &[usize], row_ends: &[usize]) -> Vec<usize> {
    left_pad.iter().zip(converted).zip(row_ends).map(|((&pad, &c), &end)| (pad + c).min(end)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = CONVERSION_BLOCK;

    #[test]
    fn boundary_follows_length_in_whole_blocks() {
        assert_eq!(converted_for(0, 100), 0);
        assert_eq!(converted_for(100 + K - 1, 100), 0);
        assert_eq!(converted_for(100 + K, 100), K);
        assert_eq!(converted_for(100 + 3 * K + 5, 100), 3 * K);
        // The newest hot_window positions always stay hot.
        for len in 0..600 {
            let c = converted_for(len, 100);
            assert!(len - c >= 100.min(len) && len - c < 100 + K, "len {len}");
        }
    }

    #[test]
    fn chunked_and_whole_prefill_settle_alike() {
        // Appending 1000 positions in any chunks, settling after each, ends at the whole
        // prefill's boundary.
        for chunk in [1, 7, 64, 333, 1000] {
            let (mut c, mut len) = (vec![0], 0);
            while len < 1000 {
                len = (len + chunk).min(1000);
                settle(&mut c, &[len], &[len], 200);
            }
            assert_eq!(c, vec![converted_for(1000, 200)], "chunk {chunk}");
        }
    }

    #[test]
    fn unsettled_positions_hold_boundaries_and_bypass_trims_cut_them() {
        let mut c = vec![K, 4 * K];
        // Positions a round could take back (settled length 300) do not move a boundary.
        settle(&mut c, &[1000, 1000], &[300, 300], 100);
        assert_eq!(c, vec![converted_for(300, 100), 4 * K]);
        settle(&mut c, &[1000, 1000], &[1000, 1000], 100);
        assert_eq!(c, vec![converted_for(1000, 100); 2]);
        settle(&mut c, &[10, 2000], &[10, 1000], 100);
        assert_eq!(c, vec![10, converted_for(1000, 100)]);
    }

    #[test]
    fn reusable_trims_keep_the_fresh_boundary() {
        let h = 100;
        for len in [0, 50, 163, 164, 500, 1000] {
            let c = converted_for(len, h);
            let max = max_reusable_trim(&[c], &[len], h);
            match max {
                None => assert_eq!(c, 0),
                Some(n) => {
                    assert_eq!(converted_for(len - n, h), c, "len {len}");
                    if n < len {
                        assert!(converted_for(len - n - 1, h) < c, "len {len}: one more is not reusable");
                    }
                }
            }
        }
        // A boundary past the fresh one (after a trim with bypass) allows no trim.
        assert_eq!(max_reusable_trim(&[300], &[310], 100), Some(0));
    }

    #[test]
    fn the_next_move_is_where_the_boundary_first_changes() {
        for len in [0, 10, 163, 164, 500] {
            let c = converted_for(len, 100);
            let at = next_move(c, 100);
            assert_eq!(converted_for(at - 1, 100), c, "len {len}");
            assert!(converted_for(at, 100) > c, "len {len}");
        }
    }

    #[test]
    fn hot_starts_stop_at_row_ends() {
        assert_eq!(hot_starts(&[0, 5], &[64, 10], &[100, 12]), vec![64, 12]);
    }
}
