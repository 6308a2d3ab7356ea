//! Other processes on one folder: a writer killed with SIGKILL in the middle of its writes, two
//! processes writing overlapping conversations at once under a budget that makes them evict
//! each other's files, and a disk that fills (a file-size limit): every block left restores
//! bit for bit, the budget holds, and the full disk is "not stored" with a status. The children
//! are this test binary run again (`child`, ignored unless a parent names it).
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::engine::{block_files, folder_bytes, geometries, open, scratch, tokens, Engine};
use crate::common::model::Rng;

use latent_cache::{ErrorKind, Geometry, LayoutKind, StorageMode};

const BLOCK: usize = 16;

fn gs() -> Vec<Geometry> {
    geometries(StorageMode::Bf16, LayoutKind::RightJustified)
}

/// Conversation `i` of seed `seed`: a system prompt every seed shares, then its own turn.
fn conversation(seed: u64, i: usize) -> Vec<u32> {
    let mut t = tokens(&mut Rng::new(99), 48);
    t.extend(tokens(&mut Rng::new(seed * 1000 + i as u64 % 7), 64));
    t
}

fn spawn(mode: &str, dir: &Path, seed: u64, budget: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "processes::child", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LC_STORE_CHILD", mode)
        .env("LC_STORE_DIR", dir)
        .env("LC_STORE_SEED", seed.to_string())
        .env("LC_STORE_BUDGET", budget.to_string())
        .spawn()
        .unwrap()
}

/// Run by the parents below only.
#[test]
#[ignore]
fn child() {
    let Ok(mode) = std::env::var("LC_STORE_CHILD") else {
        return;
    };
    let dir = std::path::PathBuf::from(std::env::var("LC_STORE_DIR").unwrap());
    let seed: u64 = std::env::var("LC_STORE_SEED").unwrap().parse().unwrap();
    let budget: u64 = std::env::var("LC_STORE_BUDGET").unwrap().parse().unwrap();
    let mut store = open(Some(&dir), BLOCK, 1 << 20, budget);
    if mode == "fullfs" {
        // SAFETY: process-wide settings of this child alone.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit { rlim_cur: 20_000, rlim_max: libc::RLIM_INFINITY };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
        }
    }
    let rounds = if mode == "writer" { usize::MAX } else { 14 };
    for i in 0..rounds {
        let mut e = Engine::new(&gs());
        e.extend(&conversation(seed, i));
        store.put(&e.shared(), 0, b"shared", &e.tokens).unwrap();
        match mode.as_str() {
            "fullfs" => {
                let err = store.sync().unwrap_err();
                assert_eq!(err.kind, ErrorKind::Backend, "{}", err.message);
                return;
            }
            "writer" if i % 3 == 2 => store.sync().unwrap(),
            _ => {}
        }
    }
    store.sync().unwrap();
}

/// Every conversation of `seeds` the folder holds blocks of restores them bit for bit.
fn check_all(dir: &Path, seeds: &[u64], what: &str) -> usize {
    let mut store = open(Some(dir), BLOCK, 1 << 30, 1 << 30);
    let mut restored = 0;
    for &seed in seeds {
        for i in 0..7 {
            let t = conversation(seed, i);
            let mut e = Engine::new(&gs());
            restored += e.restore(&mut store, b"shared", &t);
            e.check(&format!("{what}: seed {seed} conversation {i}"));
        }
    }
    assert_eq!(store.stats().damaged, 0, "{what}: {:?}", store.stats());
    restored
}

#[test]
fn a_writer_killed_mid_write_leaves_only_whole_blocks() {
    let dir = scratch("killed");
    let mut child = spawn("writer", &dir, 1, 1 << 30);
    let start = Instant::now();
    while block_files(&dir).len() < 8 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(block_files(&dir).len() >= 8, "the writer wrote");
    let restored = check_all(&dir, &[1], "after a SIGKILL");
    assert!(restored >= 48, "the system prompt's blocks survived ({restored})");
    let tmp = walk(&dir).into_iter().filter(|n| n.contains(".tmp-")).count();
    assert_eq!(tmp, 0, "the restart reaped every temporary");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_processes_share_a_folder_within_its_budget() {
    let dir = scratch("two");
    // One conversation's 7 blocks are about 7 x 16 x 3 layers' positions; the budget holds
    // about 20 of the 40 distinct blocks both write.
    let block_bytes = 16 * gs().iter().map(Geometry::bytes_per_token).sum::<usize>() as u64 + 6000;
    let budget = 20 * block_bytes;
    let mut a = spawn("sharer", &dir, 1, budget);
    let mut b = spawn("sharer", &dir, 2, budget);
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success(), "both children finished");
    assert!(folder_bytes(&dir) <= budget, "{} bytes over a budget of {budget}", folder_bytes(&dir));
    let restored = check_all(&dir, &[1, 2], "two processes");
    assert!(restored >= 48, "blocks survived ({restored})");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_is_not_stored_with_a_status() {
    let dir = scratch("full");
    // The child's file-size limit would also refuse its writes to an output that is a file (a
    // CI log): its output comes back through pipes instead.
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "processes::child", "--ignored", "--nocapture", "--test-threads=1"])
        .env("LC_STORE_CHILD", "fullfs")
        .env("LC_STORE_DIR", &dir)
        .env("LC_STORE_SEED", "3")
        .env("LC_STORE_BUDGET", (1u64 << 30).to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
    assert!(child.status.success(), "the child saw its writes refused:\n{said}");
    check_all(&dir, &[3], "after a full disk");
    let _ = std::fs::remove_dir_all(&dir);
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}
