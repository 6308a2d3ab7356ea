//! Prefill maintenance on `LatentCache` (the seed's `beginPrefill`, `commitPrefill`,
//! `endPrefill`). Moving a composed cache's boundary copies and re-encodes nothing, so there is
//! nothing to defer: the calls keep the seed's protocol and its checks.
use super::{Change, LatentCache};
use crate::core::error::{fail, Result};

impl LatentCache {
    /// Starts prefill maintenance (the seed's `beginPrefill`). Moving a boundary here copies and
    /// re-encodes nothing, and boundaries follow each row's settled length whatever the chunks,
    /// so there is nothing to defer: a chunked prefill holds the same state as one append at
    /// every step, and its hot side stays the size of the window. The calls keep the seed's
    /// protocol and its checks (refused when maintenance is already open).
    pub fn prefill_begin(&mut self) -> Result<()> {
        let change = self.prepare_prefill_begin()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_begin(&self) -> Result<Change> {
        if self.maintaining {
            return fail!(State, "prefill maintenance is already open (prefill_begin was called twice)");
        }
        Ok(Change { maintaining: true, ..self.relabel(self.layout.clone()) })
    }

    /// Fixes each listed row's precision boundary at its current length, its request's prompt
    /// end (the seed's `commitPrefill`): where its settled length puts it, which a sibling's
    /// later chunks do not move. Refused outside maintenance or for a row the cache does not hold.
    pub fn prefill_commit(&mut self, rows: &[usize]) -> Result<()> {
        let change = self.prepare_prefill_commit(rows)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_commit(&self, rows: &[usize]) -> Result<Change> {
        if !self.maintaining {
            return fail!(State, "prefill_commit needs prefill_begin first");
        }
        if let Some(&row) = rows.iter().find(|&&r| r >= self.batch_size()) {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        Ok(self.relabel(self.layout.clone()))
    }

    /// Ends prefill maintenance (the seed's `endPrefill`).
    pub fn prefill_end(&mut self) -> Result<()> {
        let change = self.prepare_prefill_end()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_end(&self) -> Result<Change> {
        if !self.maintaining {
            return fail!(State, "prefill_end needs prefill_begin first");
        }
        Ok(Change { maintaining: false, ..self.relabel(self.layout.clone()) })
    }

    /// Whether prefill maintenance is open.
    pub fn in_prefill_maintenance(&self) -> bool {
        self.maintaining
    }
}
