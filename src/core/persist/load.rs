//! Loading caches from a safetensors file: ours checked whole (version, checksums, geometry,
//! every tensor's shape and dtype, the rows) before any cache is made; a file mlx-lm wrote
//! imported (`mlx_lm.rs`).
use std::collections::HashMap;
use std::path::Path;

use mlx_rs::Array;

use crate::core::cache::LatentCache;
use crate::core::error::{error, fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::persist::checksum::metadata_checksum;
use crate::core::persist::contents::extents;
use crate::core::persist::hot::read_hot;
use crate::core::persist::metadata::{float_layer, parse_geometry, parse_list, FORMAT_VERSION, PREFIX};
use crate::core::persist::mlx_lm::{float_tensor, import_mlx_lm};
use crate::core::persist::mlx_read::{read_safetensors, read_safetensors_bytes};
use crate::core::persist::streamed::{of_read, Streamed};
use crate::core::storage::buffers::Storage;

/// Loads the caches saved in `path`, every check passed before any cache is made.
pub fn load(path: &Path) -> Result<Vec<LatentCache>> {
    let (tensors, metadata, streamed) = read_safetensors(path)?;
    load_read(tensors, metadata, streamed)
}

/// Loads from bytes a save wrote, read from memory (no temporary file).
pub fn load_from_bytes(bytes: &[u8]) -> Result<Vec<LatentCache>> {
    let (tensors, metadata, streamed) = read_safetensors_bytes(bytes)?;
    load_read(tensors, metadata, streamed)
}

/// The caches of a file's tensors and metadata, as read.
fn load_read(
    tensors: HashMap<String, Array>,
    metadata: HashMap<String, String>,
    streamed: HashMap<String, Streamed>,
) -> Result<Vec<LatentCache>> {
    // Any key of ours makes it our file: a damaged format key must not turn it into a foreign
    // (unchecked) one.
    if !metadata.keys().any(|k| k.starts_with(PREFIX)) {
        return import_mlx_lm(&tensors, &metadata);
    }
    match metadata.get(&format!("{PREFIX}format")) {
        Some(version) => load_ours(version, &tensors, &metadata, &streamed),
        None => fail!(InvalidArgument, "the file's format version is missing (the file is damaged)"),
    }
}

fn load_ours(
    version: &str,
    tensors: &HashMap<String, Array>,
    meta: &HashMap<String, String>,
    streamed: &HashMap<String, Streamed>,
) -> Result<Vec<LatentCache>> {
    let Some(version) = version.parse::<u32>().ok().filter(|v| (1..=FORMAT_VERSION).contains(v)) else {
        return fail!(InvalidArgument, "format version {version:?}: this library reads 1 to {FORMAT_VERSION}");
    };
    // The metadata and every tensor in the file must match their checksums before anything is
    // read from them.
    let meta_sum = meta.get(&format!("{PREFIX}meta_sum"));
    if meta_sum != Some(&metadata_checksum(meta.iter().map(|(k, v)| (k.as_str(), v.as_str())))) {
        return fail!(InvalidArgument, "the file's metadata does not match its checksum (the file is damaged)");
    }
    // Verifying the checksums reads every tensor into MLX's memory, where the loaded caches keep
    // them: all of it must fit under MLX's memory limit first.
    for (name, a) in tensors {
        if meta.get(&format!("{PREFIX}sum.{name}")) != Some(&of_read(a, version, streamed.get(name))?) {
            return fail!(InvalidArgument, "tensor {name} does not match its checksum (the file is damaged)");
        }
    }
    let get = |k: &str| meta.get(&format!("{PREFIX}{k}")).ok_or_else(|| error!(InvalidArgument, "metadata {k} is missing"));
    let layers: usize = get("layers")?.parse().map_err(|_| error!(InvalidArgument, "metadata layers is not a count"))?;
    if layers == 0 || layers > 4096 {
        return fail!(InvalidArgument, "a file of {layers} layers");
    }
    let tensor = |name: &str| -> Result<Array> {
        match tensors.get(name) {
            Some(a) => Ok(a.clone()),
            None => fail!(InvalidArgument, "tensor {name} is missing"),
        }
    };
    let mut plans = Vec::with_capacity(layers);
    for i in 0..layers {
        let mut g = parse_geometry(get(&format!("layer.{i}.geometry"))?)?;
        let (pads, ends) = (parse_list(get(&format!("layer.{i}.left_pad"))?)?, parse_list(get(&format!("layer.{i}.row_ends"))?)?);
        let positions: usize =
            get(&format!("layer.{i}.positions"))?.parse().map_err(|_| error!(InvalidArgument, "layer {i}: positions"))?;
        // MLX's extents are int32, and a layer holds at most its max_tokens.
        if positions > i32::MAX as usize || (g.max_tokens != 0 && positions > g.max_tokens) {
            return fail!(InvalidArgument, "layer {i}: {positions} positions (max_tokens {}, at most INT32_MAX)", g.max_tokens);
        }
        let layout = RowLayout::from_rows(g.layout, &pads, &ends, positions).map_err(|mut e| {
            e.message = format!("layer {i}: {}", e.message);
            e
        })?;
        let rows = pads.len();
        let families = Families::for_geometry(&g, |family, _| family);
        let parts = families.try_map(|family, _| -> Result<Vec<Array>> {
            let specs = Storage::part_specs(&g, family);
            let arrays: Vec<Array> = if float_layer(&g) {
                let name = float_tensor(i, family);
                let a = tensor(&name)?;
                if a.ndim() != 4 || a.shape()[1] != 1 {
                    return fail!(InvalidArgument, "tensor {name} is {:?}, not [B, 1, T, width]", a.shape());
                }
                let s = extents(&a);
                vec![ops::reshape(&a, &[s[0], s[2], s[3]])?]
            } else {
                (0..specs.len()).map(|k| tensor(&format!("latent_cache.{i}.{}.{k}", family.name()))).collect::<Result<_>>()?
            };
            if arrays.len() != specs.len() {
                return fail!(InvalidArgument, "layer {i}: {} has {} parts, not {}", family.name(), arrays.len(), specs.len());
            }
            for (a, spec) in arrays.iter().zip(&specs) {
                // Compared as counts, never narrowed to MLX's int32 extents.
                let want = [rows, positions, spec.width];
                if extents(a) != want || a.dtype() != spec.dtype {
                    return fail!(
                        InvalidArgument,
                        "layer {i}: {} is {:?} {:?}, expected {:?} {:?}",
                        family.name(),
                        a.shape(),
                        a.dtype(),
                        want,
                        spec.dtype
                    );
                }
            }
            Ok(arrays)
        })?;
        let hot = read_hot(i, &mut g, &layout, get, &tensor)?;
        plans.push((g, layout, rows, positions, parts, hot));
    }
    plans
        .into_iter()
        .map(|(g, layout, rows, positions, parts, hot)| {
            let mut cache = LatentCache::adopt(g, layout, Storage::from_parts(&g, rows, positions, parts));
            if let Some((bases, converted, values)) = hot {
                cache.adopt_hot(bases, converted, values);
            }
            Ok(cache)
        })
        .collect()
}
