//! The RAM tier: blocks held as MLX arrays, in spans (the blocks one put, promotion or
//! consolidation made together: one piece per layer, `[1, blocks x block, part_width]` per
//! part, evaluated once and never written again), within a byte budget. Each block points to
//! the newest span that holds it; a span no block points to is dropped. Eviction is least
//! recently used, by span; a span some cache still reads (its pieces lent to an attach, or views
//! of them kept) is pinned and never evicted: dropping it would free nothing.
use std::collections::HashMap;
use std::sync::Arc;

use crate::core::mlx::readers::held_elsewhere;
use crate::core::storage::shared::Piece;
use crate::core::store::keys::Key;

/// Blocks stored together.
#[derive(Debug)]
pub struct Span {
    /// Its blocks' keys, in order (consecutive blocks of one chain).
    pub keys: Vec<Key>,
    /// One piece per layer, `keys.len()` blocks of positions.
    pub layers: Vec<Arc<Piece>>,
    /// Bytes its arrays hold.
    pub bytes: usize,
    last_use: u64,
}

impl Span {
    pub fn new(keys: Vec<Key>, layers: Vec<Arc<Piece>>) -> Span {
        let bytes = layers.iter().map(|p| p.held_bytes).sum();
        Span { keys, layers, bytes, last_use: 0 }
    }

    /// Whether a cache still reads it.
    fn pinned(&self) -> bool {
        self.layers.iter().any(|p| Arc::strong_count(p) > 1 || p.parts.iter().flatten().any(held_elsewhere))
    }
}

/// Where a block lies: its span and its place in it.
pub type At = (u64, usize);

#[derive(Debug, Default)]
pub struct Ram {
    budget: usize,
    spans: HashMap<u64, Span>,
    blocks: HashMap<Key, At>,
    next_id: u64,
    clock: u64,
    bytes: usize,
    /// Blocks evicted so far.
    pub evicted: u64,
}

impl Ram {
    pub fn new(budget: usize) -> Ram {
        Ram { budget, ..Ram::default() }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn at(&self, key: &Key) -> Option<At> {
        self.blocks.get(key).copied()
    }

    pub fn span(&self, id: u64) -> &Span {
        &self.spans[&id]
    }

    /// Marks a span used now.
    pub fn touch(&mut self, id: u64) {
        self.clock += 1;
        if let Some(s) = self.spans.get_mut(&id) {
            s.last_use = self.clock;
        }
    }

    /// Takes `span` in, its blocks pointing to it, after evicting the least recently used spans
    /// that are not pinned until it fits the budget. Returns its id, or the span back when it
    /// cannot fit (nothing evicted then).
    pub fn insert(&mut self, mut span: Span) -> Result<u64, Span> {
        // The bytes freed by spans this one replaces (every block of theirs re-pointed here).
        let replaced: usize = self.replaced_by(&span.keys).iter().map(|id| self.spans[id].bytes).sum();
        let need = (self.bytes - replaced + span.bytes).saturating_sub(self.budget);
        let victims = match self.victims(need, &span.keys) {
            Some(v) => v,
            None => return Err(span),
        };
        for id in victims {
            self.drop_span(id, true);
        }
        self.clock += 1;
        span.last_use = self.clock;
        let id = self.next_id;
        self.next_id += 1;
        for (i, key) in span.keys.iter().enumerate() {
            if let Some((old, _)) = self.blocks.insert(*key, (id, i)) {
                self.forget_if_unused(old);
            }
        }
        self.bytes += span.bytes;
        self.spans.insert(id, span);
        Ok(id)
    }

    /// Spans every one of whose blocks is among `keys`.
    fn replaced_by(&self, keys: &[Key]) -> Vec<u64> {
        let mut ids: Vec<u64> = keys.iter().filter_map(|k| self.blocks.get(k).map(|a| a.0)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.retain(|id| self.spans[id].keys.iter().all(|k| self.blocks.get(k).map(|a| a.0) != Some(*id) || keys.contains(k)));
        ids
    }

    /// The least recently used unpinned spans (not holding any of `keep`) freeing `need` bytes,
    /// or `None` when they cannot.
    fn victims(&self, need: usize, keep: &[Key]) -> Option<Vec<u64>> {
        if need == 0 {
            return Some(Vec::new());
        }
        let mut order: Vec<(&u64, &Span)> = self.spans.iter().collect();
        order.sort_by_key(|(_, s)| s.last_use);
        let (mut freed, mut out) = (0, Vec::new());
        for (id, span) in order {
            if span.keys.iter().any(|k| keep.contains(k)) || span.pinned() {
                continue;
            }
            freed += span.bytes;
            out.push(*id);
            if freed >= need {
                return Some(out);
            }
        }
        None
    }

    fn drop_span(&mut self, id: u64, evicted: bool) {
        let Some(span) = self.spans.remove(&id) else {
            return;
        };
        self.bytes -= span.bytes;
        for key in &span.keys {
            if self.blocks.get(key).map(|a| a.0) == Some(id) {
                self.blocks.remove(key);
                self.evicted += evicted as u64;
            }
        }
    }

    /// Drops span `id` when no block points to it any more.
    fn forget_if_unused(&mut self, id: u64) {
        let used = self.spans.get(&id).is_some_and(|s| s.keys.iter().any(|k| self.blocks.get(k).map(|a| a.0) == Some(id)));
        if !used {
            self.drop_span(id, false);
        }
    }
}
