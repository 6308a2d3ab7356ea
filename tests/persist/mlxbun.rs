//! The seed's own prompt-cache files (mlx-bun's `MLXBUNKV2` layout): files written by an
//! independent writer of that layout (tests/interop/mlxbun_kv.py, plain Python) load here, with
//! the seed's own test data and the header hash Bun computes for it; files this library writes
//! pass that reader's checks (magic, hashes, alignment, fields) with every value; damaged or
//! foreign files are refused with nothing created; what the format cannot hold is refused on save.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::model::Rng;
use latent_cache::core::persist::mlxbun;
use latent_cache::core::persist::mlxbun::MlxbunInfo;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::mlxbun::*;
use latent_cache::ffi::set::{latent_cache_set_free, latent_cache_set_layer_count};
use latent_cache::{ErrorKind, Family, Geometry, LatentCache, Role, StorageMode};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mlxbun_kv.py");

pub(super) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-mlxbun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

pub(super) fn python(args: &[&str]) -> String {
    let out = Command::new("python3").arg(SCRIPT).args(args).output().expect("python3");
    assert!(out.status.success(), "the independent side failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_seeds_test_data_loads() {
    let path = scratch("example.mlxkv");
    python(&["write-example", path.to_str().unwrap()]);
    let bytes = std::fs::read(&path).unwrap();
    // The header hash Bun.hash gives this header (createdAt 0): the independent writer's bytes are
    // the seed's bytes.
    assert_eq!(u64::from_le_bytes(bytes[18..26].try_into().unwrap()), 0xf68968c78d302796);
    let (layers, info) = mlxbun::load(&path).unwrap();
    assert_eq!(info.tokens, vec![101, 102]);
    assert_eq!(info.model_id.as_deref(), Some("glm-test"));
    assert_eq!(info.config_fingerprint.as_deref(), Some("glm-layout-v1"));
    assert_eq!(info.ns, None);
    let signatures: Vec<String> = layers.iter().map(|l| l.signature()).collect();
    assert_eq!(signatures, ["kv:mla:target", "kv:mla:target:dsa", "kv:mla:mtp"]);
    let want: [&[&[f32]]; 3] = [
        &[&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0]],
        &[&[7.0, 8.0, 9.0, 10.0], &[11.0, 12.0], &[13.0, 14.0, 15.0, 16.0]],
        &[&[17.0, 18.0, 19.0, 20.0], &[21.0, 22.0]],
    ];
    for (l, layer) in layers.iter().enumerate() {
        let g = layer.geometry();
        assert_eq!((g.kv_lora_rank, g.rope_head_dim, g.max_tokens), (2, 1, 16), "layer {l}");
        assert_eq!(layer.row_offsets(), vec![2]);
        for (f, family) in Family::ALL.into_iter().enumerate().take(want[l].len()) {
            assert_eq!(layer.read_row(family, 0).unwrap(), want[l][f], "layer {l} {}", family.name());
        }
    }
    assert_eq!(layers[2].geometry().role, Role::Mtp);
    // Loading from bytes gives the same.
    let (again, _) = mlxbun::load_from_bytes(&bytes).unwrap();
    assert_eq!(again.len(), 3);
}

/// A GLM-5.2-shaped model in small: two target layers (one with index keys) and the MTP layer.
pub(super) fn model(rng: &mut Rng, batch: usize, tokens: usize) -> Vec<LatentCache> {
    [(64, 0, Role::Target), (64, 16, Role::Target), (0, 0, Role::Mtp)]
        .into_iter()
        .map(|(max, index, role)| {
            let g = Geometry {
                kv_lora_rank: 32,
                rope_head_dim: 8,
                index_head_dim: index,
                max_tokens: max,
                role,
                ..Geometry::default()
            };
            let mut c = LatentCache::new(g).unwrap();
            let keys = (index > 0).then(|| rng.floats(batch * tokens * index));
            c.append_host(batch, tokens, &rng.floats(batch * tokens * 32), &rng.floats(batch * tokens * 8), keys.as_deref())
                .unwrap();
            c
        })
        .collect()
}

#[test]
fn files_written_here_pass_the_independent_reader() {
    let mut rng = Rng::new(11);
    let layers = model(&mut rng, 2, 5);
    let path = scratch("ours.mlxkv");
    let info = MlxbunInfo { tokens: vec![7, 8, 9, 10, 4_000_000_000], ns: Some(String::new()), ..MlxbunInfo::default() };
    mlxbun::save(&layers.iter().collect::<Vec<_>>(), &info, &path).unwrap();
    check_independent_read(&python(&["read", path.to_str().unwrap()]), &layers);
    // And back here: the same caches, the same info.
    let (loaded, back) = mlxbun::load(&path).unwrap();
    assert_eq!(back, info);
    for (a, b) in layers.iter().zip(&loaded) {
        assert_eq!(a.geometry(), b.geometry());
        for family in Family::ALL.into_iter().take(if a.geometry().index_head_dim > 0 { 3 } else { 2 }) {
            for row in 0..2 {
                assert_eq!(a.read_row(family, row).unwrap(), b.read_row(family, row).unwrap());
            }
        }
    }
}

/// The independent reader's printout of a file of `model`'s layers (two rows of five positions)
/// saved with tokens 7 8 9 10 4000000000 and an empty `ns`: every tensor's values as stored.
pub(super) fn check_independent_read(text: &str, layers: &[LatentCache]) {
    let mut tensors = 0;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[0] {
            "tokens" => assert_eq!(line, "tokens 7 8 9 10 4000000000"),
            "meta" => assert_eq!(line, "meta ns "),
            _ => {
                let layer: usize = fields[0].parse().unwrap();
                let kind = ["mla", "mla-dsa", "mtp-mla"][layer];
                let max = ["64", "64", "9007199254740991"][layer];
                assert_eq!(&fields[1..4], [kind, "5", max], "layer {layer}");
                let family = Family::ALL[fields[4].parse::<usize>().unwrap()];
                assert_eq!(&fields[5..7], ["2", "5"]);
                let values: Vec<f32> = fields[8..].iter().map(|v| v.parse().unwrap()).collect();
                let want: Vec<f32> = (0..2).flat_map(|row| layers[layer].read_row(family, row).unwrap()).collect();
                assert_eq!(values, want, "layer {layer} {}", family.name());
                tensors += 1;
            }
        }
    }
    assert_eq!(tensors, 2 + 3 + 2);
}

fn refused(bytes: &[u8], why: &str) {
    let err = mlxbun::load_from_bytes(bytes).err().unwrap_or_else(|| panic!("{why}: loaded"));
    assert_eq!(err.kind, ErrorKind::InvalidArgument, "{why}: {}", err.message);
}

/// Rewrites the header (keeping the hash right) with `edit` applied to its text.
fn with_header(bytes: &[u8], edit: impl Fn(&str) -> String) -> Vec<u8> {
    let len = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
    let start = u32::from_le_bytes(bytes[14..18].try_into().unwrap()) as usize;
    let text = edit(std::str::from_utf8(&bytes[26..26 + len]).unwrap());
    assert!(26 + text.len() <= start, "the edit fits before the data");
    let mut out = bytes.to_vec();
    out[10..14].copy_from_slice(&(text.len() as u32).to_le_bytes());
    out[18..26].copy_from_slice(&latent_cache::core::persist::wyhash::wyhash(text.as_bytes(), 0).to_le_bytes());
    out[26..start].fill(0);
    out[26..26 + text.len()].copy_from_slice(text.as_bytes());
    out
}

#[test]
fn damaged_and_foreign_files_are_refused() {
    let mut rng = Rng::new(5);
    let layers = model(&mut rng, 1, 3);
    let bytes = mlxbun::save_to_bytes(&layers.iter().collect::<Vec<_>>(), &MlxbunInfo::default()).unwrap();
    mlxbun::load_from_bytes(&bytes).unwrap();
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    refused(&flipped, "a header byte changed");
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 0x10;
    refused(&flipped, "a tensor byte changed");
    refused(&bytes[..bytes.len() - 1], "truncated");
    refused(&bytes[..20], "shorter than the prefix");
    let mut magic = bytes.clone();
    magic[8] = b'1';
    refused(&magic, "the older magic");
    refused(&with_header(&bytes, |h| h.replace("\"formatVersion\":3", "\"formatVersion\":5")), "block layout");
    refused(&with_header(&bytes, |h| h.replace("\"kind\":\"mla\"", "\"kind\":\"kv\"")), "a kind that is not MLA");
    refused(&with_header(&bytes, |h| h.replacen("\"kind\":\"mla-dsa\"", "\"kind\":\"mla\"", 1)), "index keys on mla");
    refused(
        &with_header(&bytes, |h| {
            h.replace("\"kind\":\"mtp-mla\",\"offset\":3,", "\"kind\":\"mtp-mla\",\"dsaHeadDim\":16,\"offset\":3,")
        }),
        "MTP with index keys",
    );
    refused(&with_header(&bytes, |h| h.replace("\"dtype\":10", "\"dtype\":12")), "bfloat16 tensors");
    refused(
        &with_header(&bytes, |h| h.replacen("\"shape\":[1,3,32]", "\"shape\":[1,2,32]", 1)),
        "a shape that is not the offset",
    );
    refused(
        &with_header(&bytes, |h| h.replace("\"codecProvider\":\"mlx-cache-v3\"", "\"codecProvider\":\"other\"")),
        "another codec provider",
    );
    refused(&with_header(&bytes, |h| h.replacen("\"off\":0,", "\"off\":1000000000,", 1)), "a tensor outside the file");
    refused(&with_header(&bytes, |h| h.replace("\"tokens\":[]", "\"tokens\":[1.5]")), "a token that is not an integer");
    refused(&with_header(&bytes, |h| h.replacen("\"maxTokens\":64", "\"maxTokens\":2", 1)), "an offset beyond maxTokens");
    // A header that still verifies and parses loads: the edits above are what is refused.
    mlxbun::load_from_bytes(&with_header(&bytes, |h| h.replace("\"tokens\":[]", "\"tokens\":[3]"))).unwrap();
}

#[test]
fn what_the_format_cannot_hold_is_refused_on_save() {
    let mut rng = Rng::new(9);
    // A folder of its own: other tests of this binary save (through temporary files) meanwhile.
    let dir = scratch("refused");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("refused.mlxkv");
    let save = |layers: &[&LatentCache]| mlxbun::save(layers, &MlxbunInfo::default(), &path).unwrap_err().kind;
    let g = Geometry { kv_lora_rank: 32, rope_head_dim: 8, ..Geometry::default() };
    let mut uneven = LatentCache::new(g).unwrap();
    uneven.append_host_padded(2, 3, &[1, 0], &rng.floats(2 * 3 * 32), &rng.floats(2 * 3 * 8), None).unwrap();
    assert_eq!(save(&[&uneven]), ErrorKind::InvalidArgument, "padded rows");
    let mut bf16 = LatentCache::new(Geometry { latent_storage: StorageMode::Bf16, ..g }).unwrap();
    bf16.append_host(1, 2, &rng.floats(2 * 32), &rng.floats(2 * 8), None).unwrap();
    assert_eq!(save(&[&bf16]), ErrorKind::InvalidArgument, "bf16 storage");
    assert_eq!(save(&[&LatentCache::new(g).unwrap()]), ErrorKind::InvalidArgument, "an empty cache");
    assert_eq!(save(&[]), ErrorKind::InvalidArgument, "no layers");
    // To bytes, the same refusals: a buffer a reader would refuse is never made.
    let to_bytes = |layers: &[&LatentCache]| mlxbun::save_to_bytes(layers, &MlxbunInfo::default()).unwrap_err().kind;
    assert_eq!(to_bytes(&[]), ErrorKind::InvalidArgument, "no layers, to bytes");
    assert_eq!(to_bytes(&[&uneven]), ErrorKind::InvalidArgument, "padded rows, to bytes");
    assert_eq!(to_bytes(&[&bf16]), ErrorKind::InvalidArgument, "bf16 storage, to bytes");
    let mut one = LatentCache::new(g).unwrap();
    one.append_host(1, 2, &rng.floats(2 * 32), &rng.floats(2 * 8), None).unwrap();
    let too_many: Vec<&LatentCache> = std::iter::repeat_n(&one, 4097).collect();
    assert_eq!(to_bytes(&too_many), ErrorKind::InvalidArgument, "more layers than a reader takes, to bytes");
    assert!(!path.exists());
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary file left");
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.to_str().unwrap()).unwrap()
}

/// Through the C ABI: a set saved in the seed's format, its header and tokens read alone, and
/// loaded back as a set.
#[test]
fn the_c_abi_saves_and_loads_sets() {
    let path = scratch("c.mlxkv");
    python(&["write-example", path.to_str().unwrap()]);
    let p = c_path(&path);
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_load_mlxbun(p.as_ptr(), &mut set) }, Status::Ok);
    let mut count = 0;
    assert_eq!(unsafe { latent_cache_set_layer_count(set, &mut count) }, Status::Ok);
    assert_eq!(count, 3);
    let mut tokens = [0u32; 2];
    let mut written = 0;
    assert_eq!(unsafe { latent_cache_mlxbun_tokens(p.as_ptr(), tokens.as_mut_ptr(), 2, &mut written) }, Status::Ok);
    assert_eq!((tokens, written), ([101, 102], 2));
    assert_eq!(unsafe { latent_cache_mlxbun_tokens(p.as_ptr(), tokens.as_mut_ptr(), 1, &mut written) }, Status::BufferTooSmall);
    let mut header = vec![0 as std::ffi::c_char; 2048];
    assert_eq!(unsafe { latent_cache_mlxbun_header(p.as_ptr(), header.as_mut_ptr(), header.len(), &mut written) }, Status::Ok);
    let text = unsafe { std::ffi::CStr::from_ptr(header.as_ptr()) }.to_str().unwrap();
    assert!(text.starts_with("{\"formatVersion\":3,\"createdAt\":0,\"modelId\":\"glm-test\""), "{text}");
    assert_eq!(text.len(), written);

    let out = scratch("c-out.mlxkv");
    let o = c_path(&out);
    let ns = c"";
    let ids = [5u32, 6];
    let info = latent_cache_mlxbun_info {
        tokens: ids.as_ptr(),
        tokens_len: 2,
        model_id: c"glm-5.2".as_ptr(),
        config_fingerprint: std::ptr::null(),
        tokenizer_hash: std::ptr::null(),
        ns: ns.as_ptr(),
    };
    assert_eq!(unsafe { latent_cache_set_save_mlxbun(set, o.as_ptr(), &info) }, Status::Ok);
    let text = python(&["read", out.to_str().unwrap()]);
    assert!(text.starts_with("tokens 5 6\nmeta modelId glm-5.2\nmeta ns \n"), "{text}");
    unsafe { latent_cache_set_free(set) };
    let missing = c_path(&scratch("missing.mlxkv"));
    let mut none = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_load_mlxbun(missing.as_ptr(), &mut none) }, Status::InvalidArgument);
    assert!(none.is_null());
}
