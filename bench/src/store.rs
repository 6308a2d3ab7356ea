//! The prefix store (`latent-cache-bench --store`): the GLM-5.2-shaped model (float32) with
//! one row of `context` positions put into a store with a folder (blocks of 256), then restored
//! from RAM, restored from the SSD tier by a store opened afresh on the folder (a restart; the
//! files are in the OS's page cache, just written), beside reading the same files' bytes, and
//! attached from RAM; and the index alone: lookups of a 16K-token sequence among 10,000 stored
//! blocks, and the restart's header-only scan of 10,000 block files (a tiny geometry, since
//! only the entries' count matters there). Each record: median seconds, positions, bytes.
use std::path::{Path, PathBuf};

use latent_cache::core::store::{Store, StoreConfig};
use latent_cache::{Geometry, LatentCache};

use crate::persist::{median, seconds};
use crate::segments::append;
use crate::systems::model_layers;

const BLOCK: usize = 256;

fn store(dir: Option<&Path>, ram: usize) -> Store {
    Store::open(&StoreConfig { block: BLOCK, ram_bytes: ram, ssd_bytes: 1 << 40, folder: dir.map(Path::to_owned) }).unwrap()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten().filter(|e| e.file_type().unwrap().is_dir()) {
        out.extend(std::fs::read_dir(sub.path()).unwrap().flatten().map(|e| e.path()));
    }
    out
}

fn record(op: &str, samples: Vec<f64>, context: usize, positions: usize, bytes: u64) -> String {
    let n = samples.len();
    let line = format!(
        "{{\"system\": \"{op}\", \"scenario\": \"store\", \"batch\": 1, \"context\": {context}, \"positions\": {positions}, \
         \"seconds\": {:.6}, \"samples\": {n}, \"file_bytes\": {bytes}}}",
        median(samples)
    );
    eprintln!("{line}");
    line
}

/// Restores (or attaches) `tokens` into a fresh set of `gs` from `s`, checking the positions.
fn fill(s: &mut Store, gs: &[Geometry], tokens: &[u32], attach: bool) -> Vec<LatentCache> {
    let mut set: Vec<LatentCache> = gs.iter().map(|g| LatentCache::new(*g).unwrap()).collect();
    let mut refs: Vec<&mut LatentCache> = set.iter_mut().collect();
    let n = match attach {
        true => s.attach(&mut refs, b"bench", tokens, 1).unwrap(),
        false => s.restore(&mut refs, b"bench", tokens).unwrap(),
    };
    assert_eq!(n, tokens.len() / BLOCK * BLOCK);
    set.iter().for_each(|c| c.eval().unwrap());
    set
}

pub fn run(dir: &Path, context: usize, rounds: usize) -> Vec<String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let mut layers = model_layers();
    let gs: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
    let mut at = 0;
    while at < context {
        let n = 1024.min(context - at);
        append(&mut layers, at, n);
        at += n;
    }
    let tokens: Vec<u32> = (0..context as u32).map(|t| t.wrapping_mul(2_654_435_761) % 150_000).collect();
    let blocks = context / BLOCK;
    let mut out = Vec::new();

    // Puts: every block new (copied into RAM, written behind), then the same put again.
    let folder = dir.join("folder");
    let mut s = store(Some(&folder), usize::MAX);
    let put = seconds(|| assert_eq!(s.put(&layers.iter().collect::<Vec<_>>(), 0, b"bench", &tokens).unwrap().stored, blocks));
    let sync = seconds(|| s.sync().unwrap());
    let again = seconds(|| assert_eq!(s.put(&layers.iter().collect::<Vec<_>>(), 0, b"bench", &tokens).unwrap().stored, 0));
    let paths = files(&folder);
    let bytes: u64 = paths.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    drop(layers);
    out.push(record("put, new blocks (per block)", vec![put / blocks as f64], context, BLOCK, bytes / blocks as u64));
    out.push(record(
        "put's write-behind, until synced (per block)",
        vec![sync / blocks as f64],
        context,
        BLOCK,
        bytes / blocks as u64,
    ));
    out.push(record("put, blocks already stored", vec![again], context, context, 0));

    let (mut ram, mut attach, mut ssd, mut reads) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        reads.push(seconds(|| {
            let total: usize = paths.iter().map(|p| std::fs::read(p).unwrap().len()).sum();
            assert_eq!(total as u64, bytes);
        }));
        ram.push(seconds(|| drop(fill(&mut s, &gs, &tokens, false))));
        attach.push(seconds(|| drop(fill(&mut s, &gs, &tokens, true))));
        // A restart with no RAM: every block read from its file and checked.
        let mut cold = store(Some(&folder), 0);
        ssd.push(seconds(|| drop(fill(&mut cold, &gs, &tokens, false))));
    }
    drop(s);
    out.push(record("restore from RAM", ram, context, context, bytes));
    out.push(record("attach from RAM (lent, no copy)", attach, context, context, bytes));
    out.push(record("restore from the SSD (after a restart)", ssd, context, context, bytes));
    out.push(record("the block files read", reads, context, context, bytes));
    let _ = std::fs::remove_dir_all(&folder);
    out.extend(index(dir, rounds));
    out
}

/// Lookups among 10,000 stored blocks, and the restart's scan of as many files.
fn index(dir: &Path, rounds: usize) -> Vec<String> {
    let g = Geometry { kv_lora_rank: 8, rope_head_dim: 4, index_head_dim: 0, ..Geometry::default() };
    let mut layer = LatentCache::new(g).unwrap();
    let (entries, per) = (10_000usize, 16 * BLOCK);
    let folder = dir.join("index");
    let mut s = store(Some(&folder), usize::MAX);
    // 625 sequences of 16 blocks (4K tokens) each: 10,000 blocks.
    let host = vec![0.5f32; per * 8];
    layer.append_host(1, per, &host, &host[..per * 4], None).unwrap();
    let seq = |k: usize| -> Vec<u32> { (0..per as u32).map(|t| t ^ (k as u32 * 7919)).collect() };
    for k in 0..entries / 16 {
        assert_eq!(s.put(&[&layer], 0, b"index", &seq(k)).unwrap().stored, 16);
    }
    s.sync().unwrap();
    let mut probe = seq(3);
    probe.extend(seq(4));
    let hit: Vec<f64> =
        (0..rounds * 20).map(|_| seconds(|| assert_eq!(s.lookup(&[g], b"index", &probe).unwrap(), per))).collect();
    let miss = seq(entries);
    let missed: Vec<f64> =
        (0..rounds * 20).map(|_| seconds(|| assert_eq!(s.lookup(&[g], b"index", &miss).unwrap(), 0))).collect();
    drop(s);
    let scan: Vec<f64> =
        (0..rounds).map(|_| seconds(|| assert_eq!(store(Some(&folder), 0).stats().ssd_blocks, entries as u64))).collect();
    let _ = std::fs::remove_dir_all(&folder);
    vec![
        record("lookup among 10,000 blocks: 8K tokens, 16 blocks found", hit, probe.len(), per, 0),
        record("lookup among 10,000 blocks: 4K tokens, none found", missed, miss.len(), 0, 0),
        record("restart: index 10,000 block files from their headers", scan, 0, 0, 0),
    ]
}
