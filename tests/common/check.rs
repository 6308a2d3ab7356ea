//! Small helpers shared by the thread, handle and memory tests: make a cache, append host data,
//! and check a cache against the reference model (tests/common/model.rs) through the C ABI.
#![allow(dead_code)]

use latent_cache::ffi::arrays::{latent_cache_array_from_host, latent_cache_array_from_host_shape};
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::last_error::latent_cache_last_error;
use latent_cache::ffi::query::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_sys::mlx_array;

use super::model::{Model, Rng};

/// A handle or array pointer moved between threads; the header allows handles to move.
#[derive(Clone, Copy, Debug)]
pub struct Shared<T>(pub T);
unsafe impl<T> Send for Shared<T> {}
unsafe impl<T> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    /// The value (a method, so closures capture the whole `Shared`, not the bare pointer).
    pub fn get(self) -> T {
        self.0
    }
}

pub fn new_cache(widths: [usize; 3], max_tokens: usize) -> *mut Handle {
    let mut cfg = latent_cache_config_default();
    cfg.kv_lora_rank = widths[0];
    cfg.rope_head_dim = widths[1];
    cfg.index_head_dim = widths[2];
    cfg.max_tokens = max_tokens;
    let mut cache = std::ptr::null_mut();
    let status = unsafe { latent_cache_new(&cfg, &mut cache) };
    assert_eq!(status, Status::Ok, "latent_cache_new: {}", last_error());
    cache
}

/// A cache of `widths` holding `batch` rows of `tokens` positions, and its model.
pub fn filled(widths: [usize; 3], batch: usize, tokens: usize, rng: &mut Rng) -> (*mut Handle, Model) {
    let cache = new_cache(widths, 0);
    let mut model = Model::new(widths);
    let data = host_data(rng, widths, batch, tokens);
    assert_eq!(append_host(cache, batch, tokens, &data), Status::Ok, "{}", last_error());
    model.append(batch, tokens, &data);
    (cache, model)
}

/// A `[1, tokens, width]` float32 array holding `data`, made through the C ABI.
pub fn host_array(data: &[f32], tokens: usize, width: usize) -> mlx_array {
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let status = unsafe { latent_cache_array_from_host(data.as_ptr(), data.len(), 1, tokens, width, &mut out) };
    assert_eq!(status, Status::Ok, "array_from_host: {}", last_error());
    out
}

/// A float32 array of `shape` holding `data`, made through the C ABI.
pub fn host_array_shaped(data: &[f32], shape: &[usize]) -> mlx_array {
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let status = unsafe { latent_cache_array_from_host_shape(data.as_ptr(), data.len(), shape.as_ptr(), shape.len(), &mut out) };
    assert_eq!(status, Status::Ok, "array_from_host_shape: {}", last_error());
    out
}

/// This thread's last error message.
pub fn last_error() -> String {
    let mut buf = vec![0 as std::ffi::c_char; 512];
    unsafe { latent_cache_last_error(buf.as_mut_ptr(), buf.len()) };
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// Random `[batch, tokens, width_f]` buffers for each family (empty for width 0).
pub fn host_data(rng: &mut Rng, widths: [usize; 3], batch: usize, tokens: usize) -> [Vec<f32>; 3] {
    std::array::from_fn(|f| rng.floats(batch * tokens * widths[f]))
}

pub fn append_host(cache: *mut Handle, batch: usize, tokens: usize, data: &[Vec<f32>; 3]) -> Status {
    let keys = if data[2].is_empty() { std::ptr::null() } else { data[2].as_ptr() };
    unsafe {
        latent_cache_append_host(
            cache,
            batch,
            tokens,
            data[0].as_ptr(),
            data[0].len(),
            data[1].as_ptr(),
            data[1].len(),
            keys,
            data[2].len(),
        )
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The cache must equal the model: batch, offset, row offsets, left padding, round state, and
/// every row's values of every family bit for bit.
pub fn assert_equal(cache: *const Handle, model: &Model, what: &str) {
    let (mut batch, mut offset, mut written) = (usize::MAX, usize::MAX, 0);
    assert_eq!(unsafe { latent_cache_batch_size(cache, &mut batch) }, Status::Ok, "batch_size ({what}): {}", last_error());
    assert_eq!(unsafe { latent_cache_offset(cache, &mut offset) }, Status::Ok, "offset ({what}): {}", last_error());
    assert_eq!(batch, model.rows.len(), "batch after {what}");
    assert_eq!(offset, model.offset(), "offset after {what}");
    let mut rows = vec![0usize; batch];
    assert_eq!(unsafe { latent_cache_row_offsets(cache, rows.as_mut_ptr(), batch, &mut written) }, Status::Ok);
    assert_eq!(rows, model.row_offsets(), "row_offsets after {what}");
    assert_eq!(unsafe { latent_cache_left_pad(cache, rows.as_mut_ptr(), batch, &mut written) }, Status::Ok);
    assert_eq!(rows, model.left_pad(), "left_pad after {what}");
    assert_eq!(unsafe { latent_cache_row_ends(cache, rows.as_mut_ptr(), batch, &mut written) }, Status::Ok);
    assert_eq!(rows, model.row_ends(), "row_ends after {what}");
    let mut in_round = false;
    assert_eq!(unsafe { latent_cache_in_spec_round(cache, &mut in_round) }, Status::Ok);
    assert_eq!(in_round, model.round.is_some(), "round after {what}");
    for (row, expected) in model.rows.iter().enumerate() {
        for f in 0..if model.widths[2] > 0 { 3 } else { 2 } {
            let want = &expected.families[f];
            let mut got = vec![0f32; want.len() + 1];
            let status = unsafe { latent_cache_read_row_host(cache, f as u32, row, got.as_mut_ptr(), got.len(), &mut written) };
            assert_eq!(status, Status::Ok, "read_row_host row {row} family {f} after {what}: {}", last_error());
            assert_eq!(written, want.len(), "row {row} family {f} length after {what}");
            assert!(bits(&got[..written]) == bits(want), "row {row} family {f} values differ after {what}");
        }
    }
}

/// An evaluated view `[B, T, width]` of family `f` must hold every row's valid positions
/// (`[left_pad[b], T)`) bit for bit; padding is unspecified. Reads through MLX's strides, so no
/// further MLX operation is involved.
pub fn assert_view(view: mlx_array, model: &Model, f: usize, what: &str) {
    let (w, batch, offset, pads) = (model.widths[f], model.rows.len(), model.offset(), model.left_pad());
    assert!(!view.ctx.is_null(), "family {f} view missing after {what}");
    unsafe {
        assert_eq!(mlx_sys::mlx_array_ndim(view), 3, "family {f} view rank after {what}");
        let shape = std::slice::from_raw_parts(mlx_sys::mlx_array_shape(view), 3);
        assert_eq!(shape, [batch as i32, offset as i32, w as i32], "family {f} view shape after {what}");
        if batch * offset * w == 0 {
            return;
        }
        let strides = std::slice::from_raw_parts(mlx_sys::mlx_array_strides(view), 3).to_vec();
        let data = mlx_sys::mlx_array_data_float32(view);
        assert!(!data.is_null(), "family {f} view has no data after {what}");
        for (b, row) in model.rows.iter().enumerate() {
            let want = &row.families[f];
            let got: Vec<f32> = (pads[b]..offset)
                .flat_map(|t| (0..w).map(move |c| (t, c)))
                .map(|(t, c)| *data.add(b * strides[0] + t * strides[1] + c * strides[2]))
                .collect();
            assert!(bits(&got) == bits(want), "family {f} view row {b} values differ after {what}");
        }
    }
}
