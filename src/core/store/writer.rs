//! Write-behind: one thread per store writes the blocks the RAM tier took to the SSD, off the
//! callers' threads. It holds each span's pieces until its blocks are written (so their memory
//! lives that long, pinned in the RAM tier), builds each block's segment from views of them (no
//! copy before the file) and writes it through the SSD tier. A failed write is counted and
//! reported by the next `sync`; the block stays a RAM block, or is lost with it.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::core::error::{fail, Result};
use crate::core::mlx::eval::eval;
use crate::core::model::geometry::Geometry;
use crate::core::persist::segment::segment_of_parts;
use crate::core::storage::shared::Piece;
use crate::core::store::disk::{Disk, Record};
use crate::core::store::keys::Key;

/// Blocks to write: `records[i]` is the block at positions `[i * block, (i + 1) * block)` of
/// `layers`.
pub struct Job {
    pub records: Vec<Record>,
    pub layers: Vec<Arc<Piece>>,
    pub geometries: Vec<Geometry>,
    pub block: usize,
}

enum Message {
    Write(Job),
    /// Blocks used again: their files move to the newest end of the folder's LRU order.
    Touch(Vec<Key>),
    Sync(Sender<()>),
}

/// What the writer did, read by the store's numbers.
#[derive(Debug, Default)]
pub struct Counts {
    pub written: AtomicU64,
    pub failed: AtomicU64,
    pub evicted: AtomicU64,
    /// The first failure since the last `sync`.
    pub failure: Mutex<Option<String>>,
}

pub struct Writer {
    tx: Option<Sender<Message>>,
    thread: Option<JoinHandle<()>>,
    pub counts: Arc<Counts>,
}

impl Writer {
    pub fn start(disk: Arc<Disk>) -> Result<Writer> {
        let (tx, rx) = channel();
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name("latent-cache store writer".into())
            .spawn(move || run(rx, &disk, &c))
            .map_err(|e| crate::core::error::error!(Backend, "starting the store's writer: {e}"))?;
        Ok(Writer { tx: Some(tx), thread: Some(thread), counts })
    }

    pub fn send(&self, job: Job) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Message::Write(job));
        }
    }

    /// Refreshes the files of `keys` (those on the SSD) in the LRU order, behind the caller.
    pub fn touch(&self, keys: Vec<Key>) {
        if let Some(tx) = self.tx.as_ref().filter(|_| !keys.is_empty()) {
            let _ = tx.send(Message::Touch(keys));
        }
    }

    /// Waits until every block sent before is written (or failed); `Backend` with the first
    /// failure since the last sync, if any.
    pub fn sync(&self) -> Result<()> {
        let (done, wait) = channel();
        if let Some(tx) = &self.tx {
            if tx.send(Message::Sync(done)).is_ok() {
                let _ = wait.recv();
            }
        }
        match self.counts.failure.lock().expect("failure").take() {
            Some(why) => fail!(Backend, "a block was not written to the SSD: {why}"),
            None => Ok(()),
        }
    }
}

impl Drop for Writer {
    /// Finishes the blocks already sent, then stops.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(rx: Receiver<Message>, disk: &Disk, counts: &Counts) {
    for message in rx {
        match message {
            Message::Touch(keys) => disk.touch(&keys),
            Message::Sync(done) => {
                let _ = done.send(());
            }
            Message::Write(job) => {
                for (i, record) in job.records.iter().enumerate() {
                    match write_block(disk, &job, i, record) {
                        Ok(evicted) => {
                            counts.written.fetch_add(1, Ordering::Relaxed);
                            counts.evicted.fetch_add(evicted as u64, Ordering::Relaxed);
                        }
                        Err(e) => {
                            counts.failed.fetch_add(1, Ordering::Relaxed);
                            counts.failure.lock().expect("failure").get_or_insert(e.message);
                        }
                    }
                }
            }
        }
    }
}

/// Writes block `i` of `job`: views of its positions in every layer's piece, as a segment.
fn write_block(disk: &Disk, job: &Job, i: usize, record: &Record) -> Result<usize> {
    if disk.has(&record.key) {
        return Ok(0);
    }
    let (lo, hi) = (i * job.block, (i + 1) * job.block);
    let parts = job.layers.iter().map(|piece| piece.views(lo, hi)).collect::<Result<Vec<_>>>()?;
    // Views of evaluated arrays: evaluating them reads nothing, and lets the writer read their
    // bytes where they lie.
    eval(parts.iter().flat_map(|f| f.iter().flatten()))?;
    let from = record.index as usize * job.block;
    let (bytes, _) = segment_of_parts(&job.geometries, &parts, (from, from + job.block), &record.bytes())?;
    disk.write(record, &bytes)
}
