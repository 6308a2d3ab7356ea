//! The row layout: how many rows, how wide the stored window is, where each row starts and
//! ends, and the speculative-round bookkeeping. Pure integer logic, no MLX, so it is tested on
//! its own.
//!
//! Row `b` holds its valid positions at `[left_pad[b], row_end[b])`, and
//! `row_offsets[b] = row_end[b] - left_pad[b]`; `offset` is the largest row end (the physical
//! width of the stored window).
//! - Right-justified (the seed's layout, the default): every row ends at `offset`. After every
//!   operation the common left padding is removed, so the longest row has `left_pad == 0`.
//!   Rows that drop different counts in a rollback must move to stay right-justified.
//! - Ragged: rows end where they end. Appends write each row's new positions at its own end,
//!   and an uneven rollback only moves row ends; rebuilt rows (filter, merge, extract) start at
//!   position 0.
use crate::core::error::{fail, Result};

/// How rows sit in the stored window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayoutKind {
    #[default]
    RightJustified,
    Ragged,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowLayout {
    kind: LayoutKind,
    /// The largest row end.
    offset: usize,
    /// One entry per row; empty before the first append.
    left_pad: Vec<usize>,
    /// One entry per row: where its valid positions end (`offset` for every row when
    /// right-justified).
    row_end: Vec<usize>,
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
    /// Ragged rows drop different counts: only their ends move (adopt this layout), copy nothing.
    Ends(RowLayout),
    /// Right-justified rows drop different counts: shift rows so they stay right-justified.
    Relayout(Relayout),
}

impl RowLayout {
    /// An empty layout of the given kind.
    pub fn new(kind: LayoutKind) -> RowLayout {
        RowLayout { kind, ..RowLayout::default() }
    }

    /// A layout of `row_offsets.len()` rows with the given lengths, right-justified.
    pub fn from_row_offsets(row_offsets: &[usize]) -> RowLayout {
        Self::rebuilt(LayoutKind::RightJustified, row_offsets)
    }

    /// Rows with the given lengths as a rebuild lays them out: right-justified to the longest,
    /// or (ragged) each starting at position 0.
    pub fn rebuilt(kind: LayoutKind, row_offsets: &[usize]) -> RowLayout {
        let offset = row_offsets.iter().copied().max().unwrap_or(0);
        let (left_pad, row_end) = match kind {
            LayoutKind::RightJustified => {
                (row_offsets.iter().map(|&len| offset - len).collect(), vec![offset; row_offsets.len()])
            }
            LayoutKind::Ragged => (vec![0; row_offsets.len()], row_offsets.to_vec()),
        };
        RowLayout { kind, offset, left_pad, row_end, round: None }
    }

    /// A layout of rows at `[left_pad[b], row_end[b])` (what a load adopts), checked: equal
    /// lengths, `left_pad <= row_end <= positions`, and for right-justified rows every end at
    /// the window's width.
    pub fn from_rows(kind: LayoutKind, left_pad: &[usize], row_end: &[usize], positions: usize) -> Result<RowLayout> {
        if left_pad.len() != row_end.len() {
            return fail!(InvalidArgument, "{} left pads for {} row ends", left_pad.len(), row_end.len());
        }
        let offset = row_end.iter().copied().max().unwrap_or(0);
        for (b, (&pad, &end)) in left_pad.iter().zip(row_end).enumerate() {
            if pad > end || end > positions || (kind == LayoutKind::RightJustified && end != offset) {
                return fail!(InvalidArgument, "row {b} spans [{pad}, {end}) of a {positions}-position window ({kind:?})");
            }
        }
        if offset != positions && !left_pad.is_empty() {
            return fail!(InvalidArgument, "the window holds {positions} positions but the longest row ends at {offset}");
        }
        Ok(RowLayout { kind, offset, left_pad: left_pad.to_vec(), row_end: row_end.to_vec(), round: None })
    }

    pub fn kind(&self) -> LayoutKind {
        self.kind
    }

    /// Where each row's valid positions end.
    pub fn row_ends(&self) -> &[usize] {
        &self.row_end
    }

    /// Where an append's new positions start in each of `batch` rows.
    pub fn append_starts(&self, batch: usize) -> Vec<usize> {
        match self.row_end.is_empty() {
            true => vec![0; batch],
            false => self.row_end.clone(),
        }
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
        self.left_pad.iter().zip(&self.row_end).map(|(pad, end)| end - pad).collect()
    }

    pub fn shortest_row(&self) -> usize {
        self.row_offsets().into_iter().min().unwrap_or(0)
    }

    /// Each row's position count when the open round began (`None` outside rounds; empty for a
    /// round begun on an empty cache).
    pub fn round_start(&self) -> Option<&[usize]> {
        self.round.as_deref()
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

    /// Records a checked append (see [`check_append`](Self::check_append)): every row grows by
    /// `tokens`, so the largest end does too.
    pub fn append(&mut self, batch: usize, tokens: usize) {
        if self.left_pad.is_empty() {
            self.left_pad = vec![0; batch];
            self.row_end = vec![0; batch];
        }
        self.row_end.iter_mut().for_each(|end| *end += tokens);
        self.offset += tokens;
    }

    /// Checks the first append of a padded batch: `batch` rows of `tokens` positions, row `b`'s
    /// first `left_pad[b]` of them padding (mlx-lm's `BatchKVCache(left_padding)`).
    pub fn check_append_padded(&self, batch: usize, tokens: usize, left_pad: &[usize], max_tokens: usize) -> Result<()> {
        if self.batch_size() != 0 || self.in_round() {
            return fail!(State, "a padded append must be the first append of an empty cache, outside a round");
        }
        self.check_append(batch, tokens, max_tokens)?;
        if left_pad.len() != batch {
            return fail!(InvalidArgument, "left_pad has {} entries for {batch} rows", left_pad.len());
        }
        if let Some((b, &pad)) = left_pad.iter().enumerate().find(|(_, &pad)| pad > tokens) {
            return fail!(OutOfRange, "left_pad[{b}] is {pad} but the append has {tokens} positions");
        }
        if left_pad.iter().all(|&pad| pad > 0) {
            return fail!(InvalidArgument, "at least one row (the longest prompt) must have no left padding");
        }
        Ok(())
    }

    /// Records a checked padded first append.
    pub fn append_padded(&mut self, tokens: usize, left_pad: &[usize]) {
        self.left_pad = left_pad.to_vec();
        self.row_end = vec![tokens; left_pad.len()];
        self.offset = tokens;
    }

    /// Positions every row appended in the open round (0 outside rounds): a trim inside a
    /// round may drop only these.
    fn appended_in_round(&self) -> usize {
        match &self.round {
            Some(start) => {
                let now = self.row_offsets();
                now.iter().enumerate().map(|(b, &len)| len.saturating_sub(start.get(b).copied().unwrap_or(0))).min().unwrap_or(0)
            }
            None => 0,
        }
    }

    pub fn check_trim(&self, n: usize, bypass: bool) -> Result<()> {
        if self.in_round() && !bypass {
            return fail!(State, "trim inside a speculative round needs bypass (or use rollback)");
        }
        // Inside a round its rule comes first: what the round appended is within every row.
        if self.in_round() && n > self.appended_in_round() {
            return fail!(
                State,
                "cannot trim {n} positions inside a round: a row appended only {} in it, and a rollback must restore what it held before",
                self.appended_in_round()
            );
        }
        if n > self.shortest_row() {
            return fail!(OutOfRange, "cannot trim {n} positions: the shortest row holds {}", self.shortest_row());
        }
        Ok(())
    }

    /// Drops the last `n` positions of every row (checked by [`check_trim`](Self::check_trim)).
    pub fn trim(&mut self, n: usize) {
        self.row_end.iter_mut().for_each(|end| *end -= n);
        self.offset -= n;
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
        Ok(self.plan_drops(&drops))
    }

    /// Plans dropping the last `drops[b]` positions of each row (checked by the caller): a trim
    /// when all are equal; otherwise ragged rows move their ends, right-justified rows shift.
    /// The plan's layout has no open round.
    pub fn plan_drops(&self, drops: &[usize]) -> Rollback {
        let min_drop = drops.iter().copied().min().unwrap_or(0);
        if drops.iter().all(|&d| d == min_drop) {
            return Rollback::Trim(min_drop);
        }
        if self.kind == LayoutKind::Ragged {
            let mut layout = self.clone();
            layout.row_end.iter_mut().zip(drops).for_each(|(end, d)| *end -= d);
            layout.offset = layout.row_end.iter().copied().max().unwrap_or(0);
            layout.round = None;
            return Rollback::Ends(layout);
        }
        let lengths: Vec<usize> = self.row_offsets().iter().zip(drops).map(|(len, d)| len - d).collect();
        Rollback::Relayout(self.relayout((0..drops.len()).collect(), lengths, drops))
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
        let lengths: Vec<usize> = rows.iter().map(|&r| now[r]).collect();
        if self.kind == LayoutKind::Ragged {
            // Kept rows start at position 0: new position j is old position j + left_pad.
            let shift = rows.iter().map(|&r| self.left_pad[r] as isize).collect();
            return Ok(Relayout { rows: rows.to_vec(), shift, layout: RowLayout::rebuilt(self.kind, &lengths) });
        }
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

    /// Empties the layout, keeping its kind.
    pub fn reset(&mut self) {
        *self = RowLayout::new(self.kind);
    }
}
