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
use crate::core::persist::save::Contents;
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
    let state = cache.state()?;
    c.tensor_as(float_tensor(i, Family::Latent), state.latent.clone(), with_head_axis(&state.latent))?;
    c.tensor_as(float_tensor(i, Family::Rope), state.rope.clone(), with_head_axis(&state.rope))?;
    c.scalar(format!("{i}.0.0.2"), int_scalar(t), "scalar")?;
    c.scalar(format!("{i}.0.1"), string_array("KVCache"), "string")?;
    match &state.index_keys {
        Some(keys) => {
            let shape = with_head_axis(keys);
            let s = shape.iter().map(|&d| d as usize).collect::<Vec<_>>();
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

/// A prompt cache mlx-lm saved for a GLM-5-shaped model (batch rows without padding).
pub(super) fn import_mlx_lm(tensors: &HashMap<String, Array>, meta: &HashMap<String, String>) -> Result<Vec<LatentCache>> {
    let mut caches = Vec::new();
    for i in 0.. {
        let Some(class) = meta.get(&format!("1.{i}")) else { break };
        let (base, index_base) = match class.as_str() {
            "CacheList" => (format!("{i}.0.0"), Some(format!("{i}.1.0"))),
            "KVCache" => (format!("{i}"), None),
            other => return fail!(InvalidArgument, "layer {i} is an mlx-lm {other}, not a GLM-5 MLA cache"),
        };
        let get = |name: &str| tensors.get(name).ok_or_else(|| error!(InvalidArgument, "tensor {name} is missing"));
        let offset = ops::to_host(&ops::astype(get(&format!("{base}.2"))?, Dtype::Float32)?)?;
        let t = offset.first().copied().unwrap_or(-1.0);
        if t < 0.0 || t.fract() != 0.0 {
            return fail!(InvalidArgument, "layer {i}: offset {t} is not a position count");
        }
        let t = t as usize;
        let window = |name: &str| -> Result<Option<Array>> {
            let a = get(name)?;
            if a.ndim() == 1 && a.shape()[0] == 0 {
                return Ok(None);
            }
            let s = a.shape();
            if a.ndim() != 4 || s[1] != 1 || (s[2] as usize) < t {
                return fail!(InvalidArgument, "tensor {name} is {s:?}, not [B, 1, >= {t}, width]");
            }
            let part = ops::slice(a, &[0, 0, 0, 0], &[s[0] as usize, 1, t, s[3] as usize])?;
            Ok(Some(ops::reshape(&part, &[s[0] as usize, t, s[3] as usize])?))
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
        let rows = latent.shape()[0] as usize;
        let g = Geometry {
            kv_lora_rank: latent.shape()[2] as usize,
            rope_head_dim: rope.shape()[2] as usize,
            index_head_dim: keys.as_ref().map_or(0, |k| k.shape()[2] as usize),
            latent_storage: mode(&latent)?,
            rope_storage: mode(&rope)?,
            index_storage: keys.as_ref().map_or(Ok(StorageMode::F32), mode)?,
            ..Geometry::default()
        };
        g.validate()?;
        if rope.shape()[0] as usize != rows || keys.as_ref().is_some_and(|k| k.shape()[0] as usize != rows) {
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
