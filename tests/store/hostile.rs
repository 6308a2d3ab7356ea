//! A damaged or planted folder: truncated files, flipped bytes in a header or in the positions,
//! one block's file under another's name, another namespace's file moved in, `.tmp` orphans,
//! symlinks and FIFOs under block names, garbage, a lock file that cannot be opened. Each
//! degrades to a shorter hit, "no hit" or "not stored" with a status: never a panic, a hang or
//! a wrong restore.
use std::path::{Path, PathBuf};

use super::engine::{block_files, geometries, open, scratch, tokens, Engine};
use crate::common::model::Rng;

use latent_cache::core::store::Store;
use latent_cache::{ErrorKind, LayoutKind, StorageMode};

const BLOCK: usize = 16;

/// A folder holding 5 blocks of `a`'s 80 tokens under namespace "ns" (and, for planting, 5 of
/// another namespace's), with its block files in chain order.
fn folder(name: &str, a: &Engine) -> (PathBuf, Vec<PathBuf>) {
    let dir = scratch(name);
    let mut store = open(Some(&dir), BLOCK, 1 << 30, 1 << 30);
    store.put(&a.shared(), 0, b"ns", &a.tokens).unwrap();
    store.sync().unwrap();
    drop(store);
    let files = order(&dir, a);
    let mut other = open(Some(&dir), BLOCK, 1 << 30, 1 << 30);
    other.put(&a.shared(), 0, b"other", &a.tokens).unwrap();
    other.sync().unwrap();
    (dir, files)
}

/// `a`'s block files in chain order: found by restarting over the folder with each file kept
/// alone, the one whose lookup answers block k.
fn order(dir: &Path, a: &Engine) -> Vec<PathBuf> {
    let gs: Vec<_> = a.layers.iter().map(|l| *l.geometry()).collect();
    let files = block_files(dir);
    let mut out: Vec<PathBuf> = Vec::with_capacity(files.len());
    let hidden = dir.join("hidden");
    std::fs::create_dir_all(&hidden).unwrap();
    for f in &files {
        std::fs::rename(f, hidden.join(f.file_name().unwrap())).unwrap();
    }
    for k in 0..files.len() {
        // Bring back the file that makes the hit one block longer.
        for f in &files {
            if out.contains(f) {
                continue;
            }
            std::fs::rename(hidden.join(f.file_name().unwrap()), f).unwrap();
            let mut s = open(Some(dir), BLOCK, 0, 1 << 30);
            if s.lookup(&gs, b"ns", &a.tokens).unwrap() == (k + 1) * BLOCK {
                out.push(f.clone());
                break;
            }
            std::fs::rename(f, hidden.join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::remove_dir_all(&hidden).unwrap();
    out
}

fn restart(dir: &Path) -> Store {
    open(Some(dir), BLOCK, 1 << 30, 1 << 30)
}

/// Restores `a`'s tokens from a restarted store: exactly `want` positions, bit for bit.
fn expect(dir: &Path, a: &Engine, want: usize, what: &str) -> Store {
    let gs: Vec<_> = a.layers.iter().map(|l| *l.geometry()).collect();
    let mut store = restart(dir);
    let mut b = Engine::new(&gs);
    let got = b.restore(&mut store, b"ns", &a.tokens);
    assert_eq!(got, want, "{what}: positions restored");
    b.check(what);
    store
}

#[test]
fn damaged_and_planted_files_are_refused_and_restores_stay_exact() {
    let gs = geometries(StorageMode::Q8, LayoutKind::RightJustified);
    let mut rng = Rng::new(7);
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut rng, 80));

    let (dir, files) = folder("truncated", &a);
    let len = std::fs::metadata(&files[2]).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&files[2]).unwrap().set_len(len - 100).unwrap();
    let s = expect(&dir, &a, 32, "a truncated block");
    assert!(s.stats().damaged >= 1 && !files[2].exists(), "the truncated file was dropped at the scan");

    let (dir, files) = folder("flipped-data", &a);
    let mut bytes = std::fs::read(&files[3]).unwrap();
    let at = bytes.len() - 7;
    bytes[at] ^= 0x40;
    std::fs::write(&files[3], &bytes).unwrap();
    let gs2 = gs.clone();
    let mut s = restart(&dir);
    assert_eq!(s.lookup(&gs2, b"ns", &a.tokens).unwrap(), 80, "a header that checks is indexed");
    let mut b = Engine::new(&gs);
    assert_eq!(b.restore(&mut s, b"ns", &a.tokens), 48, "the read of the flipped block ends the hit");
    b.check("a block whose positions were flipped");
    assert_eq!(s.lookup(&gs2, b"ns", &a.tokens).unwrap(), 48, "and it is forgotten");
    assert!(!files[3].exists());

    let (dir, files) = folder("flipped-header", &a);
    let mut bytes = std::fs::read(&files[1]).unwrap();
    bytes[60] ^= 0x01;
    std::fs::write(&files[1], &bytes).unwrap();
    expect(&dir, &a, 16, "a flipped header");

    let (dir, files) = folder("planted", &a);
    std::fs::copy(&files[0], &files[4]).unwrap();
    expect(&dir, &a, 64, "block 0's file planted under block 4's name");

    let (dir, files) = folder("moved", &a);
    let foreign = block_files(&dir).into_iter().find(|f| !files.contains(f)).unwrap();
    std::fs::rename(&foreign, files[0].parent().unwrap().join(foreign.file_name().unwrap())).unwrap();
    let s = expect(&dir, &a, 80, "another namespace's file moved in");
    assert!(s.stats().damaged >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn orphans_links_fifos_and_garbage_never_hang_or_restore() {
    let gs = geometries(StorageMode::Bf16, LayoutKind::Ragged);
    let mut rng = Rng::new(8);
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut rng, 80));
    let (dir, files) = folder("junk", &a);
    let ns_dir = files[0].parent().unwrap().to_owned();
    let orphan = ns_dir.join(".aa.lcs.tmp-1-2-3");
    std::fs::write(&orphan, b"half a block").unwrap();
    // A symlink under block 2's name to block 2's own file: never followed.
    let moved = ns_dir.join("elsewhere");
    std::fs::rename(&files[2], &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &files[2]).unwrap();
    // A FIFO under block 3's name: opening it would block.
    std::fs::remove_file(&files[3]).unwrap();
    let c = std::ffi::CString::new(files[3].to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::fs::write(ns_dir.join(format!("{}.lcs", "0".repeat(64))), b"garbage").unwrap();
    std::fs::write(ns_dir.join(format!("{}.lcs", "1".repeat(64))), b"").unwrap();
    std::os::unix::fs::symlink(&ns_dir, dir.join("0123456789abcdef0123456789abcdef")).unwrap();
    let s = expect(&dir, &a, 32, "a folder of junk");
    assert!(!orphan.exists(), "the orphan was reaped");
    assert!(files[2].symlink_metadata().unwrap().file_type().is_symlink(), "links are left alone");
    assert!(s.stats().damaged >= 2, "{:?}", s.stats());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_folder_that_cannot_be_locked_is_read_only_and_over_budget_blocks_are_not_stored() {
    let gs = geometries(StorageMode::F32, LayoutKind::RightJustified);
    let mut rng = Rng::new(9);
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut rng, 80));
    let (dir, _) = folder("unlockable", &a);
    std::fs::remove_file(dir.join(".lock")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/lock", dir.join(".lock")).unwrap();
    let mut s = expect(&dir, &a, 80, "a folder whose lock is a dangling symlink still reads");
    let mut b = Engine::new(&gs);
    b.extend(&tokens(&mut rng, 48));
    assert_eq!(s.put(&b.shared(), 0, b"ns", &b.tokens).unwrap().stored, 3, "stored in RAM");
    assert_eq!(s.sync().unwrap_err().kind, ErrorKind::Backend, "but not written");
    assert_eq!(s.stats().write_failures, 3);
    s.sync().unwrap();

    // An SSD budget smaller than one block: nothing is written, the RAM keeps the blocks.
    let small = scratch("small-budget");
    let mut s = open(Some(&small), BLOCK, 1 << 30, 1000);
    assert_eq!(s.put(&b.shared(), 0, b"ns", &b.tokens).unwrap().stored, 3);
    assert_eq!(s.sync().unwrap_err().kind, ErrorKind::Backend);
    assert_eq!(s.lookup(&gs, b"ns", &b.tokens).unwrap(), 48);
    assert!(block_files(&small).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&small);
}
