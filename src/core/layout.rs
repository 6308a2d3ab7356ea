//! The row layout: how many rows, how wide the stored window is, where each row starts, and the
//! speculative-round bookkeeping. Pure integer logic, no MLX, so it is tested on its own.
//!
//! Rows are right-justified: row `b` holds its valid positions at `[left_pad[b], offset)` and
//! `row_offsets[b] = offset - left_pad[b]`. After every operation the common left padding is
//! removed, so the longest row has `left_pad == 0` and `offset == max(row_offsets)`.
use super::error::{fail, Result};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowLayout {
    offset: usize,
    /// One entry per row; empty before the first append.
    left_pad: Vec<usize>,
    /// Each row's position count when the open speculative round began.
    round: Option<Vec<usize>>,
}

/// How the stored data must move to realize a layout change that a trim cannot express.
/// New row `b` takes old row `rows[b]`; its value at new position `j` is the old value at
/// `j + shift[b]` (positions outside the row's valid range are don't-care).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relayout {
    pub rows: Vec<usize>,
    pub shift: Vec<isize>,
    pub layout: RowLayout,
}

/// What a rollback does to storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollback {
    /// Every row drops the same count: move the offset back, copy nothing.
    Trim(usize),
    /// Rows drop different counts: shift rows so they stay right-justified.
    Relayout(Relayout),
}

impl RowLayout {
    /// A layout of `row_offsets.len()` rows with the given lengths, right-justified.
    pub fn from_row_offsets(row_offsets: &[usize]) -> RowLayout {
        let offset = row_offsets.iter().copied().max().unwrap_or(0);
        RowLayout { offset, left_pad: row_offsets.iter().map(|&len| offset - len).collect(), round: None }
    }

    /// Rows in the layout; 0 before the first append.
    pub fn batch_size(&self) -> usize {
        self.left_pad.len()
    }

    /// Physical width of the stored window: the longest row.
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn left_pad(&self) -> &[usize] {
        &self.left_pad
    }

    pub fn row_offsets(&self) -> Vec<usize> {
        self.left_pad.iter().map(|pad| self.offset - pad).collect()
    }

    pub fn shortest_row(&self) -> usize {
        self.left_pad.iter().map(|pad| self.offset - pad).min().unwrap_or(0)
    }

    pub fn in_round(&self) -> bool {
        self.round.is_some()
    }

    /// Checks a shared append of `tokens` positions to every row of a `batch`-row input.
    pub fn check_append(&self, batch: usize, tokens: usize, max_tokens: usize) -> Result<()> {
        if batch == 0 || tokens == 0 {
            return fail!(Shape, "an append needs at least one row and one position (got batch {batch}, tokens {tokens})");
        }
        if batch > i32::MAX as usize || tokens > i32::MAX as usize {
            return fail!(Shape, "batch {batch} x tokens {tokens} exceeds MLX's int32 shapes");
        }
        if self.batch_size() != 0 && batch != self.batch_size() {
            return fail!(Shape, "append has batch {batch} but the cache holds {} rows", self.batch_size());
        }
        let Some(width) = self.offset.checked_add(tokens) else {
            return fail!(Capacity, "appending {tokens} positions overflows the position count");
        };
        if width > i32::MAX as usize {
            return fail!(Capacity, "appending {tokens} positions to {} exceeds MLX's int32 positions", self.offset);
        }
        if max_tokens != 0 && width > max_tokens {
            return fail!(Capacity, "appending {tokens} positions to a row of {} exceeds max_tokens ({max_tokens})", self.offset);
        }
        Ok(())
    }

    /// Records a checked append (see [`check_append`](Self::check_append)).
    pub fn append(&mut self, batch: usize, tokens: usize) {
        if self.left_pad.is_empty() {
            self.left_pad = vec![0; batch];
        }
        self.offset += tokens;
    }

    pub fn check_trim(&self, n: usize, bypass: bool) -> Result<()> {
        if self.in_round() && !bypass {
            return fail!(State, "trim inside a speculative round needs bypass (or use rollback)");
        }
        if n > self.shortest_row() {
            return fail!(OutOfRange, "cannot trim {n} positions: the shortest row holds {}", self.shortest_row());
        }
        Ok(())
    }

    /// Drops the last `n` positions of every row (checked by [`check_trim`](Self::check_trim)).
    pub fn trim(&mut self, n: usize) {
        self.offset -= n;
        // A bypass trim inside a round may cut into positions from before the round; those are
        // gone, so the round's starting counts can be no larger than what remains.
        let now = self.row_offsets();
        if let Some(start) = &mut self.round {
            for (start, len) in start.iter_mut().zip(now) {
                *start = (*start).min(len);
            }
        }
    }

    /// Positions the longest row may still take under `max_tokens` (usize::MAX when unbounded).
    pub fn max_append_tokens(&self, max_tokens: usize) -> usize {
        if max_tokens == 0 {
            usize::MAX
        } else {
            max_tokens.saturating_sub(self.offset)
        }
    }

    pub fn begin_round(&mut self) -> Result<()> {
        if self.in_round() {
            return fail!(State, "a speculative round is already open");
        }
        self.round = Some(self.row_offsets());
        Ok(())
    }

    pub fn commit_round(&mut self) -> Result<()> {
        if self.round.take().is_none() {
            return fail!(State, "no speculative round is open");
        }
        Ok(())
    }

    /// Plans a rollback in which row `b` keeps the first `keep[b]` positions it appended in the
    /// round. Changes nothing; [`finish_rollback`](Self::finish_rollback) closes the round.
    pub fn plan_rollback(&self, keep: &[usize]) -> Result<Rollback> {
        let Some(start) = &self.round else {
            return fail!(State, "no speculative round is open");
        };
        if start.len() != self.batch_size() {
            // The round began before the first append: an empty cache had no rows.
            if !start.is_empty() {
                return fail!(State, "the batch changed inside the round");
            }
        }
        if keep.len() != self.batch_size() {
            return fail!(InvalidArgument, "rollback got {} keep counts for {} rows", keep.len(), self.batch_size());
        }
        let now = self.row_offsets();
        let mut drops = Vec::with_capacity(keep.len());
        for (b, (&kept, &len)) in keep.iter().zip(&now).enumerate() {
            let appended = len.saturating_sub(start.get(b).copied().unwrap_or(0));
            if kept > appended {
                return fail!(OutOfRange, "row {b} appended {appended} positions in the round; cannot keep {kept}");
            }
            drops.push(appended - kept);
        }
        let min_drop = drops.iter().copied().min().unwrap_or(0);
        if drops.iter().all(|&d| d == min_drop) {
            return Ok(Rollback::Trim(min_drop));
        }
        let lengths: Vec<usize> = now.iter().zip(&drops).map(|(len, d)| len - d).collect();
        Ok(Rollback::Relayout(self.relayout((0..keep.len()).collect(), lengths, &drops)))
    }

    /// Closes the round after a rollback applied as a trim.
    pub fn finish_rollback(&mut self) {
        self.round = None;
    }

    /// Plans keeping `rows` (in that order); drops padding no kept row needs.
    pub fn plan_filter(&self, rows: &[usize]) -> Result<Relayout> {
        if self.in_round() {
            return fail!(State, "rows cannot be filtered inside a speculative round");
        }
        if rows.is_empty() {
            return fail!(InvalidArgument, "filter must keep at least one row (use reset to empty the cache)");
        }
        let mut seen = vec![false; self.batch_size()];
        for &row in rows {
            if row >= self.batch_size() {
                return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
            }
            if std::mem::replace(&mut seen[row], true) {
                return fail!(InvalidArgument, "row {row} listed twice");
            }
        }
        let now = self.row_offsets();
        let lengths = rows.iter().map(|&r| now[r]).collect();
        let drops = vec![0; rows.len()];
        Ok(self.relayout(rows.to_vec(), lengths, &drops))
    }

    /// New layout for rows `rows` whose valid positions now end `drops[i]` before `offset`, with
    /// `lengths[i]` positions each, right-justified again.
    fn relayout(&self, rows: Vec<usize>, lengths: Vec<usize>, drops: &[usize]) -> Relayout {
        let mut layout = RowLayout::from_row_offsets(&lengths);
        layout.round = None;
        // Row i's last kept position moves from offset - 1 - drops[i] to layout.offset - 1.
        let shift = drops.iter().map(|&d| self.offset as isize - d as isize - layout.offset as isize).collect();
        Relayout { rows, shift, layout }
    }

    /// Adopts a layout produced by a plan once storage has moved; closes any round (plans are
    /// made by a rollback, which ends it, or outside rounds).
    pub fn adopt(&mut self, layout: RowLayout) {
        *self = layout;
        self.round = None;
    }

    pub fn reset(&mut self) {
        *self = RowLayout::default();
    }
}
