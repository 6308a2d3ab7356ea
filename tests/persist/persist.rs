//! Saving and loading caches: round trips bit for bit against the reference model in every
//! storage mode, both layouts, padded rows, several layers, through files and bytes; and damaged
//! files (truncated anywhere, bytes flipped in the header and the data) refused with a status,
//! never a crash.
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::{Model, Rng};

use latent_cache::core::persist;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};

fn layer(modes: [StorageMode; 3], index: usize, layout: LayoutKind) -> Geometry {
    geometry_in([128, 64, index], modes, layout)
}

fn filled(rng: &mut Rng, g: Geometry) -> (LatentCache, Model) {
    let widths = [g.kv_lora_rank, g.rope_head_dim, g.index_head_dim];
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = Model::with_modes(widths, [g.latent_storage, g.rope_storage, g.index_storage]);
    model.ragged = g.layout == LayoutKind::Ragged;
    let pads = [0, 3, 1];
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * 6 * widths[f]));
    let keys = (widths[2] > 0).then_some(data[2].as_slice());
    cache.append_host_padded(3, 6, &pads, &data[0], &data[1], keys).unwrap();
    model.append_padded(3, 6, &pads, &data);
    cache.spec_round_begin().unwrap();
    model.begin();
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * 3 * widths[f]));
    let keys = (widths[2] > 0).then_some(data[2].as_slice());
    cache.append_host(3, 3, &data[0], &data[1], keys).unwrap();
    model.append(3, 3, &data);
    cache.spec_round_rollback(&[3, 0, 2]).unwrap();
    model.rollback(&[3, 0, 2]);
    (cache, model)
}

fn assert_same(cache: &LatentCache, model: &Model, what: &str) {
    assert_eq!(cache.row_offsets(), model.row_offsets(), "{what}");
    assert_eq!(cache.left_pad(), model.left_pad().as_slice(), "{what}");
    assert_eq!(cache.row_ends(), model.row_ends().as_slice(), "{what}");
    for (f, family) in Family::ALL.into_iter().enumerate() {
        if model.widths[f] == 0 {
            continue;
        }
        for row in 0..model.rows.len() {
            let got: Vec<u32> = cache.read_row(family, row).unwrap().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = model.rows[row].families[f].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{what}: {} row {row}", family.name());
        }
    }
}

#[test]
fn round_trips_are_bit_exact_in_every_mode_and_layout() {
    use StorageMode::*;
    let mut rng = Rng::new(51);
    let dir = std::env::temp_dir().join(format!("latent-cache-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let layers: Vec<(LatentCache, Model)> = [
            layer([F32; 3], 128, layout),
            layer([Bf16, F16, F32], 0, layout),
            layer([Q8, Bf16, Fp8], 128, layout),
            layer([Q4, Q4, F32], 0, layout),
        ]
        .into_iter()
        .map(|g| filled(&mut rng, g))
        .collect();
        let caches: Vec<&LatentCache> = layers.iter().map(|(c, _)| c).collect();
        let path = dir.join(format!("{layout:?}.safetensors"));
        persist::save(&caches, &path).unwrap();
        let loaded = persist::load(&path).unwrap();
        assert_eq!(loaded.len(), 4);
        for (i, (cache, (_, model))) in loaded.iter().zip(&layers).enumerate() {
            assert_eq!(cache.geometry(), layers[i].0.geometry(), "layer {i} geometry");
            assert_same(cache, model, &format!("{layout:?} layer {i} from a file"));
        }
        let bytes = persist::save_to_bytes(&caches).unwrap();
        // A file save hashes as it writes, then writes the header again with the checksums; the
        // bytes are those of the buffer save, which hashes first.
        assert!(std::fs::read(&path).unwrap() == bytes, "{layout:?}: the file and the buffer differ");
        for (i, (cache, (_, model))) in persist::load_from_bytes(&bytes).unwrap().iter().zip(&layers).enumerate() {
            assert_same(cache, model, &format!("{layout:?} layer {i} from bytes"));
        }
        // A loaded cache goes on working: appends, rounds, prefix reuse by trimming.
        let mut first = persist::load(&path).unwrap().remove(0);
        let mut model = layers[0].1.clone();
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * 2 * model.widths[f]));
        first.append_host(3, 2, &data[0], &data[1], Some(&data[2])).unwrap();
        model.append(3, 2, &data);
        first.trim(3, false).unwrap();
        model.trim(3);
        assert_same(&first, &model, "a loaded cache, appended and trimmed");
        // No temporary file is left beside the saved one.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_files_are_refused() {
    let mut rng = Rng::new(52);
    let (a, _) = filled(&mut rng, layer([StorageMode::F32; 3], 128, LayoutKind::RightJustified));
    let (b, _) = filled(&mut rng, layer([StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8], 128, LayoutKind::Ragged));
    let bytes = persist::save_to_bytes(&[&a, &b]).unwrap();
    assert_eq!(persist::load_from_bytes(&bytes).unwrap().len(), 2);
    // Truncated at 64 points.
    for k in 0..64 {
        let cut = bytes.len() * k / 64;
        assert!(persist::load_from_bytes(&bytes[..cut]).is_err(), "truncated at {cut} of {}", bytes.len());
    }
    // Bytes flipped in the header and in the data.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut refused = 0;
    for k in 0..96 {
        let at = if k % 2 == 0 {
            8 + (rng.next() as usize % header_len)
        } else {
            8 + header_len + rng.next() as usize % (bytes.len() - 8 - header_len)
        };
        let mut damaged = bytes.clone();
        damaged[at] ^= 1 << (rng.next() % 8);
        match persist::load_from_bytes(&damaged) {
            Err(_) => refused += 1,
            // A flip inside JSON whitespace or a padding byte changes nothing the file holds.
            Ok(layers) => assert_eq!(layers.len(), 2, "flip at {at}"),
        }
    }
    assert!(refused >= 80, "only {refused} of 96 flipped files were refused");
    // Every data flip is caught by the checksums.
    for k in 0..32 {
        let at = 8 + header_len + (bytes.len() - 8 - header_len) * k / 32;
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x40;
        assert!(persist::load_from_bytes(&damaged).is_err(), "a flipped data byte at {at} was not caught");
    }
    assert!(persist::load_from_bytes(b"not a safetensors file").is_err());
    // Paths MLX would read as format strings, and folders that do not exist: a status.
    for path in ["/tmp/100%s%n.safetensors", "/nonexistent/folder/state.safetensors"] {
        let path = std::path::Path::new(path);
        assert!(persist::save(&[&a], path).is_err(), "{}", path.display());
        assert!(persist::load(path).is_err(), "{}", path.display());
    }
}
