//! The prefix store: "restore the longest stored prefix of these tokens", in RAM and on SSD,
//! within byte budgets. Positions are keyed by a hash chain over fixed blocks of tokens under
//! a namespace (`keys`), so a prefix is stored once whoever stored it first; a put copies only
//! the blocks the store lacks into the RAM tier (`ram`) and hands them to a writer thread
//! (`writer`) that writes them to the SSD tier (`disk`) behind the caller; a lookup answers from
//! the indexes alone; a restore copies the stored positions into an empty set's one row, and
//! an attach lends them (`shared` pieces, no copy) below an empty set's rows (`fetch`).
//!
//! | file | its job |
//! |---|---|
//! | `keys.rs` | the chain's root and block keys (SHA-256) |
//! | `ram.rs` | the RAM tier: spans of blocks, LRU by span within a byte budget, pins |
//! | `disk.rs` | the SSD tier: block files, the header-only scan, the folder's lock |
//! | `ledger.rs` | the SSD tier's budget: its files in LRU order, kept true between processes |
//! | `writer.rs` | write-behind: the thread writing RAM blocks to the SSD |
//! | `fetch.rs` | a hit's blocks gathered from both tiers; restore and attach |
//!
//! Composed storage is refused: its hot side follows each whole row, so a block of positions is
//! not what it stores (and it cannot share a prefix).
mod disk;
mod fetch;
mod keys;
mod ledger;
mod ram;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::mlx::eval::eval;
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::storage::shared::Piece;

use disk::{Disk, Record};
use keys::Key;
use keys::{MAX_BLOCK, MAX_NAMESPACE};
use ram::{Ram, Span};
use writer::{Job, Writer};

/// How a store is made.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Tokens per block (1 to `MAX_BLOCK`).
    pub block: usize,
    /// Bytes of MLX arrays the RAM tier may hold.
    pub ram_bytes: usize,
    /// Bytes of files the SSD tier may hold in `folder`.
    pub ssd_bytes: u64,
    /// The SSD tier's folder; `None` for a store in RAM only.
    pub folder: Option<PathBuf>,
}

/// A store's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub ram_blocks: u64,
    pub ram_bytes: u64,
    pub ssd_blocks: u64,
    pub ssd_bytes: u64,
    /// Lookups, restores and attaches that found at least one block, and those that found none.
    pub hits: u64,
    pub misses: u64,
    pub ram_evictions: u64,
    pub ssd_evictions: u64,
    pub restores: u64,
    pub attaches: u64,
    /// Blocks puts copied in, and those neither tier could take.
    pub blocks_put: u64,
    pub blocks_not_stored: u64,
    pub blocks_written: u64,
    pub write_failures: u64,
    /// Block files found damaged (at the scan or a read) and dropped.
    pub damaged: u64,
}

/// What a put did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Put {
    /// Whole blocks of the row's positions the tokens name.
    pub blocks: usize,
    /// Of them, those the store lacked and now holds (in RAM, or on its way to the SSD).
    pub stored: usize,
    /// Of them, those it lacked and could not take (budgets).
    pub not_stored: usize,
}

pub struct Store {
    block: usize,
    ram: Ram,
    disk: Option<Arc<Disk>>,
    writer: Option<Writer>,
    stats: StoreStats,
}

impl Store {
    pub fn open(config: &StoreConfig) -> Result<Store> {
        if config.block == 0 || config.block > MAX_BLOCK {
            return fail!(InvalidArgument, "a block of {} tokens (1 to {MAX_BLOCK})", config.block);
        }
        let mut stats = StoreStats::default();
        let (disk, writer) = match &config.folder {
            None => (None, None),
            Some(dir) => {
                let (disk, scan) = Disk::open(dir, config.ssd_bytes)?;
                (stats.damaged, stats.ssd_evictions) = (scan.dropped as u64, scan.evicted as u64);
                let disk = Arc::new(disk);
                (Some(disk.clone()), Some(Writer::start(disk)?))
            }
        };
        Ok(Store { block: config.block, ram: Ram::new(config.ram_bytes), disk, writer, stats })
    }

    pub fn block(&self) -> usize {
        self.block
    }

    pub fn stats(&self) -> StoreStats {
        let mut s = self.stats;
        (s.ram_blocks, s.ram_bytes, s.ram_evictions) = (self.ram.blocks() as u64, self.ram.bytes() as u64, self.ram.evicted);
        if let Some(disk) = &self.disk {
            let (blocks, bytes) = disk.totals();
            (s.ssd_blocks, s.ssd_bytes) = (blocks as u64, bytes);
        }
        if let Some(w) = &self.writer {
            s.blocks_written = w.counts.written.load(Ordering::Relaxed);
            s.write_failures = w.counts.failed.load(Ordering::Relaxed);
            s.ssd_evictions += w.counts.evicted.load(Ordering::Relaxed);
        }
        s
    }

    /// Waits until every block put so far is on the SSD (or failed: `Backend` naming the first
    /// failure since the last sync). A store without a folder has nothing to wait for.
    pub fn sync(&self) -> Result<()> {
        self.writer.as_ref().map_or(Ok(()), Writer::sync)
    }

    /// Rebuilds the SSD index from the folder (the blocks other processes wrote since);
    /// returns the blocks indexed.
    pub fn refresh(&mut self) -> Result<usize> {
        let Some(disk) = &self.disk else {
            return Ok(0);
        };
        let scan = disk.rescan()?;
        self.stats.damaged += scan.dropped as u64;
        self.stats.ssd_evictions += scan.evicted as u64;
        Ok(scan.kept)
    }

    /// The chain's keys of `tokens` for `layers`, after the checks every call makes.
    fn keys_for(&self, geometries: &[Geometry], namespace: &[u8], tokens: &[u32]) -> Result<(Key, Vec<Key>)> {
        if namespace.len() > MAX_NAMESPACE {
            return fail!(InvalidArgument, "a namespace of {} bytes (at most {MAX_NAMESPACE})", namespace.len());
        }
        if geometries.is_empty() {
            return fail!(InvalidArgument, "the set holds no layers");
        }
        if geometries.iter().any(|g| g.composed()) {
            return fail!(
                InvalidArgument,
                "composed storage cannot be stored by blocks: its hot side follows each whole row (store a set without it)"
            );
        }
        let root = keys::root(namespace, self.block, geometries);
        Ok((root, keys::chain(&root, tokens, self.block)))
    }

    fn held(&self, key: &Key) -> bool {
        self.ram.at(key).is_some() || self.disk.as_ref().is_some_and(|d| d.has(key))
    }

    /// Blocks at the start of `keys` (of chain `root`) the store holds: those its indexes hold
    /// (no I/O), then those whose files another process wrote since (`Disk::probe`: one `stat`
    /// where there is none, so a lookup that ends in a miss costs one).
    fn hit(&self, root: &Key, keys: &[Key]) -> usize {
        let held = keys.iter().take_while(|k| self.held(k)).count();
        let Some(disk) = &self.disk else {
            return held;
        };
        held + keys[held..].iter().take_while(|k| disk.probe(root, k)).count()
    }

    /// Marks blocks used: their RAM spans now, their files by the writer.
    fn used(&mut self, keys: &[Key]) {
        for key in keys {
            if let Some((id, _)) = self.ram.at(key) {
                self.ram.touch(id);
            }
        }
        // All of them: the writer touches those on the SSD when it comes to them, after the
        // writes sent before (a block put a moment ago is on the SSD by then).
        if let Some(w) = &self.writer {
            w.touch(keys.to_vec());
        }
    }

    /// Positions of the longest stored prefix of `tokens` (whole blocks), from the indexes alone.
    pub fn lookup(&mut self, geometries: &[Geometry], namespace: &[u8], tokens: &[u32]) -> Result<usize> {
        let (root, keys) = self.keys_for(geometries, namespace, tokens)?;
        let n = self.hit(&root, &keys);
        self.count_hit(n);
        Ok(n * self.block)
    }

    fn count_hit(&mut self, blocks: usize) {
        match blocks {
            0 => self.stats.misses += 1,
            _ => self.stats.hits += 1,
        }
    }

    /// Stores row `row` of `layers` (a set's layers), whose first positions are `tokens`: every
    /// whole block of them (up to the row's length) the store lacks is copied into the RAM tier
    /// and sent to the SSD behind the call; blocks it holds are only marked used. Refused
    /// (nothing stored) for composed storage, a set in a round, a prefill or maintenance, or a
    /// copy over MLX's memory limit.
    pub fn put(&mut self, layers: &[&LatentCache], row: usize, namespace: &[u8], tokens: &[u32]) -> Result<Put> {
        let geometries: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
        let held = match layers.first() {
            Some(l) if row < l.batch_size() => l.row_offsets()[row],
            Some(l) => return fail!(OutOfRange, "row {row} out of range: the set holds {} rows", l.batch_size()),
            None => 0,
        };
        let (root, mut keys) = self.keys_for(&geometries, namespace, tokens)?;
        layers.iter().try_for_each(|l| l.check_saveable())?;
        keys.truncate(held / self.block);
        let mut put = Put { blocks: keys.len(), ..Put::default() };
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| !self.held(&keys[i])).collect();
        let known: Vec<Key> = (0..keys.len()).filter(|i| !missing.contains(i)).map(|i| keys[i]).collect();
        self.used(&known);
        // Runs of consecutive missing blocks, one span each.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &i in &missing {
            match runs.last_mut() {
                Some((_, end)) if *end == i => *end += 1,
                _ => runs.push((i, i + 1)),
            }
        }
        let bpt: usize = layers.iter().map(|l| l.bytes_per_token()).sum();
        let total = missing.len().checked_mul(self.block).and_then(|n| n.checked_mul(bpt));
        check_alloc(total, &format!("copying {} blocks into the prefix store", missing.len()))?;
        let mut made = Vec::new();
        for &(lo, hi) in &runs {
            let pieces = layers.iter().map(|l| copied(l, row, lo * self.block, hi * self.block)).collect::<Result<Vec<_>>>()?;
            made.push(((lo, hi), pieces));
        }
        eval(made.iter().flat_map(|(_, p)| p.iter().flat_map(|p| p.parts.iter().flatten())))?;
        for ((lo, hi), pieces) in made {
            let pieces: Vec<Arc<Piece>> = pieces.into_iter().map(Arc::new).collect();
            if let Some(w) = &self.writer {
                let records = (lo..hi).map(|i| record(&root, &keys, i, namespace)).collect();
                w.send(Job { records, layers: pieces.clone(), geometries: geometries.clone(), block: self.block });
            }
            let blocks = hi - lo;
            match (self.ram.insert(Span::new(keys[lo..hi].to_vec(), pieces)), &self.writer) {
                (Ok(_), _) | (Err(_), Some(_)) => put.stored += blocks,
                (Err(_), None) => put.not_stored += blocks,
            }
        }
        self.stats.blocks_put += put.stored as u64;
        self.stats.blocks_not_stored += put.not_stored as u64;
        Ok(put)
    }
}

/// Block `i`'s record: where it lies in its chain.
fn record(root: &Key, keys: &[Key], i: usize, namespace: &[u8]) -> Record {
    let parent = if i == 0 { *root } else { keys[i - 1] };
    Record { root: *root, parent, key: keys[i], index: i as u64, namespace: namespace.to_vec() }
}

/// Row `row`'s positions `[lo, hi)` of `layer` copied into a piece of their own (not yet
/// evaluated): the cache keeps writing its buffers in place, so the store never holds views
/// of them.
fn copied(layer: &LatentCache, row: usize, lo: usize, hi: usize) -> Result<Piece> {
    let g = layer.geometry();
    let parts = Families::for_geometry(g, |family, _| family).try_map(|_, family: Family| {
        layer.stored_row_parts(family, row, lo, hi)?.iter().map(ops::copy).collect::<Result<Vec<_>>>()
    })?;
    Ok(Piece { len: hi - lo, parts, held_bytes: (hi - lo) * g.bytes_per_token() })
}
