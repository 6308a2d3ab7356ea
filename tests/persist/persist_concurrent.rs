//! Two saves to one path at once, through the C ABI, in both file formats (the seed's `.mlxbun`
//! and safetensors): two threads save two different sets (1x1000 and 1x3000 positions, float32)
//! to the same path at the same moment, round after round. Both saves succeed every round, the
//! file then loads and holds exactly one of the two sets (compared with the values appended), and
//! no temporary file is left beside it.
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;

use crate::common::check::{append_host, last_error};

use latent_cache::ffi::cache::latent_cache_read_row_host;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::mlxbun::{latent_cache_set_load_mlxbun, latent_cache_set_save_mlxbun};
use latent_cache::ffi::persist::{latent_cache_set_load, latent_cache_set_save};
use latent_cache::ffi::query::latent_cache_offset;
use latent_cache::ffi::set::{latent_cache_set, latent_cache_set_free, latent_cache_set_layer, latent_cache_set_new};
use latent_cache::ffi::{latent_cache as Cache, latent_cache_status as Status};

const LAYERS: usize = 2;
const RANK: usize = 64;
const ROPE: usize = 8;
const ROUNDS: usize = 12;

/// A set handle handed to a saving thread (the C ABI serializes calls on one set).
#[derive(Clone, Copy)]
struct Shared(*mut latent_cache_set);
unsafe impl Send for Shared {}

/// What was appended to a set: per layer, the latent and the rope of its one row.
struct Appended {
    set: *mut latent_cache_set,
    tokens: usize,
    values: Vec<(Vec<f32>, Vec<f32>)>,
}

fn layer(set: *mut latent_cache_set, i: usize) -> *mut Cache {
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut cache) }, Status::Ok);
    cache
}

/// A set of `LAYERS` float32 layers holding one row of `tokens` positions; every value tells
/// the set (`sign`), the layer, the position and the channel apart.
fn make_set(tokens: usize, sign: f32) -> Appended {
    let mut config = latent_cache_config_default();
    (config.kv_lora_rank, config.rope_head_dim, config.index_head_dim) = (RANK, ROPE, 0);
    let configs = [config; LAYERS];
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), LAYERS, &mut set) }, Status::Ok);
    let mut values = Vec::new();
    for l in 0..LAYERS {
        let value = |i: usize| sign * (1.0 + (l * 1_000_000 + i) as f32);
        let latent: Vec<f32> = (0..tokens * RANK).map(value).collect();
        let rope: Vec<f32> = (0..tokens * ROPE).map(|i| value(500_000 + i)).collect();
        let data = [latent, rope, Vec::new()];
        assert_eq!(append_host(layer(set, l), 1, tokens, &data), Status::Ok);
        let [latent, rope, _] = data;
        values.push((latent, rope));
    }
    Appended { set, tokens, values }
}

fn read_row(cache: *mut Cache, family: u32, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    let mut written = 0;
    assert_eq!(unsafe { latent_cache_read_row_host(cache, family, 0, out.as_mut_ptr(), len, &mut written) }, Status::Ok);
    assert_eq!(written, len);
    out
}

/// Which of `sets` the loaded `set` holds, every layer's values compared; panics if none.
fn which(set: *mut latent_cache_set, sets: &[&Appended], what: &str) -> usize {
    let mut offset = 0;
    assert_eq!(unsafe { latent_cache_offset(layer(set, 0), &mut offset) }, Status::Ok);
    let Some(k) = sets.iter().position(|s| s.tokens == offset) else {
        panic!("{what}: the file holds {offset} positions, neither set's");
    };
    for (l, (latent, rope)) in sets[k].values.iter().enumerate() {
        let cache = layer(set, l);
        let mut layer_offset = 0;
        assert_eq!(unsafe { latent_cache_offset(cache, &mut layer_offset) }, Status::Ok);
        assert_eq!(layer_offset, offset, "{what}: layer {l}");
        assert!(read_row(cache, 0, latent.len()) == *latent, "{what}: layer {l}'s latent is not the saved set's");
        assert!(read_row(cache, 1, rope.len()) == *rope, "{what}: layer {l}'s rope is not the saved set's");
    }
    k
}

type Save = unsafe fn(*mut latent_cache_set, &CString) -> Status;
type Load = unsafe fn(&CString, *mut *mut latent_cache_set) -> Status;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-concurrent-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// `ROUNDS` rounds of two threads saving `a` and `b` to one path at once, each round's file
/// loaded and compared.
fn race(format: &str, file: &str, save: Save, load: Load) {
    let dir = scratch(format);
    let path = dir.join(file);
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let (a, b) = (make_set(1000, 1.0), make_set(3000, -1.0));
    let mut seen = [0usize; 2];
    for round in 0..ROUNDS {
        let what = format!("{format}, round {round}");
        let barrier = Arc::new(Barrier::new(2));
        let savers: Vec<_> = [Shared(a.set), Shared(b.set)]
            .into_iter()
            .map(|set| {
                let (barrier, c_path) = (barrier.clone(), c_path.clone());
                thread::spawn(move || {
                    let set = set;
                    barrier.wait();
                    let rc = unsafe { save(set.0, &c_path) };
                    (rc, if rc == Status::Ok { String::new() } else { last_error() })
                })
            })
            .collect();
        for (k, saver) in savers.into_iter().enumerate() {
            let (rc, message) = saver.join().unwrap();
            assert_eq!(rc, Status::Ok, "{what}: save {k} failed: {message}");
        }
        let mut loaded = std::ptr::null_mut();
        assert_eq!(unsafe { load(&c_path, &mut loaded) }, Status::Ok, "{what}: the file does not load");
        seen[which(loaded, &[&a, &b], &what)] += 1;
        unsafe { latent_cache_set_free(loaded) };
        assert_eq!(entries(&dir), [file], "{what}: something other than the file is left in its folder");
    }
    eprintln!("{format}: the 1000-position set won {} rounds, the 3000-position set {}", seen[0], seen[1]);
    unsafe {
        latent_cache_set_free(a.set);
        latent_cache_set_free(b.set);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

unsafe fn save_mlxbun(set: *mut latent_cache_set, path: &CString) -> Status {
    unsafe { latent_cache_set_save_mlxbun(set, path.as_ptr(), std::ptr::null()) }
}

unsafe fn load_mlxbun(path: &CString, out: *mut *mut latent_cache_set) -> Status {
    unsafe { latent_cache_set_load_mlxbun(path.as_ptr(), out) }
}

unsafe fn save_safetensors(set: *mut latent_cache_set, path: &CString) -> Status {
    unsafe { latent_cache_set_save(set, path.as_ptr()) }
}

unsafe fn load_safetensors(path: &CString, out: *mut *mut latent_cache_set) -> Status {
    unsafe { latent_cache_set_load(path.as_ptr(), out) }
}

#[test]
fn two_threads_save_one_mlxbun_path() {
    race("mlxbun", "state.mlxbun", save_mlxbun, load_mlxbun);
}

#[test]
fn two_threads_save_one_safetensors_path() {
    race("safetensors", "state.safetensors", save_safetensors, load_safetensors);
}
