//! The reference model the tests compare against: plain vectors per row. It encodes the
//! documented row semantics directly (rows as growable lists, placed in the window only on read:
//! right-justified, or ragged from each row's own padding), so it shares no logic with the
//! library's layout code. Each family keeps what its storage mode
//! reads back (`codec_ref::stored`, applied once to the appended values).
#![allow(dead_code)]

use latent_cache::StorageMode;

use super::codec_ref;

#[derive(Clone, Debug, Default)]
pub struct Row {
    /// One Vec per family (latent, rope, index keys), `len * width` floats each.
    pub families: [Vec<f32>; 3],
}

#[derive(Clone, Debug)]
pub struct Model {
    pub widths: [usize; 3],
    pub modes: [StorageMode; 3],
    /// Rows end where they end (ragged layout) instead of at the window's right end.
    pub ragged: bool,
    /// Ragged: each row's padding before its first position (0 after a rebuild).
    pub pads: Vec<usize>,
    pub rows: Vec<Row>,
    /// Row lengths when the open round began.
    pub round: Option<Vec<usize>>,
    /// An open padded prefill (`prefill_prepare` until `prefill_finalize`).
    pub prefill: Option<Prefill>,
}

/// What a prefill prepare recorded: per-row vectors (when given) and each row's length then.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefill {
    pub lengths: Option<Vec<usize>>,
    pub left: Option<Vec<usize>>,
    pub right: Option<Vec<usize>>,
    pub base: Vec<usize>,
}

impl Model {
    pub fn new(widths: [usize; 3]) -> Self {
        Self::with_modes(widths, [StorageMode::F32; 3])
    }

    pub fn with_modes(widths: [usize; 3], modes: [StorageMode; 3]) -> Self {
        Model { widths, modes, ragged: false, pads: Vec::new(), rows: Vec::new(), round: None, prefill: None }
    }

    /// An empty model of the same configuration.
    pub fn empty_like(&self) -> Model {
        Model { rows: Vec::new(), pads: Vec::new(), round: None, prefill: None, ..self.clone() }
    }

    pub fn len(&self, row: usize) -> usize {
        self.rows[row].families[0].len() / self.widths[0]
    }

    pub fn row_offsets(&self) -> Vec<usize> {
        (0..self.rows.len()).map(|r| self.len(r)).collect()
    }

    pub fn offset(&self) -> usize {
        self.row_ends().into_iter().max().unwrap_or(0)
    }

    pub fn left_pad(&self) -> Vec<usize> {
        if self.ragged {
            return self.pads.clone();
        }
        let longest = self.row_offsets().into_iter().max().unwrap_or(0);
        self.row_offsets().into_iter().map(|len| longest - len).collect()
    }

    /// Where each row's positions end in the window.
    pub fn row_ends(&self) -> Vec<usize> {
        if self.ragged {
            return self.pads.iter().zip(self.row_offsets()).map(|(p, len)| p + len).collect();
        }
        let longest = self.row_offsets().into_iter().max().unwrap_or(0);
        vec![longest; self.rows.len()]
    }

    /// `data[f]` is `[batch, tokens, width_f]` row-major, as appended (float32).
    pub fn append(&mut self, batch: usize, tokens: usize, data: &[Vec<f32>; 3]) {
        self.append_padded(batch, tokens, &vec![0; batch], data);
    }

    /// `append` where row `b`'s first `pads[b]` positions are padding (a padded first append,
    /// or `pads` all 0).
    pub fn append_padded(&mut self, batch: usize, tokens: usize, pads: &[usize], data: &[Vec<f32>; 3]) {
        if self.rows.is_empty() {
            self.rows = vec![Row::default(); batch];
            self.pads = pads.to_vec();
        }
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| codec_ref::stored(self.modes[f], self.widths[f], &data[f]));
        for (b, row) in self.rows.iter_mut().enumerate() {
            for (f, family) in row.families.iter_mut().enumerate() {
                let w = self.widths[f];
                family.extend_from_slice(&data[f][(b * tokens + pads[b]) * w..(b + 1) * tokens * w]);
            }
        }
    }

    pub fn truncate_row(&mut self, row: usize, len: usize) {
        for f in 0..3 {
            let w = self.widths[f];
            self.rows[row].families[f].truncate(len * w);
        }
    }

    pub fn trim(&mut self, n: usize) {
        for r in 0..self.rows.len() {
            let len = self.len(r);
            self.truncate_row(r, len - n);
        }
        if let Some(start) = &mut self.round {
            for (r, s) in start.iter_mut().enumerate() {
                *s = (*s).min(self.rows[r].families[0].len() / self.widths[0]);
            }
        }
    }

    pub fn begin(&mut self) {
        self.round = Some(self.row_offsets());
    }

    #[allow(clippy::needless_range_loop)] // `truncate_row` borrows `self`
    pub fn rollback(&mut self, keep: &[usize]) {
        let start = self.round.take().unwrap();
        for r in 0..self.rows.len() {
            let begin = start.get(r).copied().unwrap_or(0);
            self.truncate_row(r, begin + keep[r]);
        }
    }

    /// Positions row `r` appended in the open round.
    pub fn appended_in_round(&self, r: usize) -> usize {
        let start = self.round.as_ref().unwrap();
        self.len(r) - start.get(r).copied().unwrap_or(0)
    }

    /// Keeps rows `keep` in that order; a rebuild places ragged rows at position 0. An open
    /// prefill's vectors follow the rows.
    pub fn filter(&mut self, keep: &[usize]) {
        if let Some(p) = &mut self.prefill {
            let pick =
                |v: &Option<Vec<usize>>| v.as_ref().map(|v| keep.iter().map(|&r| v.get(r).copied().unwrap_or(0)).collect());
            *p = Prefill {
                lengths: pick(&p.lengths),
                left: pick(&p.left),
                right: pick(&p.right),
                base: keep.iter().map(|&r| p.base.get(r).copied().unwrap_or(0)).collect(),
            };
        }
        self.rows = keep.iter().map(|&r| self.rows[r].clone()).collect();
        self.pads = vec![0; self.rows.len()];
    }

    pub fn merge(sources: &[&Model]) -> Model {
        let mut out = sources[0].empty_like();
        for source in sources {
            if source.rows.is_empty() {
                out.rows.push(Row::default());
            }
            out.rows.extend(source.rows.iter().cloned());
        }
        out.pads = vec![0; out.rows.len()];
        out
    }

    /// Row `row`'s positions that are its prompt's in an open prefill: with lengths, up to the
    /// prompt's end; otherwise all but its right padding (all of them without a prefill).
    pub fn prefill_valid_len(&self, row: usize) -> usize {
        self.prefill_valid_len_above(row, 0)
    }

    /// `prefill_valid_len` of rows whose first `shared` positions are a shared prefix: right
    /// padding is the rows' own and never reaches it.
    pub fn prefill_valid_len_above(&self, row: usize, shared: usize) -> usize {
        let len = self.len(row);
        match &self.prefill {
            None => len,
            Some(p) => match (&p.lengths, &p.right) {
                (Some(lengths), _) => len.min(p.base.get(row).copied().unwrap_or(0) + lengths[row]),
                (None, Some(right)) => len - right[row].min(len - shared.min(len)),
                (None, None) => len,
            },
        }
    }

    /// Keeps only each row's prompt positions (what leaves a cache mid-prefill), closing nothing.
    pub fn prompts_only(&self) -> Model {
        self.prompts_above(0)
    }

    /// `prompts_only` of rows over a shared prefix of `shared` positions.
    pub fn prompts_above(&self, shared: usize) -> Model {
        let mut m = self.clone();
        for r in 0..m.rows.len() {
            let keep = self.prefill_valid_len_above(r, shared);
            m.truncate_row(r, keep);
        }
        m.prefill = None;
        m
    }

    pub fn extract(&self, row: usize) -> Model {
        Model { rows: vec![self.rows[row].clone()], pads: vec![0], ..self.empty_like() }
    }
}

/// A small deterministic generator (xorshift64*), so failures reproduce from the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi]`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// `n` values uniform in `[-amplitude, amplitude)`.
    pub fn uniform(&mut self, n: usize, amplitude: f32) -> Vec<f32> {
        (0..n).map(|_| ((self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * amplitude).collect()
    }

    /// Distinct values, so a misplaced position can never compare equal by accident.
    pub fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| (self.next() >> 40) as f32 / 1024.0 - 8192.0).collect()
    }
}
