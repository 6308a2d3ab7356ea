//! Segments through the C ABI, as a client uses them: a 20-turn conversation on a set of two
//! float32 layers, a segment after each turn (files and buffers alternating), each segment's size
//! its turn's positions plus a bounded header; every turn restored from its chain holding exactly
//! the values appended (host reads); a set extended along its chain; the chain a set knows; a
//! segment's header read alone; refusals with their statuses, the set unchanged.
use std::ffi::{c_char, CString};

use crate::common::check::append_host;
use crate::common::model::Rng;

use latent_cache::ffi::cache::latent_cache_read_row_host;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::persist::latent_cache_bytes_free;
use latent_cache::ffi::segment::*;
use latent_cache::ffi::set::{latent_cache_set, latent_cache_set_free, latent_cache_set_layer, latent_cache_set_new};
use latent_cache::ffi::{latent_cache as Cache, latent_cache_status as Status};

const LAYERS: usize = 2;
const WIDTHS: [usize; 2] = [64, 16];

fn layer(set: *mut latent_cache_set, i: usize) -> *mut Cache {
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut cache) }, Status::Ok);
    cache
}

/// Every layer's latent and rope of row 0, read on the host.
fn read(set: *mut latent_cache_set) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for l in 0..LAYERS {
        for (family, width) in WIDTHS.into_iter().enumerate() {
            let mut buf = vec![0f32; 1 << 16];
            let mut written = 0;
            let rc =
                unsafe { latent_cache_read_row_host(layer(set, l), family as u32, 0, buf.as_mut_ptr(), buf.len(), &mut written) };
            assert_eq!(rc, Status::Ok);
            assert_eq!(written % width, 0);
            buf.truncate(written);
            out.push(buf);
        }
    }
    out
}

/// A buffer segment as the library handed it out (freed on drop).
struct Bytes(*mut u8, usize);

impl Bytes {
    fn slice(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0, self.1) }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        unsafe { latent_cache_bytes_free(self.0, self.1) };
    }
}

#[test]
fn a_client_snapshots_each_turn_and_restores_any() {
    let dir = std::env::temp_dir().join(format!("latent-cache-segments-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(99);
    let configs = [latent_cache_config_default(); LAYERS].map(|mut c| {
        (c.kv_lora_rank, c.rope_head_dim, c.index_head_dim) = (WIDTHS[0], WIDTHS[1], 0);
        c
    });
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), LAYERS, &mut set) }, Status::Ok);
    let per_position = LAYERS * (WIDTHS[0] + WIDTHS[1]) * 4;
    let (mut paths, mut buffers, mut states, mut digests) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    for turn in 0..20 {
        let tokens = rng.range(1, 30);
        for l in 0..LAYERS {
            let data = [rng.floats(tokens * WIDTHS[0]), rng.floats(tokens * WIDTHS[1]), Vec::new()];
            assert_eq!(append_host(layer(set, l), 1, tokens, &data), Status::Ok);
        }
        let key = format!("tokens-hash-{turn}");
        let path = CString::new(dir.join(format!("{turn}.seg")).to_str().unwrap()).unwrap();
        let (mut digest, mut bytes, mut len) = (0u64, std::ptr::null_mut(), 0usize);
        let rc = unsafe {
            latent_cache_set_save_segment(set, 0, at, at + tokens, key.as_ptr(), key.len(), path.as_ptr(), &mut digest)
        };
        assert_eq!(rc, Status::Ok, "turn {turn}");
        let size = std::fs::metadata(path.to_str().unwrap()).unwrap().len() as usize;
        assert!(size >= tokens * per_position && size - tokens * per_position <= 4096, "turn {turn}: {size} bytes");
        // The same range again is off the chain the set knows now (it ends at `at + tokens`).
        if turn > 0 {
            let rc = unsafe {
                latent_cache_set_save_segment_to_buffer(
                    set,
                    0,
                    at,
                    at + tokens,
                    key.as_ptr(),
                    key.len(),
                    &mut bytes,
                    &mut len,
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, Status::InvalidState, "turn {turn}: a save off the known chain");
        }
        let (mut row, mut positions, mut known) = (9, 0, 0);
        assert_eq!(unsafe { latent_cache_set_segment_chain(set, &mut row, &mut positions, &mut known) }, Status::Ok);
        assert_eq!((row, positions, known), (0, at + tokens, digest));
        let mut info = latent_cache_segment_info::default();
        let mut key_out = vec![0u8; 64];
        assert_eq!(
            unsafe { latent_cache_segment_read_info(path.as_ptr(), &mut info, key_out.as_mut_ptr(), key_out.len()) },
            Status::Ok
        );
        assert_eq!((info.from, info.to, info.digest, info.n_layers), (at, at + tokens, digest, LAYERS));
        assert_eq!(info.previous_digest, digests.last().copied().unwrap_or(0));
        assert_eq!(&key_out[..info.key_len], key.as_bytes());
        let file = std::fs::read(path.to_str().unwrap()).unwrap();
        buffers.push(file);
        paths.push(path);
        digests.push(digest);
        states.push(read(set));
        at += tokens;
    }
    for k in [0, 6, 13, 19] {
        let list: Vec<*const c_char> = paths[..=k].iter().map(|p| p.as_ptr()).collect();
        let mut restored = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_load_segments(list.as_ptr(), list.len(), &mut restored) }, Status::Ok);
        assert!(read(restored) == states[k], "turn {k} from files");
        let data: Vec<*const u8> = buffers[..=k].iter().map(|b| b.as_ptr()).collect();
        let lens: Vec<usize> = buffers[..=k].iter().map(Vec::len).collect();
        let mut from_bytes = std::ptr::null_mut();
        assert_eq!(
            unsafe { latent_cache_set_load_segments_from_buffers(data.as_ptr(), lens.as_ptr(), k + 1, &mut from_bytes) },
            Status::Ok
        );
        assert!(read(from_bytes) == states[k], "turn {k} from buffers");
        // Extended to the last turn with the whole chain (only the segments it lacks are read).
        let all: Vec<*const c_char> = paths.iter().map(|p| p.as_ptr()).collect();
        let mut appended = 0;
        assert_eq!(unsafe { latent_cache_set_extend_segments(restored, all.as_ptr(), all.len(), &mut appended) }, Status::Ok);
        assert_eq!(appended, 19 - k);
        assert!(read(restored) == states[19], "turn {k} extended");
        // A gap is refused, the set unchanged.
        if k < 18 {
            let gap = [paths[k + 2].as_ptr()];
            assert_eq!(
                unsafe { latent_cache_set_extend_segments(from_bytes, gap.as_ptr(), 1, std::ptr::null_mut()) },
                Status::InvalidArgument
            );
            assert!(read(from_bytes) == states[k], "turn {k}: a refused extension changed the set");
        }
        unsafe {
            latent_cache_set_free(restored);
            latent_cache_set_free(from_bytes);
        }
    }
    // A segment as bytes, and its header read from them; a key buffer too small is refused.
    let (mut bytes, mut len) = (std::ptr::null_mut(), 0usize);
    let rc = unsafe {
        latent_cache_set_save_segment_to_buffer(set, 0, 0, 5, b"k".as_ptr(), 1, &mut bytes, &mut len, std::ptr::null_mut())
    };
    assert_eq!(rc, Status::Ok);
    let segment = Bytes(bytes, len);
    let mut info = latent_cache_segment_info::default();
    let rc =
        unsafe { latent_cache_segment_read_info_from_buffer(segment.slice().as_ptr(), len, &mut info, std::ptr::null_mut(), 0) };
    assert_eq!((rc, info.from, info.to, info.key_len, info.previous_digest), (Status::Ok, 0, 5, 1, 0));
    let mut small = [0u8; 0];
    let rc =
        unsafe { latent_cache_segment_read_info_from_buffer(segment.slice().as_ptr(), len, &mut info, small.as_mut_ptr(), 0) };
    assert_eq!(rc, Status::BufferTooSmall);
    unsafe { latent_cache_set_free(set) };
}
