//! Segments side by side with whole-set saves (`latent-cache-bench --segments`): the
//! GLM-5.2-shaped model (float32) with one row of a long context, saved as a chain's first
//! segment; then, round after round, a small turn appended and saved as the next segment, beside
//! a whole-set save of the same state, and the seed's own files (mlx-bun's): its whole file
//! (format version 3) and its block layout (version 5) with mlx-bun's default 1 MiB blocks and
//! with 64 KiB ones, each manifest saved into one folder turn after turn, so each save writes
//! the blocks that changed; finally the chain restored, beside reading its files' bytes. Each
//! record: median seconds and the bytes written (for the block layout, the new blocks and the
//! manifest).
use std::path::{Path, PathBuf};

use latent_cache::core::persist;
use latent_cache::core::persist::mlxbun::{self, MlxbunInfo};
use latent_cache::core::persist::segment::{load_segments, save_segment, SegmentRange, SegmentSource};
use latent_cache::LatentCache;

use crate::attention::uniform;
use crate::persist::{median, seconds};
use crate::systems::{model_layers, WIDTHS};

pub(crate) fn append(layers: &mut [LatentCache], at: usize, n: usize) {
    for (l, cache) in layers.iter_mut().enumerate() {
        // Values that differ from layer to layer and position to position: the seed's block
        // layout names blocks by their content, so repeated values would share blocks no real
        // state shares.
        let [latent, rope, keys] = WIDTHS.map(|w| uniform(&[1, n, w], ((l as u64) << 40) ^ ((at as u64) << 12) ^ w as u64));
        cache.append(&latent, &rope, crate::systems::is_dsa(l).then_some(&keys)).unwrap();
    }
    layers.iter().for_each(|c| c.eval().unwrap());
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The bytes of the block files beside manifests in `dir`.
fn blocks_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("blocks"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.metadata().unwrap().len()).sum())
        .unwrap_or(0)
}

/// The seed's block layout in `dir` with `block_bytes`: the manifest of the set as it stands,
/// saved beside the earlier ones; seconds and the bytes it wrote (new blocks and the manifest).
fn save_blocks(layers: &[LatentCache], dir: &Path, name: &str, block_bytes: usize) -> (f64, u64) {
    std::fs::create_dir_all(dir).unwrap();
    let before = blocks_bytes(dir);
    let path = dir.join(name);
    let t =
        seconds(|| mlxbun::save_blocks(&layers.iter().collect::<Vec<_>>(), &MlxbunInfo::default(), &path, block_bytes).unwrap());
    (t, blocks_bytes(dir) - before + size(&path))
}

/// One JSON record per operation, after `context` positions, with turns of `turn` positions.
pub fn run(dir: &Path, context: usize, turn: usize, rounds: usize) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut layers = model_layers();
    let mut at = 0;
    while at < context {
        let n = 1024.min(context - at);
        append(&mut layers, at, n);
        at += n;
    }
    let mut chain: Vec<PathBuf> = vec![dir.join("segment-0.safetensors")];
    let first = seconds(|| {
        let mut refs: Vec<&mut LatentCache> = layers.iter_mut().collect();
        save_segment(&mut refs, SegmentRange { row: 0, from: 0, to: context, key: b"prefix" }, &chain[0]).unwrap();
    });
    let whole = dir.join("whole.safetensors");
    let (mut turns, mut wholes) = (Vec::new(), Vec::new());
    // The seed's files: its whole file (version 3) and its block layout with two block sizes.
    let seed_whole = dir.join("seed-whole.mlxkv");
    let block_sizes = [(1usize << 20, "1 MiB"), (64 << 10, "64 KiB")];
    let block_dirs: Vec<PathBuf> = block_sizes.iter().map(|(b, _)| dir.join(format!("seed-blocks-{b}"))).collect();
    let firsts: Vec<(f64, u64)> =
        block_sizes.iter().zip(&block_dirs).map(|((b, _), d)| save_blocks(&layers, d, "turn-0.mlxkv", *b)).collect();
    let (mut seed_wholes, mut seed_turns) = (Vec::new(), vec![Vec::new(); block_sizes.len()]);
    let mut seed_turn_bytes = vec![0u64; block_sizes.len()];
    for k in 1..=rounds {
        append(&mut layers, at, turn);
        let path = dir.join(format!("segment-{k}.safetensors"));
        turns.push(seconds(|| {
            let mut refs: Vec<&mut LatentCache> = layers.iter_mut().collect();
            save_segment(&mut refs, SegmentRange { row: 0, from: at, to: at + turn, key: b"turn" }, &path).unwrap();
        }));
        chain.push(path);
        at += turn;
        wholes.push(seconds(|| persist::save(&layers.iter().collect::<Vec<_>>(), &whole).unwrap()));
        seed_wholes
            .push(seconds(|| mlxbun::save(&layers.iter().collect::<Vec<_>>(), &MlxbunInfo::default(), &seed_whole).unwrap()));
        for (i, ((b, _), d)) in block_sizes.iter().zip(&block_dirs).enumerate() {
            let (t, written) = save_blocks(&layers, d, &format!("turn-{k}.mlxkv"), *b);
            seed_turns[i].push(t);
            seed_turn_bytes[i] = written;
        }
    }
    let seed_whole_bytes = size(&seed_whole);
    let _ = std::fs::remove_file(&seed_whole);
    for d in &block_dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    let (turn_bytes, whole_bytes, first_bytes) = (size(&chain[1]), size(&whole), size(&chain[0]));
    let chain_bytes: u64 = chain.iter().map(|p| size(p)).sum();
    drop(layers);
    let (mut restores, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        reads.push(seconds(|| {
            let total: usize = chain.iter().map(|p| std::fs::read(p).unwrap().len()).sum();
            assert_eq!(total as u64, chain_bytes);
        }));
        restores.push(seconds(|| {
            let sources: Vec<SegmentSource<'_>> = chain.iter().map(|p| SegmentSource::Path(p)).collect();
            let restored = load_segments(&sources).unwrap();
            assert_eq!(restored[0].offset(), at);
        }));
    }
    for p in chain.iter().chain([&whole]) {
        let _ = std::fs::remove_file(p);
    }
    let mut records = vec![
        ("first segment save".to_string(), vec![first], context, first_bytes),
        ("segment save (turn)".to_string(), turns, turn, turn_bytes),
        ("whole-set save".to_string(), wholes, at, whole_bytes),
        ("chain restore".to_string(), restores, at, chain_bytes),
        ("chain files read".to_string(), reads, at, chain_bytes),
        ("seed whole-file save (mlx-bun version 3)".to_string(), seed_wholes, at, seed_whole_bytes),
    ];
    for (i, (_, label)) in block_sizes.iter().enumerate() {
        let what = format!("seed block-layout save (mlx-bun version 5, {label} blocks)");
        records.push((format!("{what}, first"), vec![firsts[i].0], context, firsts[i].1));
        records.push((format!("{what}, turn"), seed_turns[i].clone(), turn, seed_turn_bytes[i]));
    }
    records
        .into_iter()
        .map(|(op, samples, positions, bytes)| {
            let n = samples.len();
            let line = format!(
                "{{\"system\": \"{op}\", \"scenario\": \"segments\", \"batch\": 1, \"context\": {context}, \"turn\": {turn}, \
             \"positions\": {positions}, \"seconds\": {:.4}, \"samples\": {n}, \"file_bytes\": {bytes}}}",
                median(samples)
            );
            eprintln!("{line}");
            line
        })
        .collect()
}
