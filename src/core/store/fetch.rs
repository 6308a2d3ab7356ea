//! A hit's blocks gathered from both tiers, and what is done with them: a restore copies them
//! into an empty set's one row (one copy, into buffers reserved for them), an attach lends them
//! below an empty set's rows as a shared prefix (RAM blocks as the store holds them: no copy).
//! Blocks read from the SSD are promoted to the RAM tier as they were read (no copy), budget
//! allowing. A block that fails its read (damaged, or evicted by another process) ends the hit
//! there: the caller gets the positions before it.
use std::sync::Arc;

use crate::core::cache::LatentCache;
use crate::core::error::{fail, ErrorKind, Result};
use crate::core::mlx::eval::eval;
use crate::core::mlx::math;
use crate::core::mlx::memory::check_alloc;
use crate::core::model::geometry::Geometry;
use crate::core::storage::shared::{Piece, SharedPrefix};
use crate::core::store::keys::Key;
use crate::core::store::ram::Span;
use crate::core::store::Store;

/// Most pieces an attach lends as they lie; a hit spread over more is joined into one span
/// first (one copy of it, which later attaches lend), since attention makes a pass per piece.
const MAX_LENT: usize = 4;

/// Consecutive blocks of a hit, one piece per layer.
type Chunk = Vec<Arc<Piece>>;

impl Store {
    /// Hands `each` the pieces of the first `keys` the store holds, chunk by chunk in order, as
    /// they are gathered (a restore copies a chunk while the next is read); returns the blocks
    /// they cover (fewer than `keys` where a block's file was damaged or gone). A read that
    /// failed for another reason (MLX's memory limit, an I/O error) fails the call.
    fn gather(&mut self, root: &Key, keys: &[Key], mut each: impl FnMut(Chunk) -> Result<()>) -> Result<usize> {
        let mut got = 0;
        while got < keys.len() {
            if let Some((id, at)) = self.ram.at(&keys[got]) {
                self.ram.touch(id);
                let span = self.ram.span(id);
                // The run of this span's blocks the hit goes on with.
                let run = span.keys[at..].iter().zip(&keys[got..]).take_while(|(a, b)| a == b).count();
                each(view(span, at, run, self.block)?)?;
                got += run;
                continue;
            }
            let Some(disk) = &self.disk else {
                break;
            };
            let layers = match disk.read(root, &keys[got], self.block) {
                Ok(layers) => layers,
                Err(e) if e.kind == ErrorKind::InvalidArgument => {
                    self.stats.damaged += 1;
                    break;
                }
                Err(e) => return Err(e),
            };
            let chunk: Chunk = layers
                .into_iter()
                .map(|parts| {
                    let held_bytes = parts.iter().flatten().map(|a| a.nbytes()).sum();
                    Arc::new(Piece { len: self.block, parts, held_bytes })
                })
                .collect();
            // Promoted as read: the arrays MLX's loader made.
            let _ = self.ram.insert(Span::new(vec![keys[got]], chunk.clone()));
            each(chunk)?;
            got += 1;
        }
        Ok(got)
    }

    /// The set's keys and hit, after the checks a restore and an attach make: layers empty.
    fn hit_for(&mut self, layers: &[&mut LatentCache], namespace: &[u8], tokens: &[u32]) -> Result<(Key, Vec<Key>)> {
        let geometries: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
        let (root, mut keys) = self.keys_for(&geometries, namespace, tokens)?;
        if let Some(i) = layers.iter().position(|l| l.batch_size() != 0 || l.shared_prefix().is_some()) {
            return fail!(State, "layer {i} holds rows: a restore or an attach fills an empty set (reset it first)");
        }
        let max = geometries.iter().filter(|g| g.max_tokens != 0).map(|g| g.max_tokens).min();
        if let Some(max) = max {
            keys.truncate(max / self.block);
        }
        let n = self.hit(&root, &keys);
        keys.truncate(n);
        Ok((root, keys))
    }

    /// Restores the longest stored prefix of `tokens` into `layers` (an empty set) as one row
    /// holding it; returns its positions (0: nothing stored, the set left empty). Every layer
    /// or none.
    pub fn restore(&mut self, layers: &mut [&mut LatentCache], namespace: &[u8], tokens: &[u32]) -> Result<usize> {
        let (root, keys) = self.hit_for(layers, namespace, tokens)?;
        let reserved: Vec<usize> = layers.iter().map(|l| l.reserved).collect();
        let filled = self.fill(layers, &root, &keys);
        let got = *filled.as_ref().unwrap_or(&0);
        if got == 0 {
            // The set was empty: emptied again, as it was.
            for (layer, r) in layers.iter_mut().zip(reserved) {
                layer.reset();
                layer.reserved = r;
            }
        }
        filled?;
        self.count_hit(got);
        if got == 0 {
            return Ok(0);
        }
        self.used(&keys[..got]);
        self.stats.restores += 1;
        Ok(got * self.block)
    }

    /// A restore's copies: buffers reserved for the whole hit, then chunk by chunk as gathered,
    /// every layer prepared before any is applied, each chunk copied once and handed to MLX
    /// before the next is read, so that the device copies one block while the host reads and
    /// checks the next file. Returns the blocks restored.
    fn fill(&mut self, layers: &mut [&mut LatentCache], root: &Key, keys: &[Key]) -> Result<usize> {
        if keys.is_empty() {
            return Ok(0);
        }
        for layer in layers.iter_mut() {
            layer.reserve(keys.len() * self.block)?;
        }
        let got = self.gather(root, keys, |chunk| {
            let mut changes = Vec::with_capacity(layers.len());
            for (layer, piece) in layers.iter().zip(&chunk) {
                changes.push(layer.prepare_append_stored(piece.parts.as_ref().map(|_, p| p.clone()), piece.len)?);
            }
            layers.iter_mut().zip(changes).for_each(|(l, c)| l.apply(c));
            layers.iter().try_for_each(|l| l.eval_async())
        })?;
        layers.iter().try_for_each(|l| l.eval())?;
        Ok(got)
    }

    /// Puts `rows` empty rows of `layers` (an empty set) over the longest stored prefix of
    /// `tokens`, lent as the store holds it (no copy where it lies in at most `MAX_LENT` spans);
    /// returns its positions (0: nothing stored, the set left empty). Every layer or none.
    pub fn attach(&mut self, layers: &mut [&mut LatentCache], namespace: &[u8], tokens: &[u32], rows: usize) -> Result<usize> {
        let (root, keys) = self.hit_for(layers, namespace, tokens)?;
        let mut chunks = Vec::new();
        let got = self.gather(&root, &keys, |chunk| {
            chunks.push(chunk);
            Ok(())
        })?;
        self.count_hit(got);
        if got == 0 {
            return Ok(0);
        }
        self.used(&keys[..got]);
        if chunks.len() > MAX_LENT {
            let joined = joined(&chunks, got * self.block)?;
            let _ = self.ram.insert(Span::new(keys[..got].to_vec(), joined.clone()));
            chunks = vec![joined];
        }
        let mut changes = Vec::with_capacity(layers.len());
        for (i, layer) in layers.iter().enumerate() {
            let pieces = chunks.iter().map(|c| c[i].clone()).collect();
            changes.push(layer.prepare_attach(&SharedPrefix::new(*layer.geometry(), pieces), rows)?);
        }
        layers.iter_mut().zip(changes).for_each(|(l, c)| l.apply(c));
        self.stats.attaches += 1;
        Ok(got * self.block)
    }
}

/// Blocks `at..at + run` of `span` as one piece per layer: the span's own pieces where the run
/// is all of it, else evaluated views of them (no copy; they keep the span's arrays alive).
fn view(span: &Span, at: usize, run: usize, block: usize) -> Result<Chunk> {
    if at == 0 && run == span.keys.len() {
        return Ok(span.layers.clone());
    }
    let (lo, hi) = (at * block, (at + run) * block);
    let chunk = span
        .layers
        .iter()
        .map(|piece| {
            let parts = piece.views(lo, hi)?;
            let held_bytes = piece.held_bytes / piece.len.max(1) * (hi - lo);
            Ok(Arc::new(Piece { len: hi - lo, parts, held_bytes }))
        })
        .collect::<Result<Chunk>>()?;
    eval(chunk.iter().flat_map(|p| p.parts.iter().flatten()))?;
    Ok(chunk)
}

/// The chunks joined into one piece per layer (one copy, evaluated), checked against MLX's
/// memory limit first.
fn joined(chunks: &[Chunk], positions: usize) -> Result<Chunk> {
    let bytes: usize = chunks[0].iter().map(|p| p.held_bytes / p.len.max(1)).sum::<usize>().saturating_mul(positions);
    check_alloc(Some(bytes), "joining a stored prefix's blocks")?;
    let layers = chunks[0].len();
    let out = (0..layers)
        .map(|i| {
            let first = &chunks[0][i];
            let parts = first.parts.as_ref().try_map(|family, parts| {
                (0..parts.len())
                    .map(|k| {
                        let all: Vec<&_> = chunks.iter().map(|c| &c[i].parts.get(family).expect("one geometry")[k]).collect();
                        math::concatenate(&all, 1)
                    })
                    .collect::<Result<Vec<_>>>()
            })?;
            let held_bytes = first.held_bytes / first.len.max(1) * positions;
            Ok(Arc::new(Piece { len: positions, parts, held_bytes }))
        })
        .collect::<Result<Chunk>>()?;
    eval(out.iter().flat_map(|p| p.parts.iter().flatten()))?;
    Ok(out)
}
