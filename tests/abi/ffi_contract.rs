//! The C ABI's contract, checked from Rust: rejected MLX-array inputs (dtype, rank, widths,
//! mismatched families) leave the cache unchanged with a message; every export runs inside the
//! panic boundary; the header's version macros match Cargo.toml.
use std::ffi::CStr;

use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::last_error::latent_cache_last_error;
use latent_cache::ffi::query::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_rs::Array;
use mlx_sys::mlx_array;

fn last_error() -> String {
    let mut buf = vec![0 as std::ffi::c_char; 512];
    let len = unsafe { latent_cache_last_error(buf.as_mut_ptr(), buf.len()) };
    assert!(len > 0, "a failed call leaves a message");
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

fn new_cache(index_head_dim: usize) -> *mut Handle {
    crate::common::check::new_cache([4, 2, index_head_dim], 0)
}

fn floats(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    Array::from_slice(&(0..n).map(|v| v as f32).collect::<Vec<_>>(), shape)
}

/// Everything observable: layout and every stored value of row 0.
fn snapshot(cache: *mut Handle) -> (usize, usize, Vec<f32>) {
    let (mut offset, mut batch) = (0, 0);
    unsafe {
        assert_eq!(latent_cache_offset(cache, &mut offset), Status::Ok);
        assert_eq!(latent_cache_batch_size(cache, &mut batch), Status::Ok);
    }
    let mut out = vec![0f32; batch * offset * 4];
    let mut written = 0;
    let status = unsafe { latent_cache_read_host(cache, 0, out.as_mut_ptr(), out.len(), &mut written) };
    assert_eq!(status, Status::Ok);
    (offset, batch, out)
}

#[test]
fn rejected_arrays_leave_the_cache_unchanged() {
    let cache = new_cache(3);
    let none = mlx_array { ctx: std::ptr::null_mut() };
    let (lat, rope, keys) = (floats(&[2, 3, 4]), floats(&[2, 3, 2]), floats(&[2, 3, 3]));
    let ok = unsafe {
        latent_cache_append_latent(
            cache,
            lat.as_ptr(),
            rope.as_ptr(),
            keys.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(ok, Status::Ok);
    let before = snapshot(cache);

    let ints = Array::from_slice(&[1i32; 8], &[2, 1, 4]);
    let rank2 = floats(&[2, 4]);
    let wide = floats(&[2, 1, 5]);
    let one_token_rope = floats(&[2, 1, 2]);
    let two_token_keys = floats(&[2, 2, 3]);
    let lat1 = floats(&[2, 1, 4]);
    let keys1 = floats(&[2, 1, 3]);
    let batch3 = floats(&[3, 1, 4]);
    let cases: Vec<(Status, mlx_array, mlx_array, mlx_array)> = vec![
        (Status::Dtype, ints.as_ptr(), one_token_rope.as_ptr(), keys1.as_ptr()),
        (Status::Shape, rank2.as_ptr(), one_token_rope.as_ptr(), keys1.as_ptr()),
        (Status::Shape, wide.as_ptr(), one_token_rope.as_ptr(), keys1.as_ptr()),
        (Status::Shape, lat1.as_ptr(), one_token_rope.as_ptr(), two_token_keys.as_ptr()),
        (Status::Shape, batch3.as_ptr(), one_token_rope.as_ptr(), keys1.as_ptr()),
        (Status::InvalidArgument, lat1.as_ptr(), one_token_rope.as_ptr(), none),
        (Status::NullArgument, none, one_token_rope.as_ptr(), keys1.as_ptr()),
    ];
    for (i, (want, l, r, k)) in cases.into_iter().enumerate() {
        let mut out = none;
        let status = unsafe { latent_cache_append_latent(cache, l, r, k, &mut out, std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(status, want, "case {i}: {}", last_error());
        assert!(!last_error().is_empty());
        assert!(out.ctx.is_null(), "case {i}: no output on failure");
        assert_eq!(snapshot(cache), before, "case {i} changed the cache");
    }
    unsafe { latent_cache_free(cache) };
}

#[test]
fn non_finite_values_are_stored_as_given() {
    let cache = new_cache(0);
    let latent = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
    let rope = [f32::MIN_POSITIVE / 2.0, f32::MAX];
    let status = unsafe { latent_cache_append_host(cache, 1, 1, latent.as_ptr(), 4, rope.as_ptr(), 2, std::ptr::null(), 0) };
    assert_eq!(status, Status::Ok);
    let (mut out, mut written) = ([0f32; 4], 0);
    assert_eq!(unsafe { latent_cache_read_row_host(cache, 0, 0, out.as_mut_ptr(), 4, &mut written) }, Status::Ok);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&out), bits(&latent));
    unsafe { latent_cache_free(cache) };
}

/// Every `extern "C" fn` in src/ffi must be one `ffi_boundary!` (the panic boundary).
#[test]
fn every_export_is_inside_the_panic_boundary() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/ffi");
    let mut exports = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        let mut rest = source.as_str();
        while let Some(at) = rest.find("extern \"C\" fn ") {
            rest = &rest[at..];
            let name: String =
                rest["extern \"C\" fn ".len()..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let body = &rest[rest.find('{').unwrap() + 1..];
            let first = body.trim_start();
            assert!(first.starts_with("ffi_boundary!"), "{name} in {} does not start with the panic boundary", path.display());
            if name.starts_with("latent_cache_") {
                exports += 1;
            }
            rest = body;
        }
    }
    assert!(exports >= 30, "found only {exports} exports");
}

#[test]
fn header_version_matches_the_crate() {
    let header = include_str!("../../include/latent_cache.h");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        header.contains(&format!("#define LATENT_CACHE_VERSION \"{version}\"")),
        "header version differs from Cargo.toml {version}"
    );
    let parts: Vec<&str> = version.split('.').collect();
    for (name, part) in ["MAJOR", "MINOR", "PATCH"].iter().zip(&parts) {
        assert!(header.contains(&format!("#define LATENT_CACHE_VERSION_{name} {part}\n")), "{name}");
    }
    let runtime = unsafe { CStr::from_ptr(latent_cache::ffi::version::latent_cache_version()) };
    assert_eq!(runtime.to_str().unwrap(), version);
}
