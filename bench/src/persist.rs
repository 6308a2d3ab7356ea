//! Saving and loading side by side with copying the same file (`latent-cache-bench --persist`):
//! the whole GLM-5.2-shaped model (78 layers, float32) with one row of 4K positions, saved
//! through the library (MLX's safetensors IO plus a checksum of every tensor), copied with `cp`,
//! and loaded back into caches whose buffers are then evaluated (read from disk). Rounds
//! alternate, so a noisy moment lands on every operation alike.
use std::path::Path;
use std::time::Instant;

use latent_cache::core::mlx::eval::eval;

use crate::systems::{model_layers, Inputs};
use latent_cache::core::persist;
use latent_cache::core::persist::mlxbun;

pub(crate) fn seconds(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// One JSON record per operation: median seconds over `rounds`, the file's size.
pub fn run(dir: &Path, positions: usize, rounds: usize) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut layers = model_layers();
    let mut done = 0;
    while done < positions {
        let n = 1024.min(positions - done);
        let inputs = Inputs::new(1, n, done as f32);
        for (l, cache) in layers.iter_mut().enumerate() {
            let keys = crate::systems::is_dsa(l).then_some(&inputs.arrays[2]);
            cache.append(&inputs.arrays[0], &inputs.arrays[1], keys).unwrap();
        }
        layers.iter().for_each(|c| c.eval().unwrap());
        done += n;
    }
    let refs: Vec<_> = layers.iter().collect();
    let (file, copy) = (dir.join("state.safetensors"), dir.join("state-copy.safetensors"));
    let seed_file = dir.join("state.mlxkv");
    let info = mlxbun::MlxbunInfo { tokens: (0..positions as u32).collect(), ..Default::default() };
    let (mut save, mut cp, mut cp_sync, mut load, mut seed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let copy_file = || assert!(std::process::Command::new("cp").arg(&file).arg(&copy).status().unwrap().success());
    for _ in 0..rounds {
        save.push(seconds(|| persist::save(&refs, &file).unwrap()));
        cp.push(seconds(copy_file));
        // A labelled variant: the copy made as durable as the save (its file synced to disk).
        cp_sync.push(seconds(|| {
            copy_file();
            std::fs::File::open(&copy).and_then(|f| f.sync_all()).unwrap();
        }));
        // The seed's own file format (`core::mlxbun`: host reads, wyhash of every tensor, synced).
        seed.push(seconds(|| mlxbun::save(&refs, &info, &seed_file).unwrap()));
        load.push(seconds(|| {
            let loaded = persist::load(&copy).unwrap();
            eval(
                loaded
                    .iter()
                    .flat_map(|c| {
                        let s = c.state().unwrap();
                        [Some(s.latent), Some(s.rope), s.index_keys].into_iter().flatten().collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>()
                    .iter(),
            )
            .unwrap();
        }));
    }
    let bytes = std::fs::metadata(&file).unwrap().len();
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file(&seed_file);
    [("save", save), ("cp", cp), ("cp+fsync", cp_sync), ("load", load), ("save seed format", seed)]
        .into_iter()
        .map(|(op, samples)| {
            let line = format!(
                "{{\"system\": \"persist {op}\", \"scenario\": \"persist\", \"batch\": 1, \"context\": {positions}, \
                 \"seconds\": {:.4}, \"samples\": {rounds}, \"file_bytes\": {bytes}}}",
                median(samples)
            );
            eprintln!("{line}");
            line
        })
        .collect()
}
