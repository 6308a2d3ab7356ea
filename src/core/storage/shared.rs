//! Shared prefixes: positions frozen once and read by any number of rows and caches, never
//! written again. A `SharedPrefix` is a chain of `Piece`s (a prompt, then each fork's row on top
//! of it), each one row's positions of every family as stored (`[1, len, part_width]` per part,
//! evaluated). MLX arrays are reference counted and immutable once evaluated, so holding a
//! piece in several caches copies nothing; the memory is released with the last holder.
//!
//! Nothing here knows rows or layouts: `cache::shared` decides what a piece holds, `attention`
//! reads it.
use std::sync::Arc;

use mlx_rs::Array;

use crate::core::error::Result;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Geometry;

/// One row's positions of every family, as stored: `[1, len, part_width]` per part.
#[derive(Debug)]
pub struct Piece {
    pub len: usize,
    pub parts: Families<Vec<Array>>,
    /// Bytes the arrays behind the parts hold (the buffer a piece was cut from, where it shares
    /// one: see `cache::shared`).
    pub held_bytes: usize,
}

impl Piece {
    /// Views of its positions `[lo, hi)`, every family's parts (`[1, hi - lo, part_width]`
    /// each; no copy, lazily).
    pub fn views(&self, lo: usize, hi: usize) -> Result<Families<Vec<Array>>> {
        self.parts.as_ref().try_map(|_, parts| {
            parts.iter().map(|p| ops::slice(p, &[0, lo, 0], &[1, hi, p.shape()[2] as usize])).collect::<Result<Vec<_>>>()
        })
    }
}

// SAFETY: a piece never changes after it is made, and its arrays are evaluated when it is made
// (`cache::shared`), so MLX never writes them again: threads holding caches over one prefix only
// build graphs that reference them (MLX's reference counts are atomic), the sharing a donor and
// its cache already have across handles.
unsafe impl Sync for Piece {}

/// Positions shared below the rows of caches of one geometry: the pieces in order.
#[derive(Clone, Debug)]
pub struct SharedPrefix {
    geometry: Geometry,
    pieces: Vec<Arc<Piece>>,
    /// The segment chain (digest, positions) its first positions are known to be, which rows
    /// attached over it inherit (`persist::segment`: a continuation's segments link to it).
    chain: Option<(u64, usize)>,
}

impl SharedPrefix {
    /// A prefix of `pieces`, in order (each non-empty; at least one).
    pub(crate) fn new(geometry: Geometry, pieces: Vec<Arc<Piece>>) -> SharedPrefix {
        debug_assert!(!pieces.is_empty() && pieces.iter().all(|p| p.len > 0));
        SharedPrefix { geometry, pieces, chain: None }
    }

    /// This prefix known to start with the segment chain `chain` (digest, positions, at most
    /// the prefix's), if any.
    pub(crate) fn with_chain(mut self, chain: Option<(u64, usize)>) -> SharedPrefix {
        debug_assert!(chain.map_or(true, |(_, n)| n <= self.positions()));
        self.chain = chain;
        self
    }

    /// The segment chain (digest, positions) its first positions are known to be.
    pub fn chain(&self) -> Option<(u64, usize)> {
        self.chain
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn pieces(&self) -> &[Arc<Piece>] {
        &self.pieces
    }

    /// Positions the prefix holds.
    pub fn positions(&self) -> usize {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Bytes its pieces hold (once, however many caches share them).
    pub fn held_bytes(&self) -> usize {
        self.pieces.iter().map(|p| p.held_bytes).sum()
    }

    /// Whether both are the same pieces (not equal values: the same arrays), so rows over them
    /// may sit in one cache.
    pub fn same_as(&self, other: &SharedPrefix) -> bool {
        self.pieces.len() == other.pieces.len() && self.pieces.iter().zip(&other.pieces).all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// This prefix with `piece` on top.
    pub fn with(&self, piece: Arc<Piece>) -> SharedPrefix {
        let mut pieces = self.pieces.clone();
        pieces.push(piece);
        SharedPrefix::new(self.geometry, pieces)
    }
}
