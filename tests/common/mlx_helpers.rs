//! Small helpers the tests share around MLX arrays and layer geometries (Rust API).
#![allow(dead_code)]

use latent_cache::core::mlx::{memory, ops};
use latent_cache::{Geometry, LayoutKind, StorageMode};
use mlx_rs::{Array, Dtype};

/// An array's values as float32 on the host, row-major (views and transposes through a
/// row-contiguous copy).
pub fn host(a: &Array) -> Vec<f32> {
    ops::to_host(&ops::contiguous(&ops::astype(a, Dtype::Float32).unwrap()).unwrap()).unwrap()
}

/// A float32 array of `shape` holding `v`.
pub fn array(v: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(v, &shape.iter().map(|&d| d as i32).collect::<Vec<_>>())
}

/// A layer of `widths` (latent, rope, index keys) in float32 storage.
pub fn geometry(widths: [usize; 3], layout: LayoutKind) -> Geometry {
    Geometry { kv_lora_rank: widths[0], rope_head_dim: widths[1], index_head_dim: widths[2], layout, ..Geometry::default() }
}

/// A layer of `widths` whose families are stored in `modes`.
pub fn geometry_in(widths: [usize; 3], modes: [StorageMode; 3], layout: LayoutKind) -> Geometry {
    Geometry { latent_storage: modes[0], rope_storage: modes[1], index_storage: modes[2], ..geometry(widths, layout) }
}

/// MLX's active memory once the buffers the last call dropped are released: on CUDA a buffer a
/// finished kernel used is released by the stream's completion, after the evaluation returns,
/// and on the CPU by its queue once the task has run, so the count is read once it has stopped
/// moving. (No synchronize here: evaluations run on the library's evaluation thread, whose
/// stream this thread does not own.)
pub fn released() -> usize {
    let mut last = usize::MAX;
    for _ in 0..100 {
        memory::clear_cache().unwrap();
        let now = memory::info().active;
        if now == last {
            return now;
        }
        last = now;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    last
}
