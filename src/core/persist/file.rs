//! Files written whole or not at all, for both formats: a save writes a fresh temporary file
//! beside the target, syncs it and renames it over the target, so the target holds the old file
//! or the new one, never a mix, and a failed save leaves it untouched.
//!
//! Every temporary name is new: the process id, a process-wide counter and 64 unpredictable
//! bits, created exclusively (`O_CREAT | O_EXCL`), so saves to one path from several threads or
//! processes never share a temporary, and a file or symlink planted under a guessed name is never
//! opened or followed (the name is drawn again).
//!
//! Every file a load reads is opened once (`open_regular`): without blocking (a FIFO's open
//! would wait for a writer), checked to be a regular file on that descriptor, and read through
//! it, so what was checked is what is read.
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::ErrorKind as IoKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::error::{error, fail, Result};

/// Mode bits of a new file where files have modes (the umask still applies).
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// Readable by others as the umask allows (0666 before it), as `File::create` makes files.
    Shared,
    /// The owner's only (0600).
    Private,
}

/// Names drawn before giving up (a clash needs a planted file or 64 bits of bad luck).
const ATTEMPTS: usize = 16;

/// A name no other save in this process has used, unpredictable to anyone else: the counter
/// rules out clashes within the process, the random bits guesses from outside it.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // A fresh `RandomState` carries keys seeded from the OS's random source.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    format!("{}-{n}-{:016x}", std::process::id(), h.finish())
}

/// Creates a new file in `dir` named `{prefix}{unique}{suffix}`, exclusively: an existing file
/// or symlink under the name is never opened (another name is drawn).
pub fn create_unique(dir: &Path, prefix: &str, suffix: &str, access: Access) -> Result<(PathBuf, File)> {
    for _ in 0..ATTEMPTS {
        let path = dir.join(format!("{prefix}{}{suffix}", unique_suffix()));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(
            &mut options,
            match access {
                Access::Shared => 0o666,
                Access::Private => 0o600,
            },
        );
        #[cfg(not(unix))]
        let _ = access;
        match options.open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == IoKind::AlreadyExists => continue,
            Err(e) => return fail!(Backend, "creating {}: {e}", path.display()),
        }
    }
    fail!(Backend, "creating a temporary file in {}: every name drawn was taken", dir.display())
}

/// Writes `path` whole: `write` fills a new temporary file beside it (and flushes whatever it
/// buffers), which is synced and renamed over `path`. On any failure the temporary is removed
/// and `path` is left as it was.
pub fn write_atomically(path: &Path, access: Access, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let Some(name) = path.file_name() else {
        return fail!(InvalidArgument, "{} names no file", path.display());
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return fail!(Backend, "cannot write {}: its folder does not exist", path.display());
    }
    // The target's name, shortened so the temporary's stays within the file system's limit.
    let name = name.to_string_lossy();
    let cut = name.char_indices().map(|(at, c)| at + c.len_utf8()).take_while(|&end| end <= 128).last().unwrap_or(0);
    let stem = &name[..cut];
    let (tmp, mut file) = create_unique(dir, &format!(".{stem}.tmp-"), "", access)?;
    let written = (|| {
        write(&mut file)?;
        file.sync_all().map_err(|e| error!(Backend, "syncing {}: {e}", tmp.display()))?;
        drop(file);
        std::fs::rename(&tmp, path).map_err(|e| error!(Backend, "renaming {} to {}: {e}", tmp.display(), path.display()))
    })();
    match written {
        Ok(()) => {
            sync_dir(dir);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Makes the rename durable where folders can be synced; the file is already whole under
/// either name, so a failure here loses nothing but durability and is not reported.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Opens `path` for reading, once: with `O_NONBLOCK`, so opening a FIFO cannot block, then
/// checked on the descriptor (`fstat`) to be a regular file (a FIFO, a device or a folder is
/// refused), and set back to blocking reads. Returns the file and its length; the caller reads
/// through this descriptor only, never the path again.
pub fn open_regular(path: &Path) -> Result<(File, u64)> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = options.open(path).map_err(|e| error!(InvalidArgument, "opening {}: {e}", path.display()))?;
    let meta = file.metadata().map_err(|e| error!(InvalidArgument, "{}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        return fail!(InvalidArgument, "{} is not a regular file", path.display());
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor this function owns, reading and setting its flags.
        let cleared = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
        };
        if !cleared {
            return fail!(Backend, "{}: {}", path.display(), std::io::Error::last_os_error());
        }
    }
    Ok((file, meta.len()))
}
