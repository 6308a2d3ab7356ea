//! Where a batch's rows lie among the buffers' slots: the rows in their order, as a few runs of
//! consecutive rows in consecutive slots. A row leaving keeps the other rows in their slots
//! (its run splits, or shortens); a row joining takes a free slot, the one after the row before
//! it where that is free (so a batch whose oldest request leaves first wraps around its slots
//! as a ring: two runs), else the lowest free one. Attention never mixes rows, so each run is
//! read where it lies, one view per run; at most `MAX_RUNS` runs are kept (fewer where the
//! process asks: `run_limit`), beyond which the caller gathers the rows into one run (a move of
//! the rows that change slots).
//! Integers only, tested without MLX.

/// Most runs a batch's rows may form. Each run is one more launch (or one more graph of MLX's
/// operations) per attention, and a whole-batch view over several runs is a copy; a batch whose
/// requests come and go from the front, the back or anywhere keeps within it, gathering once
/// every few leaves when they come from the middle.
pub(crate) const MAX_RUNS: usize = 4;

/// The runs a batch's rows may form in this process: `MAX_RUNS`, or fewer where
/// `LATENT_CACHE_SLOT_RUNS` (1 to 4, read once) asks. 1 keeps every batch in one run: attention
/// reads each batch in one launch, and a join or leave moves the rows that must (as before runs
/// of slots), for engines whose decode steps are bound by launches more than their joins by
/// copies (see the README).
pub fn run_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        let asked = std::env::var("LATENT_CACHE_SLOT_RUNS").ok().and_then(|v| v.trim().parse::<usize>().ok());
        asked.unwrap_or(MAX_RUNS).clamp(1, MAX_RUNS)
    })
}

/// Rows `[row, row + rows)` in slots `[slot, slot + rows)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Run {
    pub row: usize,
    pub slot: usize,
    pub rows: usize,
}

/// The rows' runs, in row order (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    runs: [Run; MAX_RUNS],
    len: usize,
}

impl Placement {
    /// `rows` rows in consecutive slots from `first`.
    pub fn contiguous(first: usize, rows: usize) -> Placement {
        let mut placement = Placement::default();
        if rows > 0 {
            placement.runs[0] = Run { row: 0, slot: first, rows };
            placement.len = 1;
        }
        placement
    }

    /// Row `b` in slot `slots[b]` (distinct slots); `None` past `run_limit()` runs.
    pub fn from_slots(slots: &[usize]) -> Option<Placement> {
        let limit = run_limit();
        let mut placement = Placement::default();
        for (row, &slot) in slots.iter().enumerate() {
            match placement.len.checked_sub(1).map(|i| &mut placement.runs[i]) {
                Some(run) if run.slot + run.rows == slot => run.rows += 1,
                _ if placement.len == limit => return None,
                _ => {
                    placement.runs[placement.len] = Run { row, slot, rows: 1 };
                    placement.len += 1;
                }
            }
        }
        Some(placement)
    }

    pub fn rows(&self) -> usize {
        self.runs().iter().map(|r| r.rows).sum()
    }

    pub fn runs(&self) -> &[Run] {
        &self.runs[..self.len]
    }

    /// The slot of row `row` (< `rows()`).
    pub fn slot(&self, row: usize) -> usize {
        let run = self.runs().iter().find(|r| row < r.row + r.rows).expect("callers ask for a placed row");
        run.slot + row - run.row
    }

    /// Every row's slot, in row order.
    pub fn slots(&self) -> Vec<usize> {
        self.runs().iter().flat_map(|r| r.slot..r.slot + r.rows).collect()
    }

    /// The slot of row `rows.0` where rows `[rows.0, rows.1)` lie in one run (one view reads
    /// them); `None` where they span runs.
    pub fn run_of(&self, (lo, hi): (usize, usize)) -> Option<usize> {
        let run = self.runs().iter().find(|r| lo < r.row + r.rows)?;
        (hi <= run.row + run.rows).then(|| run.slot + lo - run.row)
    }

    /// The rows `keep` (rows of this placement, in their new order) in the slots they hold.
    /// `None` past `run_limit()` runs.
    pub fn kept(&self, keep: &[usize]) -> Option<Placement> {
        let slots = self.slots();
        Placement::from_slots(&keep.iter().map(|&row| slots[row]).collect::<Vec<_>>())
    }

    /// These rows and `joining` more after them, the rows here in their slots and each joining
    /// row in a free slot of `slots`: the one after the row before it where that is free, else
    /// the lowest free one. `None` without enough free slots, or past `run_limit()` runs.
    pub fn joined(&self, joining: usize, slots: usize) -> Option<Placement> {
        let mut placed = self.slots();
        let mut free = vec![true; slots];
        for &s in &placed {
            *free.get_mut(s)? = false;
        }
        for _ in 0..joining {
            let next = placed.last().map(|&s| s + 1).filter(|&s| s < slots && free[s]);
            let slot = next.or_else(|| free.iter().position(|&f| f))?;
            free[slot] = false;
            placed.push(slot);
        }
        Placement::from_slots(&placed)
    }

    /// Rows gathered into one run of `slots`: row `b` now in slot `now[b]` (`None`: a row that
    /// joins, written wherever it lands), costing `cost(b)` to move. The run starts where some
    /// row would stay put, or at slot 0, whichever fits and moves the least.
    pub fn gather(now: &[Option<usize>], slots: usize, cost: impl Fn(usize) -> usize) -> Placement {
        let rows = now.len();
        let candidates = now.iter().enumerate().filter_map(|(b, s)| s.and_then(|s| s.checked_sub(b))).chain(std::iter::once(0));
        let total = |first: usize| (0..rows).filter(|&b| now[b].is_some_and(|s| s != first + b)).map(&cost).sum::<usize>();
        let first = candidates.filter(|&f| f + rows <= slots).min_by_key(|&f| total(f)).unwrap_or(0);
        Placement::contiguous(first, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_runs_agree() {
        let p = Placement::from_slots(&[3, 4, 5, 0, 1, 7]).unwrap();
        assert_eq!(p.runs().len(), 3);
        assert_eq!(p.rows(), 6);
        assert_eq!(p.slots(), vec![3, 4, 5, 0, 1, 7]);
        assert_eq!((0..6).map(|b| p.slot(b)).collect::<Vec<_>>(), vec![3, 4, 5, 0, 1, 7]);
        assert_eq!(p.run_of((0, 3)), Some(3));
        assert_eq!(p.run_of((1, 2)), Some(4));
        assert_eq!(p.run_of((2, 4)), None);
        assert_eq!(p.run_of((3, 5)), Some(0));
        assert_eq!(Placement::contiguous(2, 3).slots(), vec![2, 3, 4]);
        assert_eq!(Placement::contiguous(2, 0).runs().len(), 0);
        assert!(Placement::from_slots(&[0, 2, 4, 6, 8]).is_none());
    }

    #[test]
    fn first_in_first_out_wraps_as_a_ring() {
        // 16 rows, one spare slot: the oldest leaves, a new one joins, 100 times.
        let mut p = Placement::contiguous(0, 16);
        for _ in 0..100 {
            p = p.kept(&(1..16).collect::<Vec<_>>()).unwrap();
            p = p.joined(1, 17).unwrap();
            assert!(p.runs().len() <= 2, "{p:?}");
            let mut slots = p.slots();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), 16);
        }
    }

    #[test]
    fn last_in_first_out_stays_one_run() {
        let mut p = Placement::contiguous(0, 16);
        for _ in 0..20 {
            p = p.kept(&(0..15).collect::<Vec<_>>()).unwrap().joined(1, 16).unwrap();
            assert_eq!(p, Placement::contiguous(0, 16));
        }
    }

    #[test]
    fn joins_need_free_slots_and_few_runs() {
        let p = Placement::from_slots(&[0, 1, 2]).unwrap();
        assert!(p.joined(2, 4).is_none());
        assert_eq!(p.joined(1, 4).unwrap().slots(), vec![0, 1, 2, 3]);
        let holes = Placement::from_slots(&[1, 3, 5, 7]).unwrap();
        assert!(holes.joined(1, 9).unwrap().runs().len() == 4);
        assert!(holes.joined(1, 10).is_some());
        assert!(Placement::from_slots(&[1, 3, 5, 9]).unwrap().joined(1, 10).is_none());
    }

    #[test]
    fn a_gather_moves_the_fewest_rows() {
        // Rows 0-5 in slots 0-5, rows 6-7 in slots 8-9: the long run stays.
        let now = [0, 1, 2, 3, 4, 5, 8, 9].map(Some);
        assert_eq!(Placement::gather(&now, 10, |_| 1).slots(), vec![0, 1, 2, 3, 4, 5, 6, 7]);
        // Rows 0-5 in slots 2-7, rows 6-7 in 0-1: rows 6-7 move to slots 8-9.
        let now = [2, 3, 4, 5, 6, 7, 0, 1].map(Some);
        assert_eq!(Placement::gather(&now, 10, |_| 1).slots(), vec![2, 3, 4, 5, 6, 7, 8, 9]);
        // A joining row moves nothing; without room for the run, slot 0.
        assert_eq!(Placement::gather(&[Some(5), Some(6), None], 8, |_| 1).slots(), vec![5, 6, 7]);
        assert_eq!(Placement::gather(&[Some(5), Some(6), None], 7, |_| 1).slots(), vec![0, 1, 2]);
    }
}
