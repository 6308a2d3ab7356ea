//! The prefix store's budgets under a random workload of puts, lookups and restores: the RAM
//! tier's bytes as MLX counts them (its active memory with no set alive) and the SSD tier's as
//! the folder holds them stay within their budgets after every step, with evictions in both.
//! Its own binary: MLX's counters are process-wide.
#[path = "common/mod.rs"]
mod common;
#[path = "store/engine.rs"]
#[allow(dead_code)]
mod engine;

use common::mlx_helpers::released;
use common::model::Rng;
use engine::{folder_bytes, geometries, open, scratch, tokens, Engine};

use latent_cache::{LayoutKind, StorageMode};

const BLOCK: usize = 16;

#[test]
fn budgets_hold_as_mlx_and_the_folder_count_them() {
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
