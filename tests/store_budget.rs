//! The prefix store's budgets under a random workload of puts, lookups and restores: the RAM
//! tier's bytes as MLX counts them (its active memory with no set alive) and the SSD tier's as
//! the folder holds them stay within their budgets after every step, with evictions in both.
//! And a restore refused by MLX's memory limit: a status, the set left empty, the files kept.
//! Its own binary: MLX's counters and limit are process-wide (the tests take turns).
#[path = "common/mod.rs"]
mod common;
#[path = "store/engine.rs"]
#[allow(dead_code)]
mod engine;

use common::mlx_helpers::released;
use common::model::Rng;
use engine::{folder_bytes, geometries, open, scratch, tokens, Engine};

use latent_cache::core::mlx::memory;
use latent_cache::{ErrorKind, LayoutKind, StorageMode};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const BLOCK: usize = 16;

#[test]
fn budgets_hold_as_mlx_and_the_folder_count_them() {
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let gs = geometries(StorageMode::Bf16, LayoutKind::RightJustified);
    let block_bytes = BLOCK * gs.iter().map(|g| g.bytes_per_token()).sum::<usize>();
    let (ram, ssd) = (24 * block_bytes, 40 * (block_bytes as u64 + 8192));
    let dir = scratch("budget");
    let mut rng = Rng::new(11);
    // Conversations over a few shared prompts, 2 to 10 blocks long.
    let prompts: Vec<Vec<u32>> = (0..3).map(|_| tokens(&mut rng, 32)).collect();
    let pool: Vec<Vec<u32>> = (0..16)
        .map(|i| {
            let mut t = prompts[i % 3].clone();
            let n = rng.range(0, 128);
            t.extend(tokens(&mut rng, n));
            t
        })
        .collect();
    let base = released();
    let mut store = open(Some(&dir), BLOCK, ram, ssd);
    for step in 0..80 {
        let t = &pool[rng.range(0, pool.len() - 1)];
        match rng.range(0, 2) {
            0 => {
                let mut e = Engine::new(&gs);
                e.extend(t);
                store.put(&e.shared(), 0, b"ns", &e.tokens).unwrap();
            }
            1 => {
                store.lookup(&gs, b"ns", t).unwrap();
            }
            _ => {
                let mut e = Engine::new(&gs);
                e.restore(&mut store, b"ns", t);
                e.check(&format!("step {step}"));
            }
        }
        store.sync().unwrap();
        let s = store.stats();
        let held = released().saturating_sub(base);
        assert!(s.ram_bytes as usize <= ram, "step {step}: {s:?}");
        assert!(held <= ram + (64 << 10), "step {step}: MLX holds {held} bytes for a RAM budget of {ram}");
        assert!(folder_bytes(&dir) <= ssd, "step {step}: the folder holds {} of {ssd}", folder_bytes(&dir));
    }
    let s = store.stats();
    assert!(s.ram_evictions > 0 && s.ssd_evictions > 0, "the workload evicted from both tiers: {s:?}");
    assert!(s.hits > 0 && s.restores > 0, "{s:?}");
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restore_over_mlx_memory_limit_is_refused_and_keeps_the_files() {
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let gs = geometries(StorageMode::F32, LayoutKind::Ragged);
    let dir = scratch("limit");
    let mut a = Engine::new(&gs);
    a.extend(&tokens(&mut Rng::new(12), 64));
    let mut store = open(Some(&dir), BLOCK, 0, 1 << 30);
    assert_eq!(store.put(&a.shared(), 0, b"ns", &a.tokens).unwrap().stored, 4);
    store.sync().unwrap();
    let files = engine::block_files(&dir).len();
    let mut restarted = open(Some(&dir), BLOCK, 0, 1 << 30);
    let mut b = Engine::new(&gs);
    let old = memory::set_limit(4096).unwrap();
    let refused = restarted.restore(&mut b.refs(), b"ns", &a.tokens);
    memory::set_limit(old).unwrap();
    assert_eq!(refused.unwrap_err().kind, ErrorKind::Capacity);
    assert!(b.layers.iter().all(|l| l.batch_size() == 0), "the set stays empty");
    assert_eq!(engine::block_files(&dir).len(), files, "no file was dropped for a memory limit");
    assert_eq!(b.restore(&mut restarted, b"ns", &a.tokens), 64);
    b.check("restored once the limit allows it");
    let _ = std::fs::remove_dir_all(&dir);
}
