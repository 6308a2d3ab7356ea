//! What a load makes of a file's content, against independent expectations: composed caches of
//! float compact modes round trip (values, boundaries and what follows, against the composed
//! reference model and the boundary rule); forged counts past int32 (positions, row ends) and
//! forged boundaries below the rule are refused with a status and nothing made; saves inside a
//! speculative round, a padded prefill or prefill maintenance are refused with INVALID_STATE and
//! the cache unchanged, and the same cache saved at rest loads with the rule's boundaries and
//! limits.
use std::collections::BTreeMap;

use crate::common::check::{append_host, host_data, last_error, new_cache};
use crate::common::composed_ref::Reference;
use crate::common::composed_rule::{boundary, composed_layer};
use crate::common::model::{Model, Rng};

use latent_cache::core::persist;
use latent_cache::ffi::cache::latent_cache_free;
use latent_cache::ffi::persist::{
    latent_cache_bytes_free, latent_cache_load_from_buffer, latent_cache_save, latent_cache_save_to_buffer,
};
use latent_cache::ffi::spec::{latent_cache_spec_round_begin, latent_cache_spec_round_commit};
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use latent_cache::{ErrorKind, Geometry, LatentCache, LayoutKind, StorageMode};

const F32: StorageMode = StorageMode::F32;
const BF16: StorageMode = StorageMode::Bf16;
const F16: StorageMode = StorageMode::F16;
const Q8: StorageMode = StorageMode::Q8;
const Q4: StorageMode = StorageMode::Q4;
const LAYOUTS: [LayoutKind; 2] = [LayoutKind::RightJustified, LayoutKind::Ragged];

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-hostile-content-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A 128/64/128 layer (the geometry of the reports), composed as given.
fn layer(hot_window: usize, hot: StorageMode, modes: [StorageMode; 3], layout: LayoutKind) -> Geometry {
    Geometry { kv_lora_rank: 128, ..composed_layer(128, hot_window, hot, modes, layout) }
}

fn append(rng: &mut Rng, cache: &mut LatentCache, r: &mut Reference, batch: usize, tokens: usize) {
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * r.compact.widths[f]));
    cache.append_host(batch, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
    r.both(|m| m.append(batch, tokens, &data));
    r.settle();
}

/// Saves `cache` to a file and to bytes, loads both, checks each against the reference (values,
/// boundaries, limits); returns the one loaded from bytes.
fn round_trip(cache: &LatentCache, r: &Reference, path: &std::path::Path, what: &str) -> LatentCache {
    persist::save(&[cache], path).unwrap_or_else(|e| panic!("{what}: save: {}", e.message));
    let from_file = persist::load(path).unwrap_or_else(|e| panic!("{what}: load: {}", e.message)).pop().unwrap();
    r.check(&from_file, &format!("{what}, loaded from a file"));
    let bytes = persist::save_to_bytes(&[cache]).unwrap_or_else(|e| panic!("{what}: save_to_bytes: {}", e.message));
    let loaded = persist::load_from_bytes(&bytes).unwrap_or_else(|e| panic!("{what}: load_from_bytes: {}", e.message));
    let loaded = loaded.into_iter().next().unwrap();
    r.check(&loaded, &format!("{what}, loaded from bytes"));
    loaded
}

/// Defect 4: every composition the geometry accepts (each compact mode, float or packed, for
/// every family, for the latent alone, for the rope alone, under each hot mode), both layouts,
/// saves and loads (file and bytes) with the reference's values and boundaries, and the loaded
/// cache goes on as the saved one.
#[test]
fn composed_caches_of_every_mode_load_what_was_saved() {
    let dir = scratch("modes");
    let mut cases = 0;
    for layout in LAYOUTS {
        for hot in [F32, BF16, F16] {
            for compact in StorageMode::ALL {
                for modes in [[compact; 3], [compact, F32, F32], [F32, compact, F32]] {
                    let g = layer(64, hot, modes, layout);
                    let Ok(mut cache) = LatentCache::new(g) else { continue };
                    if !g.composed() {
                        continue;
                    }
                    cases += 1;
                    let what = format!("{layout:?}, {modes:?} under {hot:?}");
                    let path = dir.join("cache.safetensors");
                    let mut rng = Rng::new(cases);
                    let mut r = Reference::new(g);
                    // One position (the report), then rows of different lengths with moved
                    // boundaries and a hot side.
                    append(&mut rng, &mut cache, &mut r, 2, 1);
                    round_trip(&cache, &r, &path, &format!("{what}, one position"));
                    cache.spec_round_begin().unwrap();
                    r.both(|m| m.begin());
                    append(&mut rng, &mut cache, &mut r, 2, 5);
                    cache.spec_round_rollback(&[5, 2]).unwrap();
                    r.both(|m| m.rollback(&[5, 2]));
                    r.settle();
                    append(&mut rng, &mut cache, &mut r, 2, 130);
                    assert!(r.converted.iter().any(|&c| c > 0), "{what}: a boundary moved");
                    let mut loaded = round_trip(&cache, &r, &path, &format!("{what}, 136 positions"));
                    let mut r2 = r.clone();
                    for tokens in [3, 70] {
                        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * r.compact.widths[f]));
                        for (c, r, which) in [(&mut cache, &mut r, "saved"), (&mut loaded, &mut r2, "loaded")] {
                            c.append_host(2, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
                            r.both(|m| m.append(2, tokens, &data));
                            r.settle();
                            r.check(c, &format!("{what}: the {which} cache after {tokens} more"));
                        }
                    }
                }
            }
        }
    }
    // The reports' compositions are among them (the geometry refuses others, e.g. a compact
    // mode wider than the hot one).
    for (modes, hot) in [([BF16, F32, F32], F32), ([F16, F32, F32], F32), ([BF16; 3], F32), ([F32, BF16, F32], F32)] {
        assert!(LatentCache::new(layer(64, hot, modes, LayoutKind::Ragged)).is_ok(), "{modes:?} under {hot:?} refused");
    }
    assert!(cases >= 30, "{cases} compositions accepted");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The metadata checksum as the format defines it: FNV-1a 64 over `key \0 value \0` of every
/// entry but the checksum itself, in key order, as 16 lowercase hex digits.
fn fnv_metadata(meta: &BTreeMap<String, String>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in meta.iter().filter(|(k, _)| k.as_str() != "0.latent_cache.meta_sum") {
        for &b in k.as_bytes().iter().chain(&[0]).chain(v.as_bytes()).chain(&[0]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// A safetensors file with its metadata edited by `edit` and the metadata checksum recomputed
/// (what a forger does); the tensors' bytes unchanged.
fn forge(bytes: &[u8], edit: impl FnOnce(&mut BTreeMap<String, String>)) -> Vec<u8> {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let mut meta: BTreeMap<String, String> =
        header["__metadata__"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string())).collect();
    edit(&mut meta);
    let sum = fnv_metadata(&meta);
    meta.insert("0.latent_cache.meta_sum".into(), sum);
    header.insert("__metadata__".into(), serde_json::to_value(&meta).unwrap());
    let mut text = serde_json::to_string(&header).unwrap();
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + len..]);
    out
}

/// A forged file is refused as INVALID_ARGUMENT by every load (core bytes and file, the C API
/// from a buffer), nothing made.
fn refused_everywhere(forged: &[u8], dir: &std::path::Path, what: &str) {
    match persist::load_from_bytes(forged) {
        Ok(caches) => panic!("{what}: loaded {} positions", caches[0].offset()),
        Err(e) => assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {}", e.message),
    }
    let path = dir.join("forged.safetensors");
    std::fs::write(&path, forged).unwrap();
    let e = persist::load(&path).err().unwrap_or_else(|| panic!("{what}: a file loaded"));
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{what}: {}", e.message);
    let mut out: *mut Handle = std::ptr::null_mut();
    let status = unsafe { latent_cache_load_from_buffer(forged.as_ptr(), forged.len(), &mut out) };
    assert_eq!(status, Status::InvalidArgument, "{what}: C load ({})", last_error());
    assert!(out.is_null(), "{what}: the C load wrote its output");
    assert!(!last_error().is_empty(), "{what}: refused without a message");
}

/// Defect 5: positions and row ends of 2^32 + 5 (which an int32 narrowing reads as 5) are
/// refused, in a float right-justified file and a Q4 ragged one; so are counts past int32 that
/// are not narrowed to a match, and the unforged files load.
#[test]
fn forged_counts_past_int32_are_refused() {
    let dir = scratch("forged-counts");
    let big = ((1u64 << 32) + 5).to_string();
    for (modes, layout) in [([F32; 3], LayoutKind::RightJustified), ([Q4, BF16, Q8], LayoutKind::Ragged)] {
        let g = layer(0, F32, modes, layout);
        let mut cache = LatentCache::new(g).unwrap();
        let mut r = Reference::new(g);
        append(&mut Rng::new(5), &mut cache, &mut r, 2, 5);
        let bytes = persist::save_to_bytes(&[&cache]).unwrap();
        // The forger's own tool works: an unchanged metadata, resealed, still loads.
        let same = forge(&bytes, |_| {});
        assert_eq!(persist::load_from_bytes(&same).unwrap()[0].row_offsets(), r.lengths(), "resealed, unchanged");
        let what = format!("{modes:?} {layout:?}");
        let forged = forge(&bytes, |m| {
            m.insert("0.latent_cache.layer.0.positions".into(), big.clone());
            m.insert("0.latent_cache.layer.0.row_ends".into(), format!("{big},{big}"));
        });
        refused_everywhere(&forged, &dir, &format!("{what}: positions and row ends 2^32 + 5"));
        let forged = forge(&bytes, |m| {
            m.insert("0.latent_cache.layer.0.positions".into(), big.clone());
            m.insert("0.latent_cache.layer.0.row_ends".into(), format!("5,{big}"));
        });
        refused_everywhere(&forged, &dir, &format!("{what}: one row ending at 2^32 + 5"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A composed file whose boundaries stand below the rule's (a cache at rest never has them
/// there) is refused; so is one whose boundary passes a row's end.
#[test]
fn forged_boundaries_are_refused() {
    let dir = scratch("forged-boundaries");
    let g = layer(64, F32, [Q8, BF16, Q8], LayoutKind::RightJustified);
    let mut cache = LatentCache::new(g).unwrap();
    let mut r = Reference::new(g);
    append(&mut Rng::new(6), &mut cache, &mut r, 2, 300);
    let want = boundary(300, 64);
    assert_eq!(r.converted, vec![want; 2]);
    let bytes = persist::save_to_bytes(&[&cache]).unwrap();
    let key = "0.latent_cache.layer.0.converted";
    for converted in ["0,0".to_string(), format!("{want},{}", want - 64), "301,192".into()] {
        let forged = forge(&bytes, |m| {
            assert_eq!(m[key], format!("{want},{want}"), "the saved boundaries");
            m.insert(key.into(), converted.clone());
        });
        refused_everywhere(&forged, &dir, &format!("boundaries {converted}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Defect 8: a composed cache (Q8 latent, bfloat16 rope, hot window 64) inside a round, a
/// padded prefill or prefill maintenance refuses to be saved (INVALID_STATE, nothing changed);
/// once the round is committed or the prefill finalized, it saves and loads with the rule's
/// boundaries, `max_append_tokens` and `minimum_reusable_offset`, and goes on as the original.
#[test]
fn saves_refuse_open_operations_and_loads_keep_the_rule() {
    let dir = scratch("open-operations");
    let path = dir.join("cache.safetensors");
    for layout in LAYOUTS {
        let g = layer(64, F32, [Q8, BF16, Q8], layout);
        for case in ["round", "padded prefill", "maintenance"] {
            let what = format!("{layout:?} {case}");
            let mut rng = Rng::new(8);
            let mut cache = LatentCache::new(g).unwrap();
            let mut r = Reference::new(g);
            append(&mut rng, &mut cache, &mut r, 1, 100);
            match case {
                "round" => {
                    cache.spec_round_begin().unwrap();
                    r.both(|m| m.begin());
                }
                "padded prefill" => {
                    cache.prefill_prepare(None, None, Some(&[150])).unwrap();
                    r.right = Some(vec![150]);
                }
                _ => {
                    cache.prefill_begin().unwrap();
                    r.maintaining = true;
                }
            }
            append(&mut rng, &mut cache, &mut r, 1, 200);
            r.check(&cache, &format!("{what}: before the save"));
            let converted = cache.converted_positions();
            for result in [persist::save(&[&cache], &path).err(), persist::save_to_bytes(&[&cache]).err()] {
                let e = result.unwrap_or_else(|| panic!("{what}: saved with an operation open"));
                assert_eq!(e.kind, ErrorKind::State, "{what}: {}", e.message);
                assert!(!e.message.is_empty());
            }
            assert!(!path.exists(), "{what}: a refused save left a file");
            assert_eq!(cache.converted_positions(), converted, "{what}: a refused save moved a boundary");
            r.check(&cache, &format!("{what}: after the refused saves"));
            match case {
                "round" => {
                    cache.spec_round_commit().unwrap();
                    r.both(|m| m.round = None);
                }
                "padded prefill" => {
                    cache.prefill_finalize().unwrap();
                    r.both(|m| m.trim(150));
                    r.right = None;
                }
                _ => {
                    cache.prefill_end().unwrap();
                    r.maintaining = false;
                }
            }
            r.settle();
            let len = if case == "padded prefill" { 150 } else { 300 };
            assert_eq!(r.converted, vec![boundary(len, 64)], "{what}: the rule's boundary");
            let mut loaded = round_trip(&cache, &r, &path, &what);
            assert!(!loaded.in_spec_round() && !loaded.in_prefill_maintenance(), "{what}: loaded with an operation open");
            assert_eq!(loaded.max_append_tokens(), cache.max_append_tokens(), "{what}: max_append_tokens");
            assert_eq!(loaded.minimum_reusable_offset(), cache.minimum_reusable_offset(), "{what}: minimum_reusable_offset");
            let mut r2 = r.clone();
            for tokens in [40, 100] {
                let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(tokens * r.compact.widths[f]));
                for (c, r, which) in [(&mut cache, &mut r, "saved"), (&mut loaded, &mut r2, "loaded")] {
                    c.append_host(1, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
                    r.both(|m| m.append(1, tokens, &data));
                    r.settle();
                    r.check(c, &format!("{what}: the {which} cache after {tokens} more"));
                }
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Through the C API: a save inside a round is INVALID_STATE with a message, writes no output
/// and no file, and changes nothing; after the commit it saves and loads.
#[test]
fn c_saves_inside_a_round_are_invalid_state() {
    let dir = scratch("c-round");
    let path = dir.join("round.safetensors");
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let widths = [16, 8, 4];
    let cache = new_cache(widths, 0);
    let mut rng = Rng::new(9);
    let mut model = Model::new(widths);
    let data = host_data(&mut rng, widths, 2, 6);
    assert_eq!(append_host(cache, 2, 6, &data), Status::Ok);
    model.append(2, 6, &data);
    assert_eq!(unsafe { latent_cache_spec_round_begin(cache) }, Status::Ok);
    model.begin();
    let data = host_data(&mut rng, widths, 2, 3);
    assert_eq!(append_host(cache, 2, 3, &data), Status::Ok);
    model.append(2, 3, &data);
    let (mut out, mut len) = (std::ptr::null_mut::<u8>(), 7usize);
    assert_eq!(unsafe { latent_cache_save_to_buffer(cache, &mut out, &mut len) }, Status::InvalidState, "{}", last_error());
    assert!(!last_error().is_empty());
    assert!(out.is_null() && len == 7, "a refused save wrote its outputs");
    assert_eq!(unsafe { latent_cache_save(cache, c_path.as_ptr()) }, Status::InvalidState, "{}", last_error());
    assert!(!path.exists(), "a refused save left a file");
    crate::common::check::assert_equal(cache, &model, "after refused saves");
    assert_eq!(unsafe { latent_cache_spec_round_commit(cache) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_save_to_buffer(cache, &mut out, &mut len) }, Status::Ok, "{}", last_error());
    let mut loaded: *mut Handle = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_load_from_buffer(out, len, &mut loaded) }, Status::Ok, "{}", last_error());
    model.round = None;
    crate::common::check::assert_equal(loaded, &model, "loaded after the commit");
    unsafe {
        latent_cache_bytes_free(out, len);
        latent_cache_free(loaded);
        latent_cache_free(cache);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
