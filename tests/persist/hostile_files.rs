//! Hostile files at the file level, for both formats: sizes a file announces but cannot back
//! (a sparse file far beyond MLX's memory limit), paths that are not regular files (a FIFO, a
//! device, a folder), and bytes after the last tensor. Each is refused with a status, promptly,
//! and nothing is created.
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use latent_cache::core::persist::wyhash::wyhash;
use latent_cache::core::persist::{self, mlxbun};
use latent_cache::ffi::cache::latent_cache_free;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::mlxbun::{latent_cache_mlxbun_header, latent_cache_mlxbun_tokens, latent_cache_set_load_mlxbun};
use latent_cache::ffi::persist::{
    latent_cache_load, latent_cache_load_from_buffer, latent_cache_set_load, latent_cache_set_load_from_buffer,
};
use latent_cache::ffi::set::latent_cache_set_free;
use latent_cache::{ErrorKind, Geometry, LatentCache};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-hostile-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn c_path(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

/// A one-layer float32 cache of two rows of three positions.
fn one_layer() -> LatentCache {
    let g = Geometry { kv_lora_rank: 16, rope_head_dim: 8, ..Geometry::default() };
    let mut cache = LatentCache::new(g).unwrap();
    let latent: Vec<f32> = (0..2 * 3 * 16).map(|i| i as f32 * 0.25).collect();
    let rope: Vec<f32> = (0..2 * 3 * 8).map(|i| -(i as f32)).collect();
    cache.append_host(2, 3, &latent, &rope, None).unwrap();
    cache
}

/// Loads a set from a file of the seed's format through the C API: the status, and whether
/// `out` was left as it was (NULL) when refused.
fn load_mlxbun_file(path: &Path) -> Status {
    let path = c_path(path);
    let mut set = std::ptr::null_mut();
    let status = unsafe { latent_cache_set_load_mlxbun(path.as_ptr(), &mut set) };
    if status == Status::Ok {
        unsafe { latent_cache_set_free(set) };
    } else {
        assert!(set.is_null(), "a refused load wrote its output");
    }
    status
}

fn load_set_file(path: &Path) -> Status {
    let path = c_path(path);
    let mut set = std::ptr::null_mut();
    let status = unsafe { latent_cache_set_load(path.as_ptr(), &mut set) };
    if status == Status::Ok {
        unsafe { latent_cache_set_free(set) };
    } else {
        assert!(set.is_null(), "a refused load wrote its output");
    }
    status
}

fn load_cache_file(path: &Path) -> Status {
    let path = c_path(path);
    let mut cache = std::ptr::null_mut();
    let status = unsafe { latent_cache_load(path.as_ptr(), &mut cache) };
    if status == Status::Ok {
        unsafe { latent_cache_free(cache) };
    } else {
        assert!(cache.is_null(), "a refused load wrote its output");
    }
    status
}

fn load_cache_bytes(data: &[u8]) -> Status {
    let mut cache = std::ptr::null_mut();
    let status = unsafe { latent_cache_load_from_buffer(data.as_ptr(), data.len(), &mut cache) };
    if status == Status::Ok {
        unsafe { latent_cache_free(cache) };
    } else {
        assert!(cache.is_null(), "a refused load wrote its output");
    }
    status
}

fn load_set_bytes(data: &[u8]) -> Status {
    let mut set = std::ptr::null_mut();
    let status = unsafe { latent_cache_set_load_from_buffer(data.as_ptr(), data.len(), &mut set) };
    if status == Status::Ok {
        unsafe { latent_cache_set_free(set) };
    } else {
        assert!(set.is_null(), "a refused load wrote its output");
    }
    status
}

fn memory_limit() -> u64 {
    let mut bytes = 0usize;
    assert_eq!(unsafe { mlx_sys::mlx_get_memory_limit(&mut bytes) }, 0);
    bytes as u64
}

/// A file of the seed's format whose one `mla` cache (offset 2^25, rank 512, rope 64) announces
/// more bytes than MLX's memory limit allows, all of them inside the file: the file is made that
/// long, sparse, so no byte of it is stored. The header and its hash are valid; the tensors' hashes
/// cannot be (they are never reached).
#[test]
fn a_sparse_seed_file_beyond_the_memory_limit_is_refused_before_anything_is_allocated() {
    const ALIGN: u64 = 16384;
    let offset: u64 = 1 << 25;
    let per_row = offset * (512 + 64) * 4;
    let batch = memory_limit() / per_row + 1;
    let latent = batch * offset * 512 * 4;
    let rope = batch * offset * 64 * 4;
    let rope_at = latent.div_ceil(ALIGN) * ALIGN;
    let tensor = |off: u64, bytes: u64, width: u64| {
        format!(
            "{{\"off\":{off},\"bytes\":{bytes},\"shape\":[{batch},{offset},{width}],\"dtype\":10,\"hash\":\"0123456789abcdef\"}}"
        )
    };
    let header = format!(
        "{{\"formatVersion\":3,\"createdAt\":0,\"codecProvider\":\"mlx-cache-v3\",\"tokens\":[1,2],\"caches\":[\
         {{\"kind\":\"mla\",\"offset\":{offset},\"kvLoraRank\":512,\"ropeHeadDim\":64,\"maxTokens\":9007199254740991,\
         \"tensors\":[{},{}]}}]}}",
        tensor(0, latent, 512),
        tensor(rope_at, rope, 64)
    );
    let start = (26 + header.len() as u64).div_ceil(ALIGN) * ALIGN;
    let mut prefix = b"MLXBUNKV2\n".to_vec();
    prefix.extend((header.len() as u32).to_le_bytes());
    prefix.extend((start as u32).to_le_bytes());
    prefix.extend(wyhash(header.as_bytes(), 0).to_le_bytes());
    prefix.extend(header.as_bytes());
    let path = scratch("sparse.mlxkv");
    std::fs::write(&path, &prefix).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(start + rope_at + rope).unwrap();
    // The header alone is readable (its hash checks out): the refusal is about the tensors.
    let c = c_path(&path);
    let (mut tokens, mut written) = ([0u32; 4], 0usize);
    assert_eq!(unsafe { latent_cache_mlxbun_tokens(c.as_ptr(), tokens.as_mut_ptr(), 4, &mut written) }, Status::Ok);
    assert_eq!(&tokens[..written], &[1, 2]);
    assert_eq!(load_mlxbun_file(&path), Status::Capacity);
    std::fs::remove_file(&path).unwrap();
}

/// A safetensors file whose one tensor lies inside the file (made long and sparse) but holds
/// more than MLX's memory limit: refused before MLX allocates it. A header announcing a tensor
/// past the end of the bytes (a terabyte of data in a few bytes): refused as damaged, from a
/// file and from bytes.
#[test]
fn safetensors_sizes_past_the_end_or_beyond_the_memory_limit_are_refused() {
    let rows = memory_limit() / (1 << 20) + 1;
    let bytes = rows * (1 << 20);
    let mut header = format!("{{\"latent\":{{\"dtype\":\"F32\",\"shape\":[{rows},262144],\"data_offsets\":[0,{bytes}]}}}}");
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut prefix = (header.len() as u64).to_le_bytes().to_vec();
    prefix.extend(header.as_bytes());
    let path = scratch("sparse.safetensors");
    std::fs::write(&path, &prefix).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(prefix.len() as u64 + bytes).unwrap();
    assert_eq!(load_set_file(&path), Status::Capacity);
    std::fs::remove_file(&path).unwrap();

    let mut header = "{\"latent\":{\"dtype\":\"F32\",\"shape\":[1048576,262144],\"data_offsets\":[0,1099511627776]}}".to_string();
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 64]);
    assert_eq!(load_set_bytes(&bytes), Status::InvalidArgument);
    let path = scratch("past-the-end.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(load_set_file(&path), Status::InvalidArgument);
    std::fs::remove_file(&path).unwrap();
}

/// Runs `call` on a thread of its own; fails the test (instead of hanging it) unless it returns
/// within a few seconds. `unblock` is run first when it does not (so the thread can end).
fn promptly<T: Send + 'static>(what: &str, call: impl FnOnce() -> T + Send + 'static, unblock: impl FnOnce()) -> T {
    let (send, recv) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(call());
    });
    match recv.recv_timeout(Duration::from_secs(5)) {
        Ok(value) => value,
        Err(_) => {
            unblock();
            panic!("{what} did not return within 5 seconds");
        }
    }
}

/// Opens the FIFO's writing end (and closes it at once), so a reader blocked opening it goes on.
fn release_fifo(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path);
}

/// Every reader of both formats, through the C API, on `path`: each status (or a test failure
/// if one blocks).
fn every_reader(path: &Path) -> Vec<(&'static str, Status)> {
    type Reader = fn(&CString) -> Status;
    let readers: [(&str, Reader); 5] = [
        ("latent_cache_set_load_mlxbun", |p| {
            let mut set = std::ptr::null_mut();
            let s = unsafe { latent_cache_set_load_mlxbun(p.as_ptr(), &mut set) };
            assert!(set.is_null() || s == Status::Ok);
            s
        }),
        ("latent_cache_mlxbun_header", |p| {
            let (mut out, mut written) = ([0 as std::ffi::c_char; 64], 0usize);
            unsafe { latent_cache_mlxbun_header(p.as_ptr(), out.as_mut_ptr(), out.len(), &mut written) }
        }),
        ("latent_cache_mlxbun_tokens", |p| {
            let (mut out, mut written) = ([0u32; 8], 0usize);
            unsafe { latent_cache_mlxbun_tokens(p.as_ptr(), out.as_mut_ptr(), out.len(), &mut written) }
        }),
        ("latent_cache_set_load", |p| {
            let mut set = std::ptr::null_mut();
            let s = unsafe { latent_cache_set_load(p.as_ptr(), &mut set) };
            assert!(set.is_null() || s == Status::Ok);
            s
        }),
        ("latent_cache_load", |p| {
            let mut cache = std::ptr::null_mut();
            let s = unsafe { latent_cache_load(p.as_ptr(), &mut cache) };
            assert!(cache.is_null() || s == Status::Ok);
            s
        }),
    ];
    readers
        .into_iter()
        .map(|(name, read)| {
            let c = c_path(path);
            let fifo = path.to_path_buf();
            (name, promptly(&format!("{name} on {}", path.display()), move || read(&c), || release_fifo(&fifo)))
        })
        .collect()
}

/// A FIFO (whose open would wait for a writer), devices and a folder: every reader refuses
/// them, promptly.
#[test]
fn fifos_devices_and_folders_are_refused_promptly_by_every_reader() {
    let fifo = scratch("state.fifo");
    let c = c_path(&fifo);
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let dir = scratch("a-folder");
    std::fs::create_dir_all(&dir).unwrap();
    for path in [fifo.as_path(), Path::new("/dev/zero"), Path::new("/dev/null"), dir.as_path()] {
        for (name, status) in every_reader(path) {
            assert_eq!(status, Status::InvalidArgument, "{name} on {}", path.display());
        }
    }
    std::fs::remove_file(&fifo).unwrap();
    std::fs::remove_dir(&dir).unwrap();
}

/// What is appended to a valid file in the trailing-bytes tests: a few bytes (fewer than, as
/// many as and more than a header length field), a page, and a second copy of the file.
fn with_trailing(valid: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = [1usize, 7, 8, 4096]
        .into_iter()
        .map(|n| (format!("{n} bytes"), valid.iter().copied().chain((0..n).map(|i| i as u8)).collect()))
        .collect();
    out.push(("a second copy".to_string(), [valid, valid].concat()));
    out
}

#[test]
fn bytes_after_the_last_safetensors_tensor_are_refused() {
    let cache = one_layer();
    let valid = persist::save_to_bytes(&[&cache]).unwrap();
    assert_eq!(load_cache_bytes(&valid), Status::Ok, "the file as saved loads");
    let path = scratch("trailing.safetensors");
    for (what, bytes) in with_trailing(&valid) {
        assert_eq!(load_cache_bytes(&bytes), Status::InvalidArgument, "{what} after a cache (bytes)");
        assert_eq!(load_set_bytes(&bytes), Status::InvalidArgument, "{what} after a set (bytes)");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load_cache_file(&path), Status::InvalidArgument, "{what} after a cache (file)");
        assert_eq!(load_set_file(&path), Status::InvalidArgument, "{what} after a set (file)");
    }
    std::fs::write(&path, &valid).unwrap();
    assert_eq!(load_cache_file(&path), Status::Ok, "the file as saved loads");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn bytes_after_the_last_seed_tensor_are_refused() {
    let cache = one_layer();
    let info = mlxbun::MlxbunInfo { tokens: vec![7, 8, 9], ..Default::default() };
    let valid = mlxbun::save_to_bytes(&[&cache], &info).unwrap();
    assert!(mlxbun::load_from_bytes(&valid).is_ok(), "the file as saved loads");
    let path = scratch("trailing.mlxkv");
    for (what, bytes) in with_trailing(&valid) {
        assert_eq!(mlxbun::load_from_bytes(&bytes).err().map(|e| e.kind), Some(ErrorKind::InvalidArgument), "{what} (bytes)");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load_mlxbun_file(&path), Status::InvalidArgument, "{what} (file)");
    }
    std::fs::write(&path, &valid).unwrap();
    assert_eq!(load_mlxbun_file(&path), Status::Ok, "the file as saved loads");
    std::fs::remove_file(&path).unwrap();
}
