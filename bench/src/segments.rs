//! Segments side by side with whole-set saves (`latent-cache-bench --segments`): the
//! GLM-5.2-shaped model (float32) with one row of a long context, saved as a chain's first
//! segment; then, round after round, a small turn appended and saved as the next segment, beside
//! a whole-set save of the same state; finally the chain restored, beside reading its files'
//! bytes. Each record: median seconds and the file's size.
use std::path::{Path, PathBuf};

use latent_cache::core::persist;
use latent_cache::core::persist::segment::{load_segments, save_segment, SegmentRange, SegmentSource};
use latent_cache::LatentCache;

use crate::persist::{median, seconds};
use crate::systems::{model_layers, Inputs};

fn append(layers: &mut [LatentCache], at: usize, n: usize) {
    let inputs = Inputs::new(1, n, at as f32);
    for (l, cache) in layers.iter_mut().enumerate() {
        let keys = crate::systems::is_dsa(l).then_some(&inputs.arrays[2]);
        cache.append(&inputs.arrays[0], &inputs.arrays[1], keys).unwrap();
    }
    layers.iter().for_each(|c| c.eval().unwrap());
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
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
    [
        ("first segment save", vec![first], context, first_bytes),
        ("segment save (turn)", turns, turn, turn_bytes),
        ("whole-set save", wholes, at, whole_bytes),
        ("chain restore", restores, at, chain_bytes),
        ("chain files read", reads, at, chain_bytes),
    ]
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
