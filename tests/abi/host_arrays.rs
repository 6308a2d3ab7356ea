//! Host arrays of several element types, for engines without mlx-c: float32, bfloat16 and
//! float16 (as bit patterns) and int32 go in and come out exactly; conversions on the way out
//! round as the `half` crate's IEEE round-to-nearest-even does (the reference, no MLX); shape
//! and dtype queries answer for any array; bad calls are refused with nothing written; a
//! bfloat16 array made here is appended to a bfloat16 cache and reads back bit for bit.
use half::{bf16, f16};
use mlx_sys::mlx_array;

use crate::common::check::last_error;
use crate::common::model::Rng;
use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::host_arrays::*;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::storage::latent_cache_storage as S;

const F32: u32 = latent_cache_dtype::Float32 as u32;
const BF16: u32 = latent_cache_dtype::Bfloat16 as u32;
const F16: u32 = latent_cache_dtype::Float16 as u32;
const I32: u32 = latent_cache_dtype::Int32 as u32;

fn make<T>(data: &[T], dtype: u32, shape: &[usize]) -> mlx_array {
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let status = unsafe {
        latent_cache_array_from_host_typed(data.as_ptr().cast(), data.len(), dtype, shape.as_ptr(), shape.len(), &mut out)
    };
    assert_eq!(status, Status::Ok, "from_host_typed: {}", last_error());
    out
}

fn read<T: Copy + Default>(array: mlx_array, dtype: u32, len: usize) -> Vec<T> {
    let mut out = vec![T::default(); len];
    let mut written = 0;
    let status = unsafe { latent_cache_array_to_host_typed(array, dtype, out.as_mut_ptr().cast(), out.len(), &mut written) };
    assert_eq!(status, Status::Ok, "to_host_typed: {}", last_error());
    assert_eq!(written, len);
    out
}

fn shape_and_dtype(array: mlx_array) -> (Vec<usize>, u32) {
    let (mut ndim, mut dtype) = (0, 0);
    assert_eq!(unsafe { latent_cache_array_ndim(array, &mut ndim) }, Status::Ok);
    let mut shape = vec![usize::MAX; ndim];
    let mut written = 0;
    assert_eq!(unsafe { latent_cache_array_shape(array, shape.as_mut_ptr(), shape.len(), &mut written) }, Status::Ok);
    assert_eq!(written, ndim);
    assert_eq!(unsafe { latent_cache_array_dtype(array, &mut dtype) }, Status::Ok);
    (shape, dtype)
}

fn values(rng: &mut Rng, n: usize) -> Vec<f32> {
    // Magnitudes from 2^-20 to 2^12 with both signs: every rounding case of the 16-bit types
    // but overflow (float16's largest is 65504).
    (0..n).map(|_| (unit(rng) - 0.5) * 2f32.powi(rng.range(0, 32) as i32 - 20)).collect()
}

/// Uniform in `[0, 1)` with 24 random bits.
fn unit(rng: &mut Rng) -> f32 {
    (rng.next() >> 40) as f32 / (1u64 << 24) as f32
}

#[test]
fn every_host_type_goes_in_and_comes_out_exactly() {
    let mut rng = Rng::new(29);
    let x = values(&mut rng, 2 * 3 * 5);
    let shape = [2, 3, 5];

    let a = make(&x, F32, &shape);
    assert_eq!(shape_and_dtype(a), (shape.to_vec(), F32));
    assert_eq!(read::<f32>(a, F32, x.len()), x);

    let bits: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let b = make(&bits, BF16, &shape);
    assert_eq!(shape_and_dtype(b), (shape.to_vec(), BF16));
    assert_eq!(read::<u16>(b, BF16, x.len()), bits, "bfloat16 bits unchanged");
    let widened: Vec<f32> = bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    assert_eq!(read::<f32>(b, F32, x.len()), widened, "bfloat16 widens exactly");

    let bits16: Vec<u16> = x.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    let h = make(&bits16, F16, &[30]);
    assert_eq!(shape_and_dtype(h), (vec![30], F16));
    assert_eq!(read::<u16>(h, F16, x.len()), bits16);

    let ints: Vec<i32> = (0..12).map(|i| (i - 6) * 1_000_003).collect();
    let n = make(&ints, I32, &[4, 3]);
    assert_eq!(shape_and_dtype(n), (vec![4, 3], I32));
    assert_eq!(read::<i32>(n, I32, ints.len()), ints);
    for array in [a, b, h, n] {
        unsafe { latent_cache_array_free(array) };
    }
}

#[test]
fn conversions_on_the_way_out_round_to_nearest_even() {
    let mut rng = Rng::new(31);
    let x = values(&mut rng, 4096);
    let a = make(&x, F32, &[4096]);
    let want: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    assert_eq!(read::<u16>(a, BF16, x.len()), want, "float32 to bfloat16");
    let want: Vec<u16> = x.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
    assert_eq!(read::<u16>(a, F16, x.len()), want, "float32 to float16");
    let scaled: Vec<f32> = x.iter().map(|v| v * 1000.0).collect();
    let s = make(&scaled, F32, &[4096]);
    let want: Vec<i32> = scaled.iter().map(|&v| v as i32).collect();
    assert_eq!(read::<i32>(s, I32, x.len()), want, "float32 to int32 truncates toward zero");
    unsafe { latent_cache_array_free(a) };
    unsafe { latent_cache_array_free(s) };
}

#[test]
fn bad_calls_are_refused_and_write_nothing() {
    let x = [1f32, 2.0, 3.0, 4.0];
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let refuse = |status: Status, want: Status, what: &str| {
        assert_eq!(status, want, "{what}: {}", last_error());
        assert!(!last_error().is_empty());
    };
    let shape = [2usize, 2];
    let status = unsafe {
        latent_cache_array_from_host_typed(x.as_ptr().cast(), 4, latent_cache_dtype::Bool as u32, shape.as_ptr(), 2, &mut out)
    };
    refuse(status, Status::Dtype, "bool host data");
    let status = unsafe { latent_cache_array_from_host_typed(x.as_ptr().cast(), 4, 99, shape.as_ptr(), 2, &mut out) };
    refuse(status, Status::Dtype, "no such dtype");
    let status = unsafe { latent_cache_array_from_host_typed(x.as_ptr().cast(), 3, F32, shape.as_ptr(), 2, &mut out) };
    refuse(status, Status::Shape, "3 elements for 2x2");
    let status = unsafe { latent_cache_array_from_host_typed(x.as_ptr().cast(), 4, F32, shape.as_ptr(), 0, &mut out) };
    refuse(status, Status::Shape, "no extents");
    let status = unsafe { latent_cache_array_from_host_typed(std::ptr::null(), 4, F32, shape.as_ptr(), 2, &mut out) };
    refuse(status, Status::NullArgument, "NULL data");
    let status = unsafe { latent_cache_array_from_host_typed(x.as_ptr().cast(), usize::MAX, BF16, shape.as_ptr(), 2, &mut out) };
    refuse(status, Status::Shape, "a length beyond the address space");
    assert!(out.ctx.is_null(), "no array was handed out");

    let a = make(&x, F32, &shape);
    let mut small = [-1f32; 3];
    let mut written = 77;
    let status = unsafe { latent_cache_array_to_host_typed(a, F32, small.as_mut_ptr().cast(), 3, &mut written) };
    refuse(status, Status::BufferTooSmall, "3 of 4");
    assert!(last_error().contains("3 elements; 4"), "{}", last_error());
    assert_eq!((small, written), ([-1f32; 3], 77), "nothing written");
    let mut bits = [0u16; 4];
    let status = unsafe {
        latent_cache_array_to_host_typed(a, latent_cache_dtype::Uint8 as u32, bits.as_mut_ptr().cast(), 4, &mut written)
    };
    refuse(status, Status::Dtype, "uint8 out");
    let mut dims = [0usize; 1];
    let status = unsafe { latent_cache_array_shape(a, dims.as_mut_ptr(), 1, &mut written) };
    refuse(status, Status::BufferTooSmall, "one extent of two");
    assert_eq!((dims, written), ([0], 77));
    let empty = mlx_array { ctx: std::ptr::null_mut() };
    let mut d = 0;
    refuse(unsafe { latent_cache_array_dtype(empty, &mut d) }, Status::NullArgument, "no array");
    unsafe { latent_cache_array_free(a) };
}

#[test]
fn a_bfloat16_host_array_appends_to_a_bfloat16_cache_bit_for_bit() {
    let mut config = latent_cache_config_default();
    config.index_head_dim = 0;
    config.latent_storage = S::Bf16 as u32;
    config.rope_storage = S::Bf16 as u32;
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_new(&config, &mut cache) }, Status::Ok, "{}", last_error());
    let mut rng = Rng::new(7);
    let (tokens, widths) = (3usize, [512usize, 64]);
    let bits: Vec<Vec<u16>> =
        widths.iter().map(|&w| values(&mut rng, tokens * w).iter().map(|&v| bf16::from_f32(v).to_bits()).collect()).collect();
    let latent = make(&bits[0], BF16, &[1, tokens, widths[0]]);
    let rope = make(&bits[1], BF16, &[1, tokens, widths[1]]);
    let none = mlx_array { ctx: std::ptr::null_mut() };
    let (mut out_latent, mut out_rope) = (none, none);
    let status =
        unsafe { latent_cache_append_latent(cache, latent, rope, none, &mut out_latent, &mut out_rope, std::ptr::null_mut()) };
    assert_eq!(status, Status::Ok, "{}", last_error());
    assert_eq!(shape_and_dtype(out_latent), (vec![1, tokens, 512], BF16), "the view is the stored bfloat16");
    assert_eq!(read::<u16>(out_latent, BF16, tokens * 512), bits[0]);
    assert_eq!(read::<u16>(out_rope, BF16, tokens * 64), bits[1]);
    for array in [latent, rope, out_latent, out_rope] {
        unsafe { latent_cache_array_free(array) };
    }
    unsafe { latent_cache_free(cache) };
}
