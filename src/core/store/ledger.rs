//! The SSD tier's budget: the folder's block files, oldest use first, and the bytes they hold,
//! kept between writes instead of listing the folder for each one (a listing stats every file:
//! at 10,000 blocks that costs more than writing one). Processes sharing the folder keep it
//! true through a generation counter in the lock file's first 8 bytes: every change to the
//! folder (a write, an eviction, a use that moves a file in the LRU order) bumps it under the
//! lock, and a writer that finds another generation than its own lists the folder again. A full
//! listing is also made every `RELIST_AFTER` writes, so files planted or removed by hand enter
//! the budget soon. Everything here runs under the folder's lock.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Writes between full listings, whatever the generation says.
const RELIST_AFTER: u32 = 256;

/// A block file: when it was last used, its bytes, where it is.
pub type BlockFile = (SystemTime, u64, PathBuf);

struct Cached {
    generation: u64,
    /// Oldest use first.
    files: Vec<BlockFile>,
    writes: u32,
}

pub struct Ledger {
    budget: u64,
    cached: Mutex<Option<Cached>>,
}

fn generation(lock: &File) -> u64 {
    let mut b = [0u8; 8];
    match lock.read_at(&mut b, 0) {
        Ok(8) => u64::from_le_bytes(b),
        _ => 0,
    }
}

impl Ledger {
    pub fn new(budget: u64) -> Ledger {
        Ledger { budget, cached: Mutex::new(None) }
    }

    /// Drops what it kept: the next change lists the folder.
    pub fn forget(&self) {
        *self.cached.lock().expect("ledger") = None;
    }

    /// Evicts the least recently used files until `len` more bytes fit the budget (`list` makes
    /// a full listing where the one kept is stale); returns the bytes then held and the files
    /// removed.
    pub fn make_room(&self, lock: &File, list: impl FnOnce() -> Vec<BlockFile>, len: u64) -> (u64, Vec<PathBuf>) {
        let g = generation(lock);
        let mut cached = self.cached.lock().expect("ledger");
        let fresh = matches!(&*cached, Some(c) if c.generation == g && c.writes < RELIST_AFTER);
        if !fresh {
            let mut files = list();
            files.sort();
            *cached = Some(Cached { generation: g, files, writes: 0 });
        }
        let c = cached.as_mut().expect("listed");
        let mut total: u64 = c.files.iter().map(|f| f.1).sum();
        let mut removed = Vec::new();
        while total + len > self.budget && !c.files.is_empty() {
            let (_, n, p) = c.files.remove(0);
            // Gone already (removed by hand) or removed now: either way it holds nothing.
            if std::fs::remove_file(&p).is_ok() || !p.exists() {
                total -= n;
                removed.push(p);
            }
        }
        if !removed.is_empty() {
            bump(lock, &mut cached);
        }
        (total, removed)
    }

    /// Records a file just written.
    pub fn added(&self, lock: &File, path: PathBuf, len: u64) {
        let mut cached = self.cached.lock().expect("ledger");
        if let Some(c) = cached.as_mut() {
            c.files.retain(|f| f.2 != path);
            c.files.push((SystemTime::now(), len, path));
            c.writes += 1;
        }
        bump(lock, &mut cached);
    }

    /// Records files just used (their modification times set to now).
    pub fn touched(&self, lock: &File, paths: &[&Path]) {
        let mut cached = self.cached.lock().expect("ledger");
        if let Some(c) = cached.as_mut() {
            let (mut moved, mut kept): (Vec<BlockFile>, Vec<BlockFile>) =
                c.files.drain(..).partition(|f| paths.contains(&f.2.as_path()));
            let now = SystemTime::now();
            moved.iter_mut().for_each(|f| f.0 = now);
            kept.append(&mut moved);
            c.files = kept;
        }
        bump(lock, &mut cached);
    }
}

/// Bumps the folder's generation, and ours with it where our ledger was current.
fn bump(lock: &File, cached: &mut Option<Cached>) {
    let g = generation(lock);
    if lock.write_at(&(g + 1).to_le_bytes(), 0).is_ok() {
        if let Some(c) = cached.as_mut().filter(|c| c.generation == g) {
            c.generation = g + 1;
        }
    }
}
