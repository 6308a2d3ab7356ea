//! Writing the seed's format: what it can hold checked first, the JSON header in mlx-bun's key
//! order with every tensor's offset and hash, then the tensors at their aligned offsets; to a
//! file through the one atomic writer (`persist/file.rs`) or to bytes. Version 5 (`save_blocks`)
//! writes each tensor's blocks, then the manifest: the header listing them.
use std::io::{BufWriter, Write};
use std::path::Path;

use super::blocks::{self, DEFAULT_BLOCK_BYTES, MAX_BLOCK_BYTES};
use super::{align_up, families, kind, MlxbunInfo, ALIGN, CODEC_PROVIDER, FLOAT32, MAGIC, MAX_LAYERS, NO_LIMIT, PREFIX_LEN};
use crate::core::error::{error, fail, Result};
use crate::core::model::geometry::Family;
use crate::core::persist::file::{write_atomically, Access};
use crate::core::persist::json;
use crate::core::persist::wyhash::{tensor_hash, wyhash};
use crate::core::LatentCache;
use crate::core::StorageMode;

/// A layer's family as mlx-bun stores it: `[B, offset, width]` float32 little-endian.
fn tensor_bytes(layer: &LatentCache, family: Family) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for row in 0..layer.batch_size() {
        out.extend(layer.read_row(family, row)?.iter().flat_map(|v| v.to_le_bytes()));
    }
    Ok(out)
}

/// Whether mlx-bun can hold `layer`: float32 storage, rows of one length without padding.
fn check_savable(i: usize, layer: &LatentCache) -> Result<()> {
    // A file holds a cache at rest (no round, padded prefill or maintenance open).
    layer.check_saveable().map_err(|mut e| {
        e.message = format!("layer {i}: {}", e.message);
        e
    })?;
    let g = layer.geometry();
    let modes = [g.latent_storage, g.rope_storage].into_iter().chain((g.index_head_dim > 0).then_some(g.index_storage));
    if modes.into_iter().any(|m| m != StorageMode::F32) {
        return fail!(InvalidArgument, "layer {i}: the seed's cache files hold float32 storage only");
    }
    if layer.batch_size() == 0 || layer.offset() == 0 {
        return fail!(InvalidArgument, "layer {i} holds no positions (the seed's format cannot hold an empty cache)");
    }
    if layer.row_offsets().iter().any(|&len| len != layer.offset()) {
        return fail!(
            InvalidArgument,
            "layer {i}: rows of different lengths {:?} (the seed's format keeps one offset per layer; extract rows first)",
            layer.row_offsets()
        );
    }
    Ok(())
}

/// How a header lists each tensor's bytes: version 3 hashes them (the bytes follow the header),
/// version 5 writes them as blocks into `folder` and lists those.
enum Listing<'a> {
    Hashed,
    Blocks { folder: &'a Path, block_bytes: usize },
}

/// Whether a file can hold `layers`: 1 to `MAX_LAYERS` of them, each `check_savable`.
fn check_file(layers: &[&LatentCache]) -> Result<()> {
    if layers.is_empty() || layers.len() > MAX_LAYERS {
        return fail!(InvalidArgument, "{} layers: a file holds 1 to {MAX_LAYERS}", layers.len());
    }
    for (i, layer) in layers.iter().enumerate() {
        check_savable(i, layer)?;
    }
    Ok(())
}

/// The JSON header, keys in mlx-bun's order, with each tensor's offset and hash, or its blocks
/// (every tensor is read once here, and for version 3 again when written, so one layer's values
/// are in memory at a time).
fn header(layers: &[&LatentCache], info: &MlxbunInfo, listing: &Listing) -> Result<String> {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let version = match listing {
        Listing::Hashed => 3,
        Listing::Blocks { .. } => 5,
    };
    let mut h = format!("{{\"formatVersion\":{version},\"createdAt\":{created}");
    for (key, value) in [
        ("modelId", &info.model_id),
        ("configFingerprint", &info.config_fingerprint),
        ("tokenizerHash", &info.tokenizer_hash),
        ("ns", &info.ns),
    ] {
        if let Some(v) = value {
            h += &format!(",\"{key}\":{}", json::string(v));
        }
    }
    let tokens: Vec<String> = info.tokens.iter().map(u32::to_string).collect();
    h += &format!(",\"codecProvider\":\"{CODEC_PROVIDER}\",\"tokens\":[{}],\"caches\":[", tokens.join(","));
    let mut cursor = 0u64;
    for (i, layer) in layers.iter().enumerate() {
        let g = layer.geometry();
        let max_tokens = if g.max_tokens == 0 { NO_LIMIT } else { g.max_tokens as u64 };
        let dsa = if g.index_head_dim > 0 { format!(",\"dsaHeadDim\":{}", g.index_head_dim) } else { String::new() };
        let mut slots = Vec::new();
        for (family, width) in families(g) {
            let bytes = tensor_bytes(layer, family)?;
            let off = align_up(cursor);
            cursor = off + bytes.len() as u64;
            let listed = match listing {
                Listing::Hashed => format!("\"hash\":\"{}\"", tensor_hash(&bytes)),
                Listing::Blocks { folder, block_bytes } => {
                    blocks::write_tensor(folder, &bytes, bytes.len() / layer.batch_size(), *block_bytes)?
                }
            };
            slots.push(format!(
                "{{\"off\":{off},\"bytes\":{},\"shape\":[{},{},{width}],\"dtype\":{FLOAT32},{listed}}}",
                bytes.len(),
                layer.batch_size(),
                layer.offset(),
            ));
        }
        h += &format!(
            "{}{{\"kind\":\"{}\",\"offset\":{},\"kvLoraRank\":{},\"ropeHeadDim\":{}{dsa},\"maxTokens\":{max_tokens},\"tensors\":[{}]}}",
            if i == 0 { "" } else { "," },
            kind(g),
            layer.offset(),
            g.kv_lora_rank,
            g.rope_head_dim,
            slots.join(",")
        );
    }
    Ok(h + "]}")
}

/// Writes `layers` in the seed's layout to `out`.
fn write_to(out: &mut impl Write, layers: &[&LatentCache], info: &MlxbunInfo) -> Result<()> {
    // Rows over a shared prefix are written as they read (a copy made for the save).
    crate::core::cache::shared::with_copies(layers, |layers| write_copied(out, layers, info))
}

/// The frame before the data: the magic, the header's length, where the data starts, the
/// header's hash, then the header.
fn framed(header: &str, data_start: u64) -> Result<Vec<u8>> {
    if data_start > u32::MAX as u64 {
        return fail!(InvalidArgument, "the header ({} bytes) is too large for the seed's format", header.len());
    }
    let mut prefix = Vec::with_capacity(PREFIX_LEN as usize + header.len());
    prefix.extend_from_slice(MAGIC);
    prefix.extend_from_slice(&(header.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&(data_start as u32).to_le_bytes());
    prefix.extend_from_slice(&wyhash(header.as_bytes(), 0).to_le_bytes());
    prefix.extend_from_slice(header.as_bytes());
    Ok(prefix)
}

fn write_copied(out: &mut impl Write, layers: &[&LatentCache], info: &MlxbunInfo) -> Result<()> {
    let header = header(layers, info, &Listing::Hashed)?;
    let data_start = align_up(PREFIX_LEN + header.len() as u64);
    let io = |e: std::io::Error| error!(Backend, "writing the cache file: {e}");
    out.write_all(&framed(&header, data_start)?).map_err(io)?;
    let mut at = PREFIX_LEN + header.len() as u64;
    let zeros = vec![0u8; ALIGN as usize];
    for layer in layers {
        for (family, _) in families(layer.geometry()) {
            let bytes = tensor_bytes(layer, family)?;
            let start = data_start + align_up(at.max(data_start) - data_start);
            out.write_all(&zeros[..(start - at) as usize]).map_err(io)?;
            out.write_all(&bytes).map_err(io)?;
            at = start + bytes.len() as u64;
        }
    }
    Ok(())
}

/// Saves `layers` (a model's caches, in its layer order) as the seed's implementation does:
/// to a new temporary file beside `path` (mode 0600 where files have modes; `file.rs`), synced,
/// then renamed over it, so saves to one path at once each leave a whole file.
/// Refused, with nothing written, for storage other than float32, padded or uneven rows, or an
/// empty layer.
pub fn save(layers: &[&LatentCache], info: &MlxbunInfo, path: &Path) -> Result<()> {
    check_file(layers)?;
    write_atomically(path, Access::Private, |file| {
        let mut out = BufWriter::new(file);
        write_to(&mut out, layers, info)?;
        out.flush().map_err(|e| error!(Backend, "writing {}: {e}", path.display()))
    })
}

/// Saves `layers` as the seed's block layout (format version 5) does: each tensor's blocks of
/// `block_bytes` (0: mlx-bun's default, 1 MiB; rounded down to whole float32 values), cut per
/// batch row, written to `blocks/<sha256>` beside `path` unless a block of that name is there
/// already, then the manifest written atomically to `path` (as `save`). A save after the rows
/// grew writes only the blocks that changed: those of the new positions and each row's last,
/// partial block. Refused as `save` is, and for a block size above `MAX_BLOCK_BYTES`; blocks
/// written before a failure stay in the folder, unnamed by any manifest (the seed's collector
/// removes such blocks).
pub fn save_blocks(layers: &[&LatentCache], info: &MlxbunInfo, path: &Path, block_bytes: usize) -> Result<()> {
    let block_bytes = match block_bytes {
        0 => DEFAULT_BLOCK_BYTES,
        b if b <= MAX_BLOCK_BYTES => b,
        b => return fail!(InvalidArgument, "blocks of {b} bytes: at most {MAX_BLOCK_BYTES}"),
    };
    check_file(layers)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if path.file_name().is_none() || !dir.is_dir() {
        return fail!(Backend, "cannot write {}: it names no file in an existing folder", path.display());
    }
    let folder = blocks::make_folder(path)?;
    crate::core::cache::shared::with_copies(layers, |layers| {
        let header = header(layers, info, &Listing::Blocks { folder: &folder, block_bytes })?;
        let manifest = framed(&header, PREFIX_LEN + header.len() as u64)?;
        write_atomically(path, Access::Private, |file| {
            file.write_all(&manifest).map_err(|e| error!(Backend, "writing {}: {e}", path.display()))
        })
    })
}

/// Saves to bytes (the same layout as a file), refused as `save` is (a file of no layers or of
/// more than a reader takes included).
pub fn save_to_bytes(layers: &[&LatentCache], info: &MlxbunInfo) -> Result<Vec<u8>> {
    check_file(layers)?;
    let mut out = Vec::new();
    write_to(&mut out, layers, info)?;
    Ok(out)
}
