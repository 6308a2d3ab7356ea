//! An engine-shaped client of the store: a set of three layers (a DSA target layer, a target
//! layer without index keys, the MTP layer) whose position `p` holds values derived from
//! `tokens[..=p]` alone (a hash chain seeding the reference model's generator), so the
//! expected content of any restore follows from its tokens, whoever stored them and whenever.
use std::path::{Path, PathBuf};

use crate::common::core_check::{assert_matches, model_of, widths};
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::{Model, Rng};

use latent_cache::core::store::{Store, StoreConfig};
use latent_cache::{Geometry, LatentCache, LayoutKind, Role, StorageMode};

pub fn geometries(mode: StorageMode, layout: LayoutKind) -> Vec<Geometry> {
    let rope = if mode == StorageMode::Fp8 { StorageMode::Bf16 } else { mode };
    let mtp = Geometry { role: Role::Mtp, ..geometry_in([128, 64, 0], [mode, rope, mode], layout) };
    vec![geometry_in([128, 64, 128], [mode, rope, mode], layout), geometry_in([128, 64, 0], [mode, rope, mode], layout), mtp]
}

/// The chain hash of a token sequence at each position.
fn prefix_hashes(tokens: &[u32]) -> Vec<u64> {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3).rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
            h
        })
        .collect()
}

/// Values of positions `[from, to)` of `tokens` for layer `layer` of widths `w`, as one append
/// of batch 1 takes them.
pub fn values(tokens: &[u32], from: usize, to: usize, layer: usize, w: [usize; 3]) -> [Vec<f32>; 3] {
    let hashes = prefix_hashes(&tokens[..to]);
    let mut out: [Vec<f32>; 3] = Default::default();
    for h in &hashes[from..to] {
        let mut rng = Rng::new(h ^ (layer as u64 + 1).wrapping_mul(0x51_7cc1_b727_220a));
        for (f, v) in out.iter_mut().enumerate() {
            v.extend(rng.floats(w[f]));
        }
    }
    out
}

/// The engine's set: its layers and the tokens its one row holds.
pub struct Engine {
    pub layers: Vec<LatentCache>,
    pub tokens: Vec<u32>,
}

impl Engine {
    pub fn new(gs: &[Geometry]) -> Engine {
        Engine { layers: gs.iter().map(|g| LatentCache::new(*g).unwrap()).collect(), tokens: Vec::new() }
    }

    pub fn refs(&mut self) -> Vec<&mut LatentCache> {
        self.layers.iter_mut().collect()
    }

    pub fn shared(&self) -> Vec<&LatentCache> {
        self.layers.iter().collect()
    }

    /// "Prefills" `tokens` after those the row holds: every row gets their values.
    pub fn extend(&mut self, tokens: &[u32]) {
        let from = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        let rows = self.layers[0].batch_size().max(1);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let w = widths(layer.geometry());
            let v = values(&self.tokens, from, self.tokens.len(), i, w);
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| v[f].repeat(rows));
            let keys = (w[2] > 0).then_some(data[2].as_slice());
            layer.append_host(rows, tokens.len(), &data[0], &data[1], keys).unwrap();
        }
    }

    /// Restores from `store` (the set must be empty); the row then holds the positions restored.
    pub fn restore(&mut self, store: &mut Store, ns: &[u8], tokens: &[u32]) -> usize {
        let n = store.restore(&mut self.refs(), ns, tokens).unwrap();
        self.tokens = tokens[..n].to_vec();
        n
    }

    /// Every row of every layer holds exactly the values of `self.tokens`, bit for bit.
    pub fn check(&self, what: &str) {
        for (i, layer) in self.layers.iter().enumerate() {
            let mut model = model_of(layer.geometry());
            let rows = layer.batch_size();
            if rows > 0 && !self.tokens.is_empty() {
                let v = values(&self.tokens, 0, self.tokens.len(), i, widths(layer.geometry()));
                model.append(rows, self.tokens.len(), &std::array::from_fn(|f| v[f].repeat(rows)));
            } else if rows > 0 {
                model = Model { rows: vec![Default::default(); rows], ..model };
            }
            assert_matches(layer, &model, &format!("{what}, layer {i}"));
        }
    }
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn open(folder: Option<&Path>, block: usize, ram: usize, ssd: u64) -> Store {
    Store::open(&StoreConfig { block, ram_bytes: ram, ssd_bytes: ssd, folder: folder.map(Path::to_owned) }).unwrap()
}

/// Bytes of the block files under `dir` (what the SSD budget bounds).
pub fn folder_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        if sub.file_type().unwrap().is_dir() {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                total += f.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

/// Block files under `dir`.
pub fn block_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        if sub.file_type().unwrap().is_dir() {
            for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
                if f.file_name().to_string_lossy().ends_with(".lcs") {
                    out.push(f.path());
                }
            }
        }
    }
    out.sort();
    out
}

pub fn tokens(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.next() as u32 % 50_000).collect()
}
