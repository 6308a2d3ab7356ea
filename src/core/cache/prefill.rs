//! A padded batched prefill, as mlx-lm's `BatchKVCache.prepare` / `finalize` define it (the
//! seed's `preparePrefill` / `finalizePrefill`): left padding placed before the first append's
//! rows, right padding (a shorter prompt padded at its end) dropped at finalize so every row ends
//! with its prompt's last position. Between the two calls the padding's rows follow filters, and a
//! row extracted mid-prefill leaves without its right padding.
use super::{Change, LatentCache};
use crate::core::error::{fail, Result};
use crate::core::layout::prefill::{valid_end, Prefill};

impl LatentCache {
    /// Records a padded batched prefill. `left_padding` (only on an empty cache) places the first
    /// append's rows as `append_latent_padded` does when that append gives no padding of its own;
    /// `right_padding[b]` marks row `b`'s last positions of the coming prefill as padding;
    /// `lengths` (each prompt's length) is checked at finalize against what each row gained since
    /// this call, less its right padding. Every vector has one entry per row (the coming rows on an
    /// empty cache).
    pub fn prefill_prepare(
        &mut self,
        lengths: Option<&[usize]>,
        left_padding: Option<&[usize]>,
        right_padding: Option<&[usize]>,
    ) -> Result<()> {
        let change = self.prepare_prefill_prepare(lengths, left_padding, right_padding)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_prepare(
        &self,
        lengths: Option<&[usize]>,
        left_padding: Option<&[usize]>,
        right_padding: Option<&[usize]>,
    ) -> Result<Change> {
        if self.in_spec_round() || self.prefill.is_some() {
            return fail!(State, "prefill_prepare inside a round, or again before prefill_finalize");
        }
        if left_padding.is_some() && self.batch_size() != 0 {
            return fail!(State, "left padding is taken only by an empty cache (mlx-lm's rule)");
        }
        if let Some(left) = left_padding {
            // What a padded first append requires, checked now so that a prepare no append
            // could take is refused instead of blocking every append until finalize.
            if left.is_empty() || left.iter().all(|&pad| pad > 0) {
                return fail!(InvalidArgument, "left_padding needs one entry per row and a row (the longest prompt) with none");
            }
        }
        let given = [("lengths", lengths), ("left_padding", left_padding), ("right_padding", right_padding)];
        let mut rows = (self.batch_size() != 0).then_some(self.batch_size());
        for (name, v) in given {
            let Some(v) = v else { continue };
            match rows {
                Some(n) if n != v.len() => return fail!(InvalidArgument, "{name} has {} entries for {n} rows", v.len()),
                _ => rows = Some(v.len()),
            }
            if let Some(&big) = v.iter().find(|&&x| x > i32::MAX as usize) {
                return fail!(OutOfRange, "{name} entry {big} exceeds INT32_MAX");
            }
        }
        let mut change = self.relabel(self.layout.clone());
        change.prefill = Some(Prefill {
            lengths: lengths.map(<[usize]>::to_vec),
            left_padding: left_padding.map(<[usize]>::to_vec),
            right_padding: right_padding.map(<[usize]>::to_vec),
            // The rows' own positions (a shared prefix below them is not the prompt's).
            base: self.layout.row_offsets(),
        });
        Ok(change)
    }

    /// Ends the prefill: drops each row's right padding, so each row ends with its prompt's last
    /// position (right-justified rows shift right in place, only the rows that move; ragged row
    /// ends move). Without an open prefill, nothing to do.
    pub fn prefill_finalize(&mut self) -> Result<()> {
        let change = self.prepare_prefill_finalize()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_finalize(&self) -> Result<Change> {
        let Some(prefill) = &self.prefill else {
            return Ok(self.relabel(self.layout.clone()));
        };
        let rows = self.batch_size();
        let drops = prefill.right_padding.clone().unwrap_or_else(|| vec![0; rows]);
        if drops.len() != rows {
            return fail!(InvalidArgument, "right_padding has {} entries but the cache holds {rows} rows", drops.len());
        }
        // Right padding is the rows' own: it never reaches a shared prefix below them.
        let now = self.layout.row_offsets();
        if let Some(b) = (0..rows).find(|&b| drops[b] > now[b]) {
            return fail!(
                OutOfRange,
                "row {b} holds {} positions{}; cannot drop {} of right padding",
                now[b],
                if self.base.is_some() { " above its shared prefix" } else { "" },
                drops[b]
            );
        }
        let kept: Vec<usize> =
            (0..rows).map(|b| (now[b] - drops[b]).saturating_sub(prefill.base.get(b).copied().unwrap_or(0))).collect();
        if let Some(lengths) = &prefill.lengths {
            if lengths != &kept {
                // Nothing changes: the engine may still append or trim to match, or reset.
                return fail!(
                    InvalidArgument,
                    "the prompts' lengths {lengths:?} differ from what the rows gained {kept:?}, less their right padding"
                );
            }
        }
        let mut change = self.prepare_plan(self.layout.plan_drops(&drops))?;
        change.prefill = None;
        Ok(change)
    }

    /// The left padding a prepared prefill gives the first append (when the call gives none).
    pub(crate) fn prepared_left_pad(&self) -> Option<Vec<usize>> {
        match (&self.prefill, self.batch_size()) {
            (Some(p), 0) => p.left_padding.clone(),
            _ => None,
        }
    }

    /// Where row `row`'s valid positions end in an open prefill (its end without one): with
    /// `lengths`, at most its prompt's end (so padding not yet appended takes nothing from the
    /// prompt); otherwise its end less its right padding.
    pub(crate) fn prefill_valid_end(&self, row: usize) -> usize {
        valid_end(&self.layout, self.prefill.as_ref(), row)
    }

    /// Refuses a first append whose batch is not the prepared prefill's (its vectors have one
    /// entry per coming row).
    pub(crate) fn check_prefill_batch(&self, batch: usize) -> Result<()> {
        let Some(p) = &self.prefill else {
            return Ok(());
        };
        if self.batch_size() != 0 {
            return Ok(());
        }
        let rows = [&p.lengths, &p.left_padding, &p.right_padding].into_iter().flatten().map(Vec::len).next();
        match rows {
            Some(n) if n != batch => fail!(Shape, "the prefill was prepared for {n} rows; this first append has {batch}"),
            _ => Ok(()),
        }
    }

    /// Whether a prefill is open (between `prefill_prepare` and `prefill_finalize`).
    pub fn in_prefill(&self) -> bool {
        self.prefill.is_some()
    }
}
