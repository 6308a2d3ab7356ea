//! The SSD tier: one file per block, a segment (`persist::segment`) written through the one
//! atomic writer, in one folder per chain root (`<dir>/<root, 32 hex>/<key, 64 hex>.lcs`). The
//! files are the database: opening the store rebuilds the index from their headers alone,
//! dropping what does not check (another root's or geometry's file, a damaged or truncated
//! one) and reaping temporaries a killed writer left; symlinks, FIFOs and foreign names are
//! never opened. Every change to the folder (a write, an eviction, the scan) holds an exclusive
//! `flock` on `<dir>/.lock`, so processes sharing the folder never see a half-made change, and
//! the byte budget is enforced at each write against the folder as it is (every process's
//! files; `ledger.rs`), least recently used (by modification time, which a use refreshes) first.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use mlx_rs::Array;

use crate::core::error::{error, fail, ErrorKind, Result};
use crate::core::model::families::Families;
use crate::core::persist::file::{self, Access};
use crate::core::persist::segment::{read_segment, read_segment_header, SegmentHeader, SegmentSource};
use crate::core::store::keys::{self, Key, MAX_NAMESPACE};
use crate::core::store::ledger::Ledger;

/// What a block file's key record starts with.
const MAGIC: &[u8; 8] = b"lcstore1";
/// The record's fixed part: magic, root, parent, key, block index.
const RECORD: usize = 8 + 32 * 3 + 8;
/// A block file's extension.
const EXT: &str = "lcs";
/// How long a change waits for another process's before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A block's identity as its file records it (in the segment's key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub root: Key,
    pub parent: Key,
    pub key: Key,
    pub index: u64,
    pub namespace: Vec<u8>,
}

impl Record {
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.root);
        out.extend_from_slice(&self.parent);
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&self.namespace);
        out
    }

    fn parse(b: &[u8]) -> Option<Record> {
        if b.len() < RECORD || b.len() > RECORD + MAX_NAMESPACE || &b[..8] != MAGIC {
            return None;
        }
        let key = |at: usize| -> Key { b[at..at + 32].try_into().expect("32 bytes") };
        let index = u64::from_le_bytes(b[104..112].try_into().expect("8 bytes"));
        Some(Record { root: key(8), parent: key(40), key: key(72), index, namespace: b[RECORD..].to_vec() })
    }
}

/// The folder a root's blocks live in.
pub fn folder_name(root: &Key) -> String {
    keys::hex(root)[..32].to_owned()
}

/// Checks a block file's header against where it lies (`folder`, `key` from its name): its own
/// record, its root derived from its namespace, block size and geometry, its range a block.
fn check(header: &SegmentHeader, folder: &str, key: &Key) -> Result<Record> {
    let Some(r) = Record::parse(&header.key) else {
        return fail!(InvalidArgument, "not a block of the prefix store");
    };
    let block = header.to - header.from;
    let from = (r.index as usize).checked_mul(block);
    if header.hot.iter().any(Option::is_some) || from != Some(header.from) {
        return fail!(InvalidArgument, "positions [{}, {}) are not block {}", header.from, header.to, r.index);
    }
    if &r.key != key || folder_name(&r.root) != folder || keys::root(&r.namespace, block, &header.geometries) != r.root {
        return fail!(InvalidArgument, "a block of another namespace, geometry or name (moved or planted)");
    }
    Ok(r)
}

#[derive(Clone, Debug)]
struct Entry {
    path: PathBuf,
    bytes: u64,
}

/// The index entry of the block file at `path` (in root folder `folder`, named for `key`), its
/// header checked (`check`): what the scan and a lookup's probe both index.
fn block_file(path: &Path, folder: &str, key: &Key) -> Result<Entry> {
    check(&read_segment_header(SegmentSource::Path(path))?, folder, key)?;
    let bytes = std::fs::symlink_metadata(path).map_or(0, |m| m.len());
    Ok(Entry { path: path.to_owned(), bytes })
}

/// What a scan found.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scan {
    pub kept: usize,
    /// Block files that did not check, removed (or, without the lock, ignored).
    pub dropped: usize,
    /// Temporaries of writes that never finished, removed.
    pub reaped: usize,
    /// Block files evicted to bring the folder within its budget.
    pub evicted: usize,
}

pub struct Disk {
    dir: PathBuf,
    budget: u64,
    lock: Option<File>,
    /// Held with the folder's lock, by one thread of this process at a time.
    changing: Mutex<()>,
    index: Mutex<HashMap<Key, Entry>>,
    ledger: Ledger,
}

/// Holds the folder's lock while alive: this process's (a writer thread and a caller's refresh
/// share one descriptor, which `flock` does not tell apart) and then the folder's.
struct Locked<'a>(&'a File, #[allow(dead_code)] MutexGuard<'a, ()>);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocking a descriptor the store owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Disk {
    /// Opens (making it where it does not exist) `dir` and indexes the blocks in it.
    pub fn open(dir: &Path, budget: u64) -> Result<(Disk, Scan)> {
        std::fs::create_dir_all(dir).map_err(|e| error!(InvalidArgument, "the store's folder {}: {e}", dir.display()))?;
        if !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
            return fail!(InvalidArgument, "the store's folder {} is not a folder", dir.display());
        }
        let disk = Disk {
            dir: dir.to_owned(),
            budget,
            lock: open_lock(&dir.join(".lock")),
            changing: Mutex::new(()),
            index: Mutex::new(HashMap::new()),
            ledger: Ledger::new(budget),
        };
        let scan = disk.rescan()?;
        Ok((disk, scan))
    }

    /// Rebuilds the index from the folder (the files other processes wrote since included).
    pub fn rescan(&self) -> Result<Scan> {
        let guard = self.locked()?;
        let mut scan = Scan::default();
        let mut found = HashMap::new();
        for (path, folder, name) in self.listing() {
            if name.starts_with('.') && name.contains(".tmp-") {
                // Every write runs under the lock, so a temporary seen under it is an orphan.
                if guard.is_some() && std::fs::remove_file(&path).is_ok() {
                    scan.reaped += 1;
                }
                continue;
            }
            let Some(key) = name.strip_suffix(&format!(".{EXT}")).and_then(keys::parse_hex) else {
                continue;
            };
            match block_file(&path, &folder, &key) {
                Ok(entry) => {
                    found.insert(key, entry);
                    scan.kept += 1;
                }
                Err(_) => {
                    scan.dropped += 1;
                    if guard.is_some() {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
        *self.index.lock().expect("index") = found;
        self.ledger.forget();
        if let Some(g) = &guard {
            // A folder left over its budget (a smaller budget than the last run's) is brought
            // within it now, not at the next write.
            scan.evicted = self.evict_to(g.0, 0).1;
        }
        Ok(scan)
    }

    /// Under the lock: evicts the folder's least recently used block files until `len` more
    /// bytes fit the budget (`ledger.rs`); returns the bytes then held and the files evicted.
    fn evict_to(&self, lock: &File, len: u64) -> (u64, usize) {
        let list = || {
            let mut files = Vec::new();
            for (p, _, name) in self.listing() {
                if name.ends_with(EXT) && !name.starts_with('.') {
                    if let Ok(m) = std::fs::symlink_metadata(&p) {
                        files.push((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), p));
                    }
                }
            }
            files
        };
        let (total, removed) = self.ledger.make_room(lock, list, len);
        let mut index = self.index.lock().expect("index");
        for p in &removed {
            if let Some(k) = p.file_stem().and_then(|s| keys::parse_hex(&s.to_string_lossy())) {
                index.remove(&k);
            }
        }
        (total, removed.len())
    }

    /// Every regular file under a root's folder: (path, folder name, file name). Symlinks,
    /// FIFOs and anything else are never listed, so never opened.
    fn listing(&self) -> Vec<(PathBuf, String, String)> {
        let mut out = Vec::new();
        let Ok(folders) = std::fs::read_dir(&self.dir) else {
            return out;
        };
        for folder in folders.flatten() {
            let name = folder.file_name().to_string_lossy().into_owned();
            if name.len() != 32 || !folder.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(folder.path()) else {
                continue;
            };
            for f in files.flatten() {
                if f.file_type().is_ok_and(|t| t.is_file()) {
                    out.push((f.path(), name.clone(), f.file_name().to_string_lossy().into_owned()));
                }
            }
        }
        out
    }

    /// Takes the folder's lock (`None` where the folder gave no lock file: reads only).
    fn locked(&self) -> Result<Option<Locked<'_>>> {
        use std::os::fd::AsRawFd;
        let Some(lock) = &self.lock else {
            return Ok(None);
        };
        let ours = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        let mut pause = Duration::from_micros(100);
        loop {
            // SAFETY: flock on a descriptor the store owns.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Some(Locked(lock, ours)));
            }
            if start.elapsed() > LOCK_WAIT {
                return fail!(Backend, "the store's folder {} stayed locked by another process", self.dir.display());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    pub fn has(&self, key: &Key) -> bool {
        self.index.lock().expect("index").contains_key(key)
    }

    /// Whether block `key` of root `root` has a file the index lacks (written by another
    /// process since this one last listed the folder): its header is read and checked as the
    /// scan checks it, and a block file that checks is indexed. One `stat` where there is none;
    /// no tensor is read, nothing is removed (that needs the folder's lock: the next scan).
    pub fn probe(&self, root: &Key, key: &Key) -> bool {
        let folder = folder_name(root);
        let path = self.dir.join(&folder).join(format!("{}.{EXT}", keys::hex(key)));
        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            return false;
        }
        let Ok(entry) = block_file(&path, &folder, key) else {
            return false;
        };
        self.index.lock().expect("index").insert(*key, entry);
        true
    }

    /// Blocks indexed and their bytes.
    pub fn totals(&self) -> (usize, u64) {
        let index = self.index.lock().expect("index");
        (index.len(), index.values().map(|e| e.bytes).sum())
    }

    /// Writes a block's file (`bytes`, a segment of `record`), evicting the least recently used
    /// files of the folder until it fits the budget. Returns the files evicted. Refused
    /// (nothing written) where the block alone exceeds the budget, the folder cannot be locked
    /// or written, or the disk is full.
    pub fn write(&self, record: &Record, bytes: &[u8]) -> Result<usize> {
        if self.has(&record.key) {
            return Ok(0);
        }
        let len = bytes.len() as u64;
        if len > self.budget {
            return fail!(Capacity, "a block of {len} bytes exceeds the store's SSD budget ({} bytes)", self.budget);
        }
        let Some(guard) = self.locked()? else {
            return fail!(Backend, "the store's folder {} cannot be locked: it is read-only here", self.dir.display());
        };
        let folder = self.dir.join(folder_name(&record.root));
        if !std::fs::symlink_metadata(&folder).is_ok_and(|m| m.is_dir()) {
            std::fs::create_dir(&folder).map_err(|e| error!(Backend, "making {}: {e}", folder.display()))?;
        }
        let path = folder.join(format!("{}.{EXT}", keys::hex(&record.key)));
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            // Another process wrote it first.
            let bytes = std::fs::symlink_metadata(&path).map_or(len, |m| m.len());
            self.index.lock().expect("index").insert(record.key, Entry { path, bytes });
            return Ok(0);
        }
        let (total, evicted) = self.evict_to(guard.0, len);
        if total + len > self.budget {
            return fail!(Capacity, "the store's SSD budget ({} bytes) is held by files it cannot evict", self.budget);
        }
        file::write_atomically(&path, Access::Shared, |f| {
            use std::io::Write;
            f.write_all(bytes).map_err(|e| error!(Backend, "writing {}: {e}", path.display()))
        })?;
        self.ledger.added(guard.0, path.clone(), len);
        self.index.lock().expect("index").insert(record.key, Entry { path, bytes: len });
        Ok(evicted)
    }

    /// Moves the files of `keys` it indexes to the newest end of the LRU order.
    pub fn touch(&self, keys: &[Key]) {
        let paths: Vec<PathBuf> = {
            let index = self.index.lock().expect("index");
            keys.iter().filter_map(|k| index.get(k).map(|e| e.path.clone())).collect()
        };
        if paths.is_empty() {
            return;
        }
        if let Ok(Some(guard)) = self.locked() {
            paths.iter().for_each(|p| touch(p));
            self.ledger.touched(guard.0, &paths.iter().map(PathBuf::as_path).collect::<Vec<_>>());
        }
    }

    /// Reads block `key` of root `root` (its record, range and geometry checked, every tensor
    /// against its checksum) and refreshes its place in the LRU order. A file that does not
    /// check is removed, one another process evicted forgotten (`InvalidArgument` either way:
    /// the block is a miss); other failures leave the file as it is.
    pub fn read(&self, root: &Key, key: &Key, block: usize) -> Result<Vec<Families<Vec<Array>>>> {
        let Some(entry) = self.index.lock().expect("index").get(key).cloned() else {
            return fail!(InvalidArgument, "block {} is not on the SSD", keys::hex(key));
        };
        let read = read_segment(SegmentSource::Path(&entry.path)).and_then(|(h, parts)| {
            let r = check(&h, &folder_name(root), key)?;
            if &r.root != root || h.to - h.from != block {
                return fail!(InvalidArgument, "{}: a block of another chain", entry.path.display());
            }
            Ok(parts)
        });
        match read {
            Ok(parts) => {
                touch(&entry.path);
                Ok(parts)
            }
            // Damaged, moved or gone: forgotten (and removed). Anything else (MLX's memory
            // limit, an I/O error) says nothing of the file, which stays.
            Err(e) if e.kind == ErrorKind::InvalidArgument => {
                self.index.lock().expect("index").remove(key);
                if let Ok(Some(_guard)) = self.locked() {
                    let _ = std::fs::remove_file(&entry.path);
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// The folder's lock file: opened for writing (made where missing), else for reading, never
/// through a symlink; `None` where neither opens (a folder this process only reads).
fn open_lock(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |write: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(write).create(write).mode(0o644).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        o.open(path).ok().filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
    };
    open(true).or_else(|| open(false))
}

/// Sets a file's modification time to now (its place in the LRU order); a failure loses
/// only that.
fn touch(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a valid path; NULL times mean now.
    unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), std::ptr::null(), libc::AT_SYMLINK_NOFOLLOW) };
}
