//! What an open padded prefill (`prefill_prepare` ... `prefill_finalize`) records per row, and
//! where each row's valid positions end under it: pure integer logic over a row layout.
use crate::core::layout::row_layout::RowLayout;

/// What `prefill_prepare` recorded, per row where it is per row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Prefill {
    /// Each prompt's length, checked against the rows at finalize.
    pub lengths: Option<Vec<usize>>,
    /// Taken by the first append when the cache is empty (a padded first append).
    pub left_padding: Option<Vec<usize>>,
    /// Positions at each row's end that are padding, dropped at finalize.
    pub right_padding: Option<Vec<usize>>,
    /// Each row's positions at prepare (empty for an empty cache): `lengths` count from there.
    pub base: Vec<usize>,
}

impl Prefill {
    /// The prefill of rows `rows` (checked by the caller's layout plan), in that order.
    pub fn keep_rows(&self, rows: &[usize]) -> Prefill {
        let pick = |v: &Option<Vec<usize>>| v.as_ref().map(|v| rows.iter().map(|&r| v.get(r).copied().unwrap_or(0)).collect());
        Prefill {
            lengths: pick(&self.lengths),
            left_padding: pick(&self.left_padding),
            right_padding: pick(&self.right_padding),
            base: pick(&Some(self.base.clone())).unwrap_or_default(),
        }
    }
}

/// `LatentCache::prefill_valid_end` for a row of `layout` under `prefill`.
pub(crate) fn valid_end(layout: &RowLayout, prefill: Option<&Prefill>, row: usize) -> usize {
    let (start, end) = (layout.left_pad()[row], layout.row_ends()[row]);
    let Some(p) = prefill else {
        return end;
    };
    match (&p.lengths, &p.right_padding) {
        (Some(lengths), _) => {
            let prompt_end = start + p.base.get(row).copied().unwrap_or(0) + lengths.get(row).copied().unwrap_or(0);
            end.min(prompt_end)
        }
        (None, Some(right)) => end - right.get(row).copied().unwrap_or(0).min(end - start),
        (None, None) => end,
    }
}
