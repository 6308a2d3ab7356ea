//! Reading storage: views of the stored parts `[:rows, :offset]` (counted from position 0; rows
//! in several runs of slots are joined, or read run by run) as they are, values (a view for the
//! float modes, a lazy decode for the packed ones) of the committed state or of a prepared one,
//! and one row's positions copied to the host.
use mlx_rs::Array;

use super::{Parts, Pending, RunParts, Storage};
use crate::core::error::Result;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;

impl Storage {
    /// Views of one family's stored parts `[rows, offset, part_width]` (before the first
    /// write: empty `[0, 0, part_width]` arrays).
    pub fn stored_parts(&self, family: Family, offset: usize) -> Result<Parts> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) => self.frame.window(data, &buffer.parts, (0, self.frame.rows()), 0, offset),
            None => buffer.parts.iter().map(|p| ops::zeros(&[0, 0, p.width], p.dtype)).collect(),
        }
    }

    /// Views of one family's stored parts `[rows, offset, part_width]` of each run of rows (see
    /// `layout::slots`): what attention reads, each run where it lies. One run (of no rows)
    /// before the first write.
    pub(crate) fn stored_runs(&self, family: Family, offset: usize) -> Result<Vec<RunParts>> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) if self.frame.placement.runs().len() > 1 => self.frame.run_windows(data, &buffer.parts, 0, offset),
            _ => Ok(vec![RunParts { row: 0, rows: self.frame.rows(), parts: self.stored_parts(family, offset)? }]),
        }
    }

    /// Views of one family's stored parts at row `row`, positions `[lo, hi)`: `[1, hi - lo,
    /// part_width]` each, as stored (nothing copied until a reader evaluates them).
    pub fn stored_row_parts(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Parts> {
        let buffer = self.buffer(family);
        let data = buffer.data.as_ref().expect("callers read written storage");
        self.frame.window(data, &buffer.parts, (row, row + 1), lo, hi)
    }

    /// One family's stored values `[rows, offset, width]`: a view for the float modes, a lazy
    /// decode (O(stored) when evaluated) for the packed ones.
    pub fn view(&self, family: Family, offset: usize) -> Result<Array> {
        self.buffer(family).decode(&self.stored_parts(family, offset)?)
    }

    /// Views of every family's stored window.
    pub fn views(&self, offset: usize) -> Result<Families<Array>> {
        self.buffers.as_ref().try_map(|family, _| self.view(family, offset))
    }

    /// Decoded values of one family at rows `[rows.0, rows.1)`, positions `[lo, hi)`, of a
    /// prepared state (`Some`) or of the committed one: lazy, a view for the float modes.
    pub fn window_in(
        &self,
        pending: Option<&Pending>,
        family: Family,
        rows: (usize, usize),
        lo: usize,
        hi: usize,
    ) -> Result<Array> {
        let buffer = self.buffer(family);
        let (data, frame) = match pending {
            Some(p) => (&p.data.get(family).expect("pending states hold every family").0, p.frame),
            None => (buffer.data.as_ref().expect("callers read written storage"), self.frame),
        };
        buffer.decode(&frame.window(data, &buffer.parts, rows, lo, hi)?)
    }

    /// Values `[rows, offset, width]` of a prepared state, before it is committed: views for
    /// the float modes, lazy decodes for the packed ones.
    pub fn pending_views(&self, pending: &Pending, offset: usize) -> Result<Families<Array>> {
        self.buffers.as_ref().zip(pending.data.as_ref()).try_map(|_, (buffer, (data, _))| {
            buffer.decode(&pending.frame.window(data, &buffer.parts, (0, pending.frame.rows()), 0, offset)?)
        })
    }

    /// Row `row`'s positions `[lo, hi)` of one family, decoded to float32 on the host.
    pub fn read_row(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) if hi > lo => {
                let values = buffer.decode(&self.frame.window(data, &buffer.parts, (row, row + 1), lo, hi)?)?;
                ops::to_host(&ops::astype(&values, mlx_rs::Dtype::Float32)?)
            }
            _ => Ok(Vec::new()),
        }
    }
}
