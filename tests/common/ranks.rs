//! Two ranks of MLX's ring backend on this machine: this test binary run again twice, as the
//! ignored test `name`, with `MLX_RANK`, `MLX_HOSTFILE` (two free ports on 127.0.0.1) and
//! `LC_RANK_DIR` (a scratch folder both ranks and the parent share) set. Bounded: the ranks are
//! killed after two minutes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs both ranks of test `name` and returns whether each finished successfully (`None`: it was
/// killed at the time limit); `check` then reads what they left in the scratch folder.
pub fn run_ranks(name: &str, check: impl FnOnce([Option<bool>; 2], &Path)) {
    let dir: PathBuf = std::env::temp_dir().join(format!("latent-cache-ranks-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hostfile = dir.join("hosts.json");
    // Free ports: bound here, released for the ranks to take.
    let listeners: Vec<_> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
    drop(listeners);
    std::fs::write(&hostfile, format!("[[\"127.0.0.1:{}\"], [\"127.0.0.1:{}\"]]", ports[0], ports[1])).unwrap();
    let spawn = |rank: usize| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
            .env("MLX_RANK", rank.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .env("LC_RANK_DIR", &dir)
            .spawn()
            .unwrap()
    };
    let mut ranks = [spawn(0), spawn(1)];
    let start = Instant::now();
    let mut codes = [None, None];
    while codes.iter().any(Option::is_none) && start.elapsed() < Duration::from_secs(120) {
        for (r, child) in ranks.iter_mut().enumerate() {
            if codes[r].is_none() {
                codes[r] = child.try_wait().unwrap().map(|s| s.success());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for child in ranks.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
    check(codes, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}
