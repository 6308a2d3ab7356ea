//! Saving caches as safetensors: what a save writes (tensors, our metadata, mlx-lm's layout for
//! float layers), sealed with checksums, to a file (through `file.rs`) or to bytes.
use std::path::Path;

use crate::core::cache::LatentCache;
use crate::core::error::{error, fail, Result};
use crate::core::mlx::eval::eval;
use crate::core::mlx::ops;
use crate::core::model::geometry::Family;
use crate::core::persist::checksum::{self, metadata_checksum, Hasher};
use crate::core::persist::contents::Contents;
use crate::core::persist::file;
use crate::core::persist::hot::add_hot;
use crate::core::persist::metadata::{describe, float_layer, list, FORMAT_VERSION, PLAIN_VERSION, PREFIX};
use crate::core::persist::mlx_lm::add_float_layer;
use crate::core::persist::mlx_read::mlx_path;
use crate::core::persist::safetensors;
use crate::core::persist::tensor_bytes;

fn add_layer(c: &mut Contents, i: usize, cache: &LatentCache) -> Result<()> {
    let g = cache.geometry();
    let t = cache.offset();
    c.metadata.push((format!("{PREFIX}layer.{i}.geometry"), describe(g)));
    c.metadata.push((format!("{PREFIX}layer.{i}.left_pad"), list(cache.left_pad())));
    c.metadata.push((format!("{PREFIX}layer.{i}.row_ends"), list(&cache.row_ends())));
    c.metadata.push((format!("{PREFIX}layer.{i}.positions"), t.to_string()));
    if !float_layer(g) {
        for family in Family::ALL {
            if g.width(family).is_some() {
                for (k, part) in cache.stored_parts(family)?.into_iter().enumerate() {
                    c.tensor(format!("latent_cache.{i}.{}.{k}", family.name()), part)?;
                }
            }
        }
        return Ok(());
    }
    add_float_layer(c, i, cache)
}

/// Refuses (`State`) to save layers with an operation open (see `LatentCache::check_saveable`).
pub(crate) fn check_at_rest(layers: &[&LatentCache]) -> Result<()> {
    for (i, cache) in layers.iter().enumerate() {
        cache.check_saveable().map_err(|mut e| {
            e.message = format!("layer {i}: {}", e.message);
            e
        })?;
    }
    Ok(())
}

/// Everything a save writes but the checksums: the tensors evaluated and laid out along their
/// innermost axis, the metadata; and the format version the checksums follow.
fn laid_out(layers: &[&LatentCache]) -> Result<(Contents, u32)> {
    check_at_rest(layers)?;
    // Rows over a shared prefix are written as they read (a copy made for the save).
    crate::core::cache::shared::with_copies(layers, laid_out_at_rest)
}

fn laid_out_at_rest(layers: &[&LatentCache]) -> Result<(Contents, u32)> {
    let mut c = Contents::default();
    let composed = layers.iter().any(|l| l.geometry.composed());
    let version = if composed { FORMAT_VERSION } else { PLAIN_VERSION };
    c.metadata.push((format!("{PREFIX}format"), version.to_string()));
    c.metadata.push((format!("{PREFIX}layers"), layers.len().to_string()));
    for (i, cache) in layers.iter().enumerate() {
        add_layer(&mut c, i, cache)?;
        add_hot(&mut c, i, cache)?;
    }
    // mlx-lm's scalar table, flattened as its tree_flatten writes it.
    c.metadata.push(("2.0".into(), String::new()));
    for (k, (name, kind)) in c.scalars.clone().into_iter().enumerate() {
        c.metadata.push((format!("2.{}.0", k + 1), name));
        c.metadata.push((format!("2.{}.1", k + 1), kind.into()));
    }
    eval(c.tensors.iter().map(|t| &t.array))?;
    // Runs must be contiguous along the innermost axis (broadcast zeros are not): lay those out.
    for t in c.tensors.iter_mut().filter(|t| !tensor_bytes::inner_contiguous(&t.array)) {
        t.array = ops::contiguous(&t.array)?;
        eval([&t.array])?;
    }
    Ok((c, version))
}

/// Adds each tensor's checksum (in tensor order) and the metadata's own checksum.
fn seal(c: &mut Contents, sums: Vec<String>) {
    let sums: Vec<(String, String)> =
        c.tensors.iter().zip(sums).map(|(t, sum)| (format!("{PREFIX}sum.{}", t.name), sum)).collect();
    c.metadata.extend(sums);
    let meta_sum = metadata_checksum(c.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    c.metadata.push((format!("{PREFIX}meta_sum"), meta_sum));
}

fn contents(layers: &[&LatentCache]) -> Result<Contents> {
    let (mut c, version) = laid_out(layers)?;
    let sums = c.tensors.iter().map(|t| checksum::evaluated(&t.array, &t.shape, version)).collect::<Result<Vec<_>>>()?;
    seal(&mut c, sums);
    Ok(c)
}

/// Writes `layers` to `path` through a new temporary file in the same folder, synced and
/// renamed over `path` (`file.rs`): a crash or a failed save never leaves a partial file under
/// the final name, and saves to one path at once each write whole files.
pub fn save(layers: &[&LatentCache], path: &Path) -> Result<()> {
    mlx_path(path)?;
    file::write_atomically(path, file::Access::Shared, |file| write_safetensors(layers, file, path))
}

/// Writes the file in one pass over the state: every tensor is hashed as it is written (while
/// its bytes are still in the cache), then the header is written again with the checksums. Its
/// length does not change: every checksum has 16 hex digits, and so have the placeholders.
fn write_safetensors(layers: &[&LatentCache], file: &mut std::fs::File, path: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let (mut c, version) = laid_out(layers)?;
    let unsealed = c.metadata.len();
    let placeholders = vec!["0".repeat(16); c.tensors.len()];
    seal(&mut c, placeholders);
    let mut hashers: Vec<Hasher> = c.tensors.iter().map(|t| Hasher::new(t.array.dtype(), &t.shape, version)).collect();
    let io = |e: std::io::Error| error!(Backend, "writing {}: {e}", path.display());
    let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut *file);
    let written = safetensors::write_with(&mut out, &c.tensors, &c.metadata, |i, run| hashers[i].update(run))?;
    out.flush().map_err(io)?;
    drop(out);
    c.metadata.truncate(unsealed);
    seal(&mut c, hashers.into_iter().map(Hasher::finish).collect());
    let header = safetensors::header(&c.tensors, &c.metadata)?;
    if header.len() != written {
        return fail!(Backend, "the header changed length when its checksums were written");
    }
    file.seek(SeekFrom::Start(8)).map_err(io)?;
    file.write_all(header.as_bytes()).map_err(io)
}

/// Saves to bytes, the same bytes a file holds.
pub fn save_to_bytes(layers: &[&LatentCache]) -> Result<Vec<u8>> {
    let c = contents(layers)?;
    let mut out = Vec::new();
    safetensors::write(&mut out, &c.tensors, &c.metadata)?;
    Ok(out)
}
