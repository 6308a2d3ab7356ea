//! The seed's block layout (mlx-bun's format version 5: a manifest, and each tensor's bytes in
//! `blocks/<sha256>` files beside it, cut per batch row): the seed's test data written in it by an
//! independent writer (tests/interop/mlxbun_kv.py, Python's `hashlib`) loads here as the same
//! caches as its version 3 file; manifests and blocks written here pass that reader's checks
//! (every block's SHA-256, no block across a batch row) with every value; a conversation saved
//! turn after turn writes the bytes of each turn's new blocks only, and every turn's manifest
//! loads back bit for bit; damaged blocks and manifests are refused with nothing made.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::mlxbun::{check_independent_read, model, python, scratch};
use crate::common::model::Rng;
use latent_cache::core::persist::mlxbun;
use latent_cache::core::persist::mlxbun::MlxbunInfo;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::mlxbun::*;
use latent_cache::ffi::set::latent_cache_set_free;
use latent_cache::{ErrorKind, Family, Geometry, LatentCache};

/// An empty folder of this test's own (the blocks folder sits beside the manifest).
fn fresh(name: &str) -> PathBuf {
    let dir = scratch(&format!("blocks-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The blocks beside manifests in `dir`: name to size.
fn blocks(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(dir.join("blocks"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
                .collect()
        })
        .unwrap_or_default()
}

/// Every family of every row of `a` equals `b`'s, bit for bit.
fn same(a: &[LatentCache], b: &[LatentCache]) {
    assert_eq!(a.len(), b.len());
    for (l, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.geometry(), y.geometry(), "layer {l}");
        assert_eq!(x.row_offsets(), y.row_offsets(), "layer {l}");
        let families = if x.geometry().index_head_dim > 0 { 3 } else { 2 };
        for family in Family::ALL.into_iter().take(families) {
            for row in 0..x.batch_size() {
                let (p, q) = (x.read_row(family, row).unwrap(), y.read_row(family, row).unwrap());
                assert!(p.iter().zip(&q).all(|(u, v)| u.to_bits() == v.to_bits()), "layer {l} {} row {row}", family.name());
            }
        }
    }
}

#[test]
fn the_seeds_test_data_in_blocks_loads_as_its_version_3_file() {
    let dir = fresh("seed");
    let whole = dir.join("whole.mlxkv");
    python(&["write-example", whole.to_str().unwrap()]);
    let (want, want_info) = mlxbun::load(&whole).unwrap();
    // Blocks of one value (each its own file), of three values (rows of 2 x 2 values cut 3 + 1),
    // and mlx-bun's default (one block a row).
    for block_bytes in ["4", "12", "1048576"] {
        let dir = fresh(&format!("seed-{block_bytes}"));
        let manifest = dir.join("example.mlxkv");
        python(&["write-example-blocks", manifest.to_str().unwrap(), block_bytes]);
        let (layers, info) = mlxbun::load(&manifest).unwrap();
        assert_eq!(info, want_info, "{block_bytes}-byte blocks");
        same(&layers, &want);
        // Bytes alone cannot hold a manifest's blocks.
        let bytes = std::fs::read(&manifest).unwrap();
        let err = mlxbun::load_from_bytes(&bytes).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
    }
}

#[test]
fn block_files_written_here_pass_the_independent_reader() {
    let mut rng = Rng::new(13);
    let layers = model(&mut rng, 2, 5);
    let info = MlxbunInfo { tokens: vec![7, 8, 9, 10, 4_000_000_000], ns: Some(String::new()), ..MlxbunInfo::default() };
    // 40-byte blocks (a latent row of 5 positions is 640 bytes: 16 blocks), a size that is not
    // whole values (rounded down to 8 values), and the default.
    for block_bytes in [40usize, 33, 0] {
        let dir = fresh(&format!("ours-{block_bytes}"));
        let path = dir.join("ours.mlxkv");
        mlxbun::save_blocks(&layers.iter().collect::<Vec<_>>(), &info, &path, block_bytes).unwrap();
        check_independent_read(&python(&["read", path.to_str().unwrap()]), &layers);
        let (loaded, back) = mlxbun::load(&path).unwrap();
        assert_eq!(back, info);
        same(&layers, &loaded);
        let sizes = blocks(&dir);
        let value_bytes = match block_bytes {
            0 => 1 << 20,
            b => b / 4 * 4,
        };
        assert!(sizes.values().all(|&n| n as usize <= value_bytes && n % 4 == 0), "{block_bytes}: block sizes {sizes:?}");
        // The manifest holds the header alone.
        let manifest = std::fs::read(&path).unwrap();
        let header_len = u32::from_le_bytes(manifest[10..14].try_into().unwrap()) as usize;
        assert_eq!(manifest.len(), 26 + header_len);
    }
}

/// The rows a conversation's layers hold: layer, family, values (one row).
fn rows_of(layers: &[LatentCache]) -> Vec<Vec<Vec<f32>>> {
    layers
        .iter()
        .map(|l| {
            let families = if l.geometry().index_head_dim > 0 { 3 } else { 2 };
            Family::ALL.into_iter().take(families).map(|f| l.read_row(f, 0).unwrap()).collect()
        })
        .collect()
}

/// 20 turns of one conversation (two layers, one with index keys, each growing by 7 positions
/// a turn), saved after each turn as a manifest in one folder: each save writes exactly the
/// blocks its growth changed (per tensor, from the start of the previous save's last, partial
/// block to the new end), and every turn's manifest loads back bit for bit as the conversation
/// stood then.
#[test]
fn a_conversation_saved_turn_by_turn_writes_each_turns_new_blocks_only() {
    let dir = fresh("turns");
    let mut rng = Rng::new(17);
    let (turn, block_bytes) = (7usize, 64usize);
    let mut layers: Vec<LatentCache> = [16usize, 0]
        .into_iter()
        .map(|index_head_dim| {
            LatentCache::new(Geometry { kv_lora_rank: 32, rope_head_dim: 8, index_head_dim, ..Geometry::default() }).unwrap()
        })
        .collect();
    let mut saved = Vec::new();
    for t in 0..20 {
        for layer in layers.iter_mut() {
            let g = layer.geometry();
            let keys = (g.index_head_dim > 0).then(|| rng.floats(turn * g.index_head_dim));
            let (latent, rope) = (rng.floats(turn * g.kv_lora_rank), rng.floats(turn * g.rope_head_dim));
            layer.append_host(1, turn, &latent, &rope, keys.as_deref()).unwrap();
        }
        let before = blocks(&dir);
        let path = dir.join(format!("turn-{t}.mlxkv"));
        mlxbun::save_blocks(&layers.iter().collect::<Vec<_>>(), &MlxbunInfo::default(), &path, block_bytes).unwrap();
        let written: u64 = blocks(&dir).iter().filter(|(name, _)| !before.contains_key(*name)).map(|(_, n)| n).sum();
        // What the cut writes: for each tensor, from its previous length rounded down to a
        // block to its new length.
        let widths = [32usize, 8, 16, 32, 8];
        let want: usize = widths.iter().map(|w| (t + 1) * turn * w * 4 - t * turn * w * 4 / block_bytes * block_bytes).sum();
        assert_eq!(written as usize, want, "turn {t}: bytes of new blocks");
        saved.push((path, rows_of(&layers)));
    }
    for (t, (path, want)) in saved.iter().enumerate() {
        let (loaded, _) = mlxbun::load(path).unwrap();
        assert_eq!(loaded[0].offset(), (t + 1) * turn);
        let got = rows_of(&loaded);
        let bits = |v: &Vec<Vec<Vec<f32>>>| v.iter().flatten().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(want), "turn {t} restores bit for bit");
    }
}

/// An edit of a manifest's header text.
type Edit<'a> = Box<dyn Fn(&str) -> String + 'a>;

/// A manifest's header rewritten by `edit`, its length, data start and hash kept right.
fn manifest_with(bytes: &[u8], edit: impl Fn(&str) -> String) -> Vec<u8> {
    let len = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
    let text = edit(std::str::from_utf8(&bytes[26..26 + len]).unwrap());
    let mut out = bytes[..10].to_vec();
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(&(26 + text.len() as u32).to_le_bytes());
    out.extend_from_slice(&latent_cache::core::persist::wyhash::wyhash(text.as_bytes(), 0).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

#[test]
fn damaged_blocks_and_manifests_are_refused() {
    let dir = fresh("damaged");
    let mut rng = Rng::new(19);
    let layers = model(&mut rng, 1, 3);
    let path = dir.join("m.mlxkv");
    mlxbun::save_blocks(&layers.iter().collect::<Vec<_>>(), &MlxbunInfo::default(), &path, 64).unwrap();
    mlxbun::load(&path).unwrap();
    let refused = |why: &str| {
        let err = mlxbun::load(&path).err().unwrap_or_else(|| panic!("{why}: loaded"));
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{why}: {}", err.message);
    };
    let names: Vec<String> = blocks(&dir).into_keys().collect();
    let block = dir.join("blocks").join(&names[0]);
    let good = std::fs::read(&block).unwrap();
    std::fs::remove_file(&block).unwrap();
    refused("a block missing");
    let mut longer = good.clone();
    longer.push(0);
    std::fs::write(&block, &longer).unwrap();
    refused("a block longer than listed");
    let mut flipped = good.clone();
    flipped[0] ^= 1;
    std::fs::write(&block, &flipped).unwrap();
    refused("a block whose bytes are not its name");
    std::fs::remove_file(&block).unwrap();
    std::fs::create_dir(&block).unwrap();
    refused("a folder in a block's place");
    std::fs::remove_dir(&block).unwrap();
    std::fs::write(&block, &good).unwrap();
    mlxbun::load(&path).unwrap();
    // Manifests: each edit keeps the header's hash right, so its fields are what is refused.
    let manifest = std::fs::read(&path).unwrap();
    let first = format!("\"hash\":\"{}\"", names[0]);
    let edits: Vec<(&str, Edit)> = vec![
        (
            "a block name out of the folder",
            Box::new(|h: &str| h.replacen("\"blocks\":[{\"hash\":\"", "\"blocks\":[{\"hash\":\"../", 1)),
        ),
        (
            "an upper-case block name",
            Box::new(|h: &str| h.replace(&first, &first.to_uppercase().replace("\"HASH\"", "\"hash\""))),
        ),
        ("blocks adding up to another length", Box::new(|h: &str| h.replacen("\"bytes\":64}", "\"bytes\":60}", 1))),
        ("a block of no bytes", Box::new(|h: &str| h.replacen("\"bytes\":64}", "\"bytes\":0}", 1))),
        ("a tensor hash in a manifest", Box::new(|h: &str| h.replacen("\"hash\":\"\"", "\"hash\":\"0000000000000000\"", 1))),
        ("a tensor without blocks", Box::new(|h: &str| h.replacen(",\"blocks\":[", ",\"other\":[", 1))),
        ("version 3 over a manifest", Box::new(|h: &str| h.replace("\"formatVersion\":5", "\"formatVersion\":3"))),
    ];
    for (why, edit) in &edits {
        std::fs::write(&path, manifest_with(&manifest, edit)).unwrap();
        refused(why);
    }
    let mut trailing = manifest.clone();
    trailing.extend_from_slice(&[0; 16]);
    std::fs::write(&path, &trailing).unwrap();
    refused("bytes after the manifest's header");
    std::fs::write(&path, &manifest).unwrap();
    mlxbun::load(&path).unwrap();
}

/// Through the C ABI: a set saved in blocks, loaded back by `latent_cache_set_load_mlxbun`; an
/// oversized block size refused with nothing written.
#[test]
fn the_c_abi_saves_blocks() {
    let dir = fresh("c");
    let example = dir.join("example.mlxkv");
    python(&["write-example", example.to_str().unwrap()]);
    let c = |p: &Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_load_mlxbun(c(&example).as_ptr(), &mut set) }, Status::Ok);
    let manifest = dir.join("blocks.mlxkv");
    assert_eq!(unsafe { latent_cache_set_save_mlxbun_blocks(set, c(&manifest).as_ptr(), std::ptr::null(), 8) }, Status::Ok);
    let too_big = dir.join("too-big.mlxkv");
    assert_eq!(
        unsafe { latent_cache_set_save_mlxbun_blocks(set, c(&too_big).as_ptr(), std::ptr::null(), (1 << 30) + 1) },
        Status::InvalidArgument
    );
    assert!(!too_big.exists());
    let mut back = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_load_mlxbun(c(&manifest).as_ptr(), &mut back) }, Status::Ok);
    let (want, _) = mlxbun::load(&example).unwrap();
    let (got, _) = mlxbun::load(&manifest).unwrap();
    same(&got, &want);
    unsafe {
        latent_cache_set_free(set);
        latent_cache_set_free(back);
    }
}
