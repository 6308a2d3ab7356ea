//! mlx-lm's own prompt-cache layout (mlx-lm 0.32.2's `save_prompt_cache` for GLM-5): a float
//! layer written as its `CacheList(KVCache, KVCache)`, the tensor names a load reads back, and a
//! prompt cache mlx-lm itself saved imported (no metadata of ours).
use std::collections::HashMap;

use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::error::{error, fail, Result};
use crate::core::layout::row_layout::{LayoutKind, RowLayout};
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::model::storage_mode::StorageMode;
use crate::core::persist::contents::{extents, Contents};
use crate::core::storage::buffers::Storage;

fn int_scalar(value: usize) -> Array {
    Array::from_int(value as i32)
}

fn string_array(s: &str) -> Array {
    let codes: Vec<i32> = s.chars().map(|c| c as i32).collect();
    Array::from_slice(&codes, &[codes.len() as i32])
}

fn none_array() -> Array {
    Array::from_slice::<f32>(&[], &[0])
}

/// `[B, T, w]` -> `[B, 1, T, w]`, as mlx-lm's caches hold keys and values.
fn with_head_axis(a: &Array) -> Vec<i32> {
    let s = a.shape();
    vec![s[0], 1, s[1], s[2]]
}

/// Where a float layer's family lies: the latent as the first cache's keys, the rope key as its
/// values, the index keys as the second cache's keys.
pub(super) fn float_tensor(i: usize, family: Family) -> String {
    match family {
        Family::Latent => format!("{i}.0.0.0"),
        Family::Rope => format!("{i}.0.0.1"),
        Family::IndexKeys => format!("{i}.1.0.0"),
    }
}

/// Adds float layer `i` as mlx-lm lays it out: the families `[B, 1, T, width]`, zeros as the
/// index keys' values (as mlx-lm's indexer keeps them; an empty cache on a layer without index
/// keys), offsets as scalars, the class names.
pub(super) fn add_float_layer(c: &mut Contents, i: usize, cache: &LatentCache) -> Result<()> {
    let t = cache.offset();
    // Each family as stored, in its own mode: a composed family's compact values (its hot
    // positions ride along in the hot side, `hot.rs`), never the composed view in the hot dtype.
    let stored = |family: Family| -> Result<Array> {
        match cache.stored_parts(family)?.as_slice() {
            [values] => Ok(values.clone()),
            parts => fail!(Backend, "a float {} stored as {} parts", family.name(), parts.len()),
        }
    };
    let (latent, rope) = (stored(Family::Latent)?, stored(Family::Rope)?);
    let index_keys = cache.geometry().width(Family::IndexKeys).map(|_| stored(Family::IndexKeys)).transpose()?;
    c.tensor_as(float_tensor(i, Family::Latent), latent.clone(), with_head_axis(&latent))?;
    c.tensor_as(float_tensor(i, Family::Rope), rope.clone(), with_head_axis(&rope))?;
    c.scalar(format!("{i}.0.0.2"), int_scalar(t), "scalar")?;
    c.scalar(format!("{i}.0.1"), string_array("KVCache"), "string")?;
    match &index_keys {
        Some(keys) => {
            let shape = with_head_axis(keys);
            let s = extents(keys);
            c.tensor(format!("{i}.1.0.1"), ops::zeros(&s, keys.dtype())?)?;
            c.tensor_as(float_tensor(i, Family::IndexKeys), keys.clone(), shape)?;
            c.scalar(format!("{i}.1.0.2"), int_scalar(t), "scalar")?;
        }
        None => {
            c.scalar(format!("{i}.1.0.0"), none_array(), "none")?;
            c.scalar(format!("{i}.1.0.1"), none_array(), "none")?;
            c.scalar(format!("{i}.1.0.2"), int_scalar(0), "scalar")?;
        }
    }
    c.scalar(format!("{i}.1.1"), string_array("KVCache"), "string")?;
    c.metadata.push((format!("1.{i}"), "CacheList".into()));
    Ok(())
}

/// A cache's offset as mlx-lm saves it (a scalar, int32 in its files), read exactly: an
/// integer scalar from 0 to INT32_MAX (a float one only where it holds such an integer exactly).
fn offset_scalar(a: &Array) -> Option<usize> {
    if a.size() != 1 {
        return None;
    }
    let value = match a.dtype() {
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 => {
            let v = *ops::to_host(&ops::astype(a, Dtype::Float32).ok()?).ok()?.first()?;
            // Past 2^24 a float32 no longer holds every integer.
            (v >= 0.0 && v.fract() == 0.0 && v <= (1u32 << 24) as f32).then_some(v as i64)?
        }
        Dtype::Float64 | Dtype::Complex64 => return None,
        _ => ops::to_host_i64(a).ok()?.first().copied()?,
    };
    usize::try_from(value).ok().filter(|&t| t <= i32::MAX as usize)
}

/// A prompt cache mlx-lm saved for a GLM-5-shaped model (batch rows without padding).
pub(super) fn import_mlx_lm(tensors: &HashMap<String, Array>, meta: &HashMap<String, String>) -> Result<Vec<LatentCache>> {
    // Every tensor was checked against MLX's memory limit before it was read (`mlx_read`).
    let mut caches = Vec::new();
    for i in 0.. {
        let Some(class) = meta.get(&format!("1.{i}")) else { break };
        let (base, index_base) = match class.as_str() {
            "CacheList" => (format!("{i}.0.0"), Some(format!("{i}.1.0"))),
            "KVCache" => (format!("{i}"), None),
            other => return fail!(InvalidArgument, "layer {i} is an mlx-lm {other}, not a GLM-5 MLA cache"),
        };
        let get = |name: &str| tensors.get(name).ok_or_else(|| error!(InvalidArgument, "tensor {name} is missing"));
        let t = offset_scalar(get(&format!("{base}.2"))?)
            .ok_or_else(|| error!(InvalidArgument, "layer {i}: its offset is not a position count (0 to INT32_MAX)"))?;
        let window = |name: &str| -> Result<Option<Array>> {
            let a = get(name)?;
            let s = extents(a);
            if s == [0] {
                return Ok(None);
            }
            if s.len() != 4 || s[1] != 1 || s[2] < t {
                return fail!(InvalidArgument, "tensor {name} is {s:?}, not [B, 1, >= {t}, width]");
            }
            let part = ops::slice(a, &[0, 0, 0, 0], &[s[0], 1, t, s[3]])?;
            Ok(Some(ops::reshape(&part, &[s[0], t, s[3]])?))
        };
        let (Some(latent), Some(rope)) = (window(&format!("{base}.0"))?, window(&format!("{base}.1"))?) else {
            return fail!(InvalidArgument, "layer {i} holds no latent");
        };
        let keys = match &index_base {
            Some(b) => window(&format!("{b}.0"))?,
            None => None,
        };
        let mode = |a: &Array| match StorageMode::of_float_dtype(a.dtype()) {
            Some(mode) => Ok(mode),
            None => fail!(InvalidArgument, "layer {i}: a {:?} tensor is not a float cache", a.dtype()),
        };
        let rows = extents(&latent)[0];
        let g = Geometry {
            kv_lora_rank: extents(&latent)[2],
            rope_head_dim: extents(&rope)[2],
            index_head_dim: keys.as_ref().map_or(0, |k| extents(k)[2]),
            latent_storage: mode(&latent)?,
            rope_storage: mode(&rope)?,
            index_storage: keys.as_ref().map_or(Ok(StorageMode::F32), mode)?,
            ..Geometry::default()
        };
        g.validate()?;
        if extents(&rope)[0] != rows || keys.as_ref().is_some_and(|k| extents(k)[0] != rows) {
            return fail!(InvalidArgument, "layer {i}: families with different batch sizes");
        }
        let layout = RowLayout::from_rows(LayoutKind::RightJustified, &vec![0; rows], &vec![t; rows], t)?;
        let parts = Families { latent: vec![latent], rope: vec![rope], index_keys: keys.map(|k| vec![k]) };
        caches.push((g, layout, rows, t, parts));
    }
    if caches.is_empty() {
        return fail!(InvalidArgument, "the file holds neither this library's caches nor an mlx-lm prompt cache");
    }
    Ok(caches
        .into_iter()
        .map(|(g, layout, rows, t, parts)| LatentCache::adopt(g, layout, Storage::from_parts(&g, rows, t, parts)))
        .collect())
}
