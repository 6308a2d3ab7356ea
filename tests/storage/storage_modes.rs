//! Storage modes through the C ABI, as an engine configures and reads them: the documented bytes
//! per token, refused combinations, accuracy against the float32 input within each mode's
//! documented bound, appends of bfloat16 / float16 arrays, the packed parts an engine hands to
//! MLX's quantized matmul, and merges across modes refused with nothing changed.
use crate::common::check::{append_host, assert_equal, last_error};
use crate::common::codec_ref::{error_bound, stored};
use crate::common::mlx_helpers::host;
use crate::common::model::{Model, Rng};

use latent_cache::core::mlx::ops;
use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::{latent_cache_config, latent_cache_config_default};
use latent_cache::ffi::query::*;
use latent_cache::ffi::rows::latent_cache_merge_rows;
use latent_cache::ffi::storage::latent_cache_storage as S;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use latent_cache::StorageMode;
use mlx_rs::{Array, Dtype};
use mlx_sys::mlx_array;

fn config(widths: [usize; 3], modes: [S; 3]) -> latent_cache_config {
    let mut cfg = latent_cache_config_default();
    (cfg.kv_lora_rank, cfg.rope_head_dim, cfg.index_head_dim) = (widths[0], widths[1], widths[2]);
    (cfg.latent_storage, cfg.rope_storage, cfg.index_storage) = (modes[0] as u32, modes[1] as u32, modes[2] as u32);
    cfg
}

fn new(cfg: &latent_cache_config) -> Result<*mut Handle, (Status, String)> {
    let mut cache = std::ptr::null_mut();
    match unsafe { latent_cache_new(cfg, &mut cache) } {
        Status::Ok => Ok(cache),
        status => Err((status, last_error())),
    }
}

fn mode(s: S) -> StorageMode {
    [StorageMode::F32, StorageMode::Bf16, StorageMode::F16, StorageMode::Q8, StorageMode::Q4, StorageMode::Fp8][s as usize]
}

fn bytes_per_token(cfg: &latent_cache_config) -> usize {
    let cache = new(cfg).unwrap();
    let mut bytes = 0;
    assert_eq!(unsafe { latent_cache_bytes_per_token(cache, &mut bytes) }, Status::Ok);
    unsafe { latent_cache_free(cache) };
    bytes
}

/// GLM-5.2, whole model: 78 layers of 512 + 64, index keys (128) on 21 of them.
fn glm_bytes_per_token(latent: S, rope: S, index: S) -> usize {
    let dsa = bytes_per_token(&config([512, 64, 128], [latent, rope, index]));
    let plain = bytes_per_token(&config([512, 64, 0], [latent, rope, index]));
    21 * dsa + 57 * plain
}

#[test]
fn bytes_per_token_is_the_documented_storage() {
    assert_eq!(glm_bytes_per_token(S::F32, S::F32, S::F32), 190_464);
    assert_eq!(glm_bytes_per_token(S::Bf16, S::Bf16, S::Bf16), 95_232);
    assert_eq!(glm_bytes_per_token(S::F16, S::F16, S::F16), 95_232);
    // Latent Q8: 512 code bytes + 8 groups x (bf16 scale + bf16 bias) = 544; rope bf16 128;
    // index keys Q8 128 + 2 x 4 = 136, or FP8 128 + 1 x 4 = 132.
    assert_eq!(glm_bytes_per_token(S::Q8, S::Bf16, S::Q8), 78 * (544 + 128) + 21 * 136);
    assert_eq!(glm_bytes_per_token(S::Q8, S::Bf16, S::Q8), 55_272);
    assert_eq!(glm_bytes_per_token(S::Q8, S::Bf16, S::Fp8), 55_188);
    // Latent Q4: 256 + 32 = 288.
    assert_eq!(glm_bytes_per_token(S::Q4, S::Bf16, S::Q8), 35_304);
    // A layer's own figure, whatever the index keys' mode on a layer without them.
    assert_eq!(bytes_per_token(&config([512, 64, 0], [S::Fp8, S::F16, S::Q4])), 512 + 4 * 4 + 128);
}

#[test]
fn modes_the_widths_cannot_hold_are_refused() {
    for (widths, modes, what) in [
        ([100, 64, 0], [S::Q4, S::F32, S::F32], "Q4 latent 100 wide"),
        ([512, 64, 0], [S::F32, S::Fp8, S::F32], "FP8 rope 64 wide"),
        ([512, 64, 96], [S::F32, S::F32, S::Q8], "Q8 index keys 96 wide"),
    ] {
        let (status, message) = new(&config(widths, modes)).unwrap_err();
        assert_eq!(status, Status::InvalidArgument, "{what}");
        assert!(message.contains("divisible"), "{what}: {message}");
    }
    let mut cfg = config([512, 64, 128], [S::F32; 3]);
    cfg.rope_storage = 6;
    let (status, message) = new(&cfg).unwrap_err();
    assert_eq!(status, Status::InvalidArgument);
    assert!(message.contains("rope_storage 6"), "{message}");
    let mut cfg = config([512, 64, 128], [S::F32; 3]);
    cfg.layout = 2;
    assert_eq!(new(&cfg).unwrap_err().0, Status::InvalidArgument);
    // The index keys' mode is not checked on a layer without them.
    let cache = new(&config([512, 64, 0], [S::F32, S::F32, S::Fp8])).unwrap();
    unsafe { latent_cache_free(cache) };
}

/// Gaussian values, and heavy-tailed ones (Gaussian over a Gaussian scale: rare large outliers).
fn samples(rng: &mut Rng, n: usize, heavy: bool) -> Vec<f32> {
    let mut normal = || {
        let (u, v) = ((rng.next() >> 11) as f64 / (1u64 << 53) as f64, (rng.next() >> 11) as f64 / (1u64 << 53) as f64);
        ((-2.0 * (u + 1e-300).ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    };
    (0..n).map(|_| if heavy { normal() * normal().exp() } else { normal() }).collect()
}

#[test]
fn every_mode_reads_back_its_definition_within_its_bound() {
    let widths = [256, 128, 128];
    let mut rng = Rng::new(11);
    for s in [S::F32, S::Bf16, S::F16, S::Q8, S::Q4, S::Fp8] {
        for heavy in [false, true] {
            let cache = new(&config(widths, [s; 3])).unwrap();
            let (batch, tokens) = (3, 17);
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| samples(&mut rng, batch * tokens * widths[f], heavy));
            assert_eq!(append_host(cache, batch, tokens, &data), Status::Ok, "{s:?}: {}", last_error());
            let mut model = Model::with_modes(widths, [mode(s); 3]);
            model.append(batch, tokens, &data);
            // Bit for bit: the mode's definition (rounding, E4M3 blocks, MLX's affine round trip).
            assert_equal(cache, &model, &format!("{s:?} heavy={heavy}"));
            // Within the documented bound of the float32 input, group by group.
            let group = mode(s).group_size().max(64);
            for f in 0..3 {
                let back: Vec<f32> = model.rows.iter().flat_map(|r| r.families[f].clone()).collect();
                let input: Vec<f32> =
                    (0..batch).flat_map(|b| data[f][b * tokens * widths[f]..][..tokens * widths[f]].to_vec()).collect();
                for (g_in, g_back) in input.chunks(group).zip(back.chunks(group)) {
                    let bound = error_bound(mode(s), g_in);
                    for (x, y) in g_in.iter().zip(g_back) {
                        assert!((x - y).abs() <= bound, "{s:?} heavy={heavy}: {x} read back as {y}, bound {bound}");
                    }
                }
            }
            unsafe { latent_cache_free(cache) };
        }
    }
}

fn shape(a: mlx_array) -> Vec<i32> {
    unsafe { std::slice::from_raw_parts(mlx_sys::mlx_array_shape(a), mlx_sys::mlx_array_ndim(a)).to_vec() }
}

fn dtype(a: mlx_array) -> Dtype {
    Dtype::try_from(unsafe { mlx_sys::mlx_array_dtype(a) }).unwrap()
}

/// Borrows a C-side array as an mlx-rs one (the caller keeps ownership).
fn borrowed(a: mlx_array) -> std::mem::ManuallyDrop<Array> {
    std::mem::ManuallyDrop::new(unsafe { Array::from_ptr(a) })
}

#[test]
fn packed_parts_are_what_mlx_dequantizes_to_the_state() {
    let widths = [256, 64, 128];
    let mut rng = Rng::new(5);
    for (s, parts, dtypes) in [
        (S::Bf16, [256, 0, 0], [Dtype::Bfloat16; 3]),
        (S::Q8, [64, 4, 4], [Dtype::Uint32, Dtype::Bfloat16, Dtype::Bfloat16]),
        (S::Q4, [32, 4, 4], [Dtype::Uint32, Dtype::Bfloat16, Dtype::Bfloat16]),
        (S::Fp8, [256, 2, 0], [Dtype::Uint8, Dtype::Float32, Dtype::Float32]),
    ] {
        let cache = new(&config(widths, [s, S::Bf16, S::F32])).unwrap();
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| samples(&mut rng, 2 * 5 * widths[f], false));
        assert_eq!(append_host(cache, 2, 5, &data), Status::Ok);
        let none = mlx_array { ctx: std::ptr::null_mut() };
        let mut packed = latent_cache_packed { storage: 99, bits: 0, group_size: 0, values: none, scales: none, biases: none };
        assert_eq!(unsafe { latent_cache_packed_state(cache, 0, &mut packed) }, Status::Ok, "{}", last_error());
        assert_eq!(packed.storage, s as u32);
        let m = mode(s);
        assert_eq!((packed.bits as usize, packed.group_size as usize), (m.bits(), m.group_size()));
        for (i, a) in [packed.values, packed.scales, packed.biases].into_iter().enumerate() {
            if parts[i] == 0 {
                assert!(a.ctx.is_null(), "{s:?} part {i} absent");
                continue;
            }
            assert_eq!(shape(a), [2, 5, parts[i]], "{s:?} part {i}");
            assert_eq!(dtype(a), dtypes[i], "{s:?} part {i}");
        }
        let mut latent = none;
        assert_eq!(unsafe { latent_cache_state(cache, &mut latent, std::ptr::null_mut(), std::ptr::null_mut()) }, Status::Ok);
        assert_eq!(dtype(latent), if s == S::Bf16 { Dtype::Bfloat16 } else { Dtype::Float32 }, "{s:?} state dtype");
        let state = host(&borrowed(latent));
        let (values, scales) = (borrowed(packed.values), borrowed(packed.scales));
        let decoded = match s {
            S::Q8 | S::Q4 => host(&ops::dequantize(&values, &scales, &borrowed(packed.biases), 64, packed.bits as i32).unwrap()),
            S::Fp8 => {
                let codes = ops::reshape(&ops::from_fp8(&values, Dtype::Float32).unwrap(), &[2, 5, 2, 128]).unwrap();
                host(&ops::multiply(&codes, &ops::reshape(&scales, &[2, 5, 2, 1]).unwrap()).unwrap())
            }
            _ => host(&values),
        };
        assert!(state == decoded, "{s:?}: state differs from the decoded packed parts");
        assert!(state == stored(m, 256, &data[0]), "{s:?}: state differs from the mode's definition");
        unsafe {
            latent_cache_array_free(latent);
            latent_cache_packed_release(&mut packed);
            latent_cache_packed_release(&mut packed); // a second release is harmless
            assert!(packed.values.ctx.is_null() && packed.scales.ctx.is_null() && packed.biases.ctx.is_null());
            latent_cache_free(cache);
        }
    }
}

#[test]
fn bf16_and_f16_arrays_are_appended_in_every_mode() {
    let widths = [128, 64, 0];
    let mut rng = Rng::new(9);
    for s in [S::F32, S::Bf16, S::F16, S::Q8, S::Q4] {
        for input in [Dtype::Bfloat16, Dtype::Float16] {
            let cache = new(&config(widths, [s, s, S::F32])).unwrap();
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| samples(&mut rng, 2 * 3 * widths[f], false));
            let arrays: Vec<Array> =
                (0..2).map(|f| ops::astype(&Array::from_slice(&data[f], &[2, 3, widths[f] as i32]), input).unwrap()).collect();
            let none = mlx_array { ctx: std::ptr::null_mut() };
            let status = unsafe {
                latent_cache_append_latent(
                    cache,
                    arrays[0].as_ptr(),
                    arrays[1].as_ptr(),
                    none,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(status, Status::Ok, "{s:?} from {input:?}: {}", last_error());
            // The cache holds the mode's encoding of the values the engine passed (already
            // rounded to the input's dtype).
            let passed: [Vec<f32>; 3] = std::array::from_fn(|f| if f < 2 { host(&arrays[f]) } else { Vec::new() });
            let mut model = Model::with_modes(widths, [mode(s), mode(s), StorageMode::F32]);
            model.append(2, 3, &passed);
            assert_equal(cache, &model, &format!("{s:?} from {input:?}"));
            unsafe { latent_cache_free(cache) };
        }
    }
}

#[test]
fn caches_of_different_modes_do_not_merge() {
    let widths = [128, 64, 128];
    let mut rng = Rng::new(3);
    let a = new(&config(widths, [S::Q8, S::Bf16, S::Q8])).unwrap();
    let b = new(&config(widths, [S::Q8, S::Bf16, S::Fp8])).unwrap();
    let data = crate::common::check::host_data(&mut rng, widths, 1, 4);
    for cache in [a, b] {
        assert_eq!(append_host(cache, 1, 4, &data), Status::Ok);
    }
    let dest = new(&config(widths, [S::Q8, S::Bf16, S::Q8])).unwrap();
    let sources = [a as *const Handle, b as *const Handle];
    let status = unsafe { latent_cache_merge_rows(dest, sources.as_ptr(), sources.len()) };
    assert_eq!(status, Status::InvalidArgument);
    let message = last_error();
    assert!(message.contains("q8/bf16/fp8") && message.contains("q8/bf16/q8"), "{message}");
    let mut batch = 9;
    assert_eq!(unsafe { latent_cache_batch_size(dest, &mut batch) }, Status::Ok);
    assert_eq!(batch, 0, "the refused merge left the destination empty");
    // Same modes merge, and the rows keep their encoded values.
    let sources = [a as *const Handle, a as *const Handle];
    assert_eq!(unsafe { latent_cache_merge_rows(dest, sources.as_ptr(), sources.len()) }, Status::Ok, "{}", last_error());
    let mut one = Model::with_modes(widths, [StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8]);
    one.append(1, 4, &data);
    assert_equal(dest, &Model::merge(&[&one, &one]), "merge of Q8 caches");
    unsafe {
        latent_cache_free(a);
        latent_cache_free(b);
        latent_cache_free(dest);
    }
}
