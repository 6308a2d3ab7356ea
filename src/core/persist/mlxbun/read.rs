//! Loading the seed's format: every cache entry of the verified header checked (kinds,
//! geometry, shapes, dtype, offsets inside the file, no overlaps; for version 5, each tensor's
//! block list), then every tensor read and checked against its hash (its blocks against their
//! names), and the caches built only when all pass.
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

use super::blocks::{self, is_block_name, MAX_BLOCKS};
use super::header::{field, info, read_header, uint, Header};
use super::{families, MlxbunInfo, CODEC_PROVIDER, FLOAT32, MAX_LAYERS, NO_LIMIT, PREFIX_LEN};
use crate::core::error::{error, fail, Result};
use crate::core::mlx::memory::check_alloc;
use crate::core::model::geometry::{Geometry, Role};
use crate::core::persist::file::open_regular;
use crate::core::persist::wyhash::tensor_hash;
use crate::core::LatentCache;

/// One tensor to read: where, how long, its batch and its hash; in version 5 its blocks
/// (names and lengths) instead of a place in the file.
struct Slot {
    at: u64,
    bytes: u64,
    batch: usize,
    hash: String,
    blocks: Vec<(String, u64)>,
}

/// A version 5 tensor's block list: names that are SHA-256 digests, lengths of at least one
/// byte adding up to the tensor's.
fn block_list(t: &Value, bytes: u64, what: &str) -> Result<Vec<(String, u64)>> {
    let list = field(t, "blocks", what)?.as_array().ok_or_else(|| error!(InvalidArgument, "{what}: blocks is not an array"))?;
    if list.len() as u64 > MAX_BLOCKS {
        return fail!(InvalidArgument, "{what}: {} blocks (at most {MAX_BLOCKS})", list.len());
    }
    let mut out = Vec::with_capacity(list.len());
    let mut sum = 0u64;
    for b in list {
        let name = field(b, "hash", what)?.as_str().unwrap_or("");
        if !is_block_name(name) {
            return fail!(InvalidArgument, "{what}: block name {name:?} is not 64 lowercase hex digits");
        }
        let len = uint(field(b, "bytes", what)?, &format!("{what} block bytes"))?;
        sum =
            sum.checked_add(len).filter(|_| len > 0).ok_or_else(|| error!(InvalidArgument, "{what}: a block of {len} bytes"))?;
        out.push((name.to_string(), len));
    }
    if sum != bytes {
        return fail!(InvalidArgument, "{what}: its blocks hold {sum} bytes, the tensor {bytes}");
    }
    Ok(out)
}

/// A layer as the header describes it, every field checked.
struct LayerPlan {
    geometry: Geometry,
    offset: usize,
    slots: Vec<Slot>,
}

fn plan_layer(i: usize, e: &Value, data_start: u64, file_len: u64, blocked: bool) -> Result<LayerPlan> {
    let what = format!("cache {i}");
    let kind = field(e, "kind", &what)?.as_str().unwrap_or("");
    let role = match kind {
        "mla" | "mla-dsa" => Role::Target,
        "mtp-mla" => Role::Mtp,
        other => {
            return fail!(InvalidArgument, "{what}: kind {other:?} is not an MLA kind this library holds (mla, mla-dsa, mtp-mla)")
        }
    };
    let dim = |key: &str| -> Result<usize> {
        let v = uint(field(e, key, &what)?, &format!("{what} {key}"))?;
        usize::try_from(v).map_err(|_| error!(InvalidArgument, "{what}: {key} {v} is too large"))
    };
    let index_head_dim = match (kind, e.get("dsaHeadDim")) {
        ("mla-dsa", Some(_)) => dim("dsaHeadDim")?,
        ("mla-dsa", None) => return fail!(InvalidArgument, "{what}: mla-dsa without dsaHeadDim"),
        (_, Some(_)) => return fail!(InvalidArgument, "{what}: {kind} with dsaHeadDim (only mla-dsa holds index keys)"),
        (_, None) => 0,
    };
    if kind == "mla-dsa" && index_head_dim == 0 {
        return fail!(InvalidArgument, "{what}: dsaHeadDim 0");
    }
    let max_tokens = match uint(field(e, "maxTokens", &what)?, &format!("{what} maxTokens"))? {
        NO_LIMIT => 0,
        m if m <= i32::MAX as u64 && m > 0 => usize::try_from(m).map_err(|_| error!(InvalidArgument, "{what}: maxTokens {m}"))?,
        m => return fail!(InvalidArgument, "{what}: maxTokens {m} (this library holds up to INT32_MAX, or no limit)"),
    };
    let geometry = Geometry {
        kv_lora_rank: dim("kvLoraRank")?,
        rope_head_dim: dim("ropeHeadDim")?,
        index_head_dim,
        max_tokens,
        role,
        ..Geometry::default()
    };
    geometry.validate().map_err(|mut err| {
        err.message = format!("{what}: {}", err.message);
        err
    })?;
    let offset = dim("offset")?;
    if offset == 0 || offset > i32::MAX as usize || (max_tokens != 0 && offset > max_tokens) {
        return fail!(InvalidArgument, "{what}: offset {offset} (1 to maxTokens {max_tokens})");
    }
    if let Some(m) = e.get("minimumReusableOffset") {
        // Float32 state is exact: every offset is reusable, so the value is checked, not kept.
        if uint(m, &format!("{what} minimumReusableOffset"))? > offset as u64 {
            return fail!(InvalidArgument, "{what}: minimumReusableOffset beyond its offset");
        }
    }
    let tensors =
        field(e, "tensors", &what)?.as_array().ok_or_else(|| error!(InvalidArgument, "{what}: tensors is not an array"))?;
    let widths = families(&geometry);
    if tensors.len() != widths.len() {
        return fail!(InvalidArgument, "{what}: {kind} has {} tensors, expected {}", tensors.len(), widths.len());
    }
    let mut slots = Vec::new();
    for ((family, width), t) in widths.into_iter().zip(tensors) {
        let what = format!("{what} {}", family.name());
        let shape: Vec<u64> = field(t, "shape", &what)?
            .as_array()
            .ok_or_else(|| error!(InvalidArgument, "{what}: shape is not an array"))?
            .iter()
            .map(|d| uint(d, &format!("{what} shape")))
            .collect::<Result<_>>()?;
        let batch = shape.first().copied().unwrap_or(0);
        if shape.len() != 3 || shape[1] != offset as u64 || shape[2] != width as u64 || batch == 0 || batch > 1 << 20 {
            return fail!(InvalidArgument, "{what}: shape {shape:?}, expected [B, {offset}, {width}]");
        }
        if slots.first().is_some_and(|s: &Slot| s.batch as u64 != batch) {
            return fail!(InvalidArgument, "{what}: batch {batch} differs from the latent's");
        }
        if uint(field(t, "dtype", &what)?, &format!("{what} dtype"))? != FLOAT32 {
            return fail!(InvalidArgument, "{what}: not float32 (dtype {})", t["dtype"]);
        }
        let bytes = uint(field(t, "bytes", &what)?, &format!("{what} bytes"))?;
        let want = batch.checked_mul(offset as u64).and_then(|n| n.checked_mul(width as u64)).and_then(|n| n.checked_mul(4));
        if want != Some(bytes) {
            return fail!(InvalidArgument, "{what}: {bytes} bytes for shape {shape:?}");
        }
        let off = uint(field(t, "off", &what)?, &format!("{what} off"))?;
        let hash = field(t, "hash", &what)?.as_str().unwrap_or("").to_string();
        let batch = usize::try_from(batch).map_err(|_| error!(InvalidArgument, "{what}: batch {batch}"))?;
        if blocked {
            // Version 5: the bytes are in block files; the header authenticates their order.
            if !hash.is_empty() {
                return fail!(InvalidArgument, "{what}: hash {hash:?} where a version 5 tensor has none");
            }
            let blocks = block_list(t, bytes, &what)?;
            slots.push(Slot { at: 0, bytes, batch, hash, blocks });
            continue;
        }
        let at = data_start.checked_add(off).filter(|at| at.checked_add(bytes).is_some_and(|end| end <= file_len));
        let Some(at) = at else {
            return fail!(InvalidArgument, "{what}: bytes {off}..+{bytes} lie outside the file");
        };
        if hash.len() != 16 || !hash.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) {
            return fail!(InvalidArgument, "{what}: hash {hash:?} is not 16 lowercase hex digits");
        }
        slots.push(Slot { at, bytes, batch, hash, blocks: Vec::new() });
    }
    Ok(LayerPlan { geometry, offset, slots })
}

/// Checks the whole header: version, codec provider, tokens, every cache entry. `by_path`: the
/// file was opened by its path, so version 5's blocks can be found beside it.
fn plan(h: &Header, file_len: u64, by_path: bool) -> Result<(Vec<LayerPlan>, MlxbunInfo)> {
    let json = &h.json;
    let blocked = match uint(field(json, "formatVersion", "header")?, "formatVersion")? {
        3 | 4 => false,
        5 if !by_path => {
            return fail!(
                InvalidArgument,
                "format version 5: its tensors lie in block files beside the manifest; load it by its path"
            )
        }
        5 => true,
        v => return fail!(InvalidArgument, "format version {v}: this library reads the seed's versions 3, 4 and 5"),
    };
    // A manifest is its frame and header alone (mlx-bun's data start is the header's end).
    let header_end = PREFIX_LEN + h.text.len() as u64;
    if blocked && (h.data_start != header_end || file_len != header_end) {
        return fail!(
            InvalidArgument,
            "{} bytes after the manifest's header (the file is damaged)",
            file_len.saturating_sub(header_end)
        );
    }
    match json.get("codecProvider") {
        None => {}
        Some(Value::String(p)) if p == CODEC_PROVIDER => {}
        Some(p) => return fail!(InvalidArgument, "codec provider {p}: this library reads {CODEC_PROVIDER}"),
    }
    let info = info(json)?;
    let caches = field(json, "caches", "header")?.as_array().ok_or_else(|| error!(InvalidArgument, "caches is not an array"))?;
    if caches.is_empty() || caches.len() > MAX_LAYERS {
        return fail!(InvalidArgument, "{} caches: a file holds 1 to {MAX_LAYERS}", caches.len());
    }
    let layers: Vec<LayerPlan> =
        caches.iter().enumerate().map(|(i, e)| plan_layer(i, e, h.data_start, file_len, blocked)).collect::<Result<_>>()?;
    // One request's state: every cache holds the same rows (as a set's layers must).
    let (batch, offset) = (layers[0].slots[0].batch, layers[0].offset);
    if let Some(i) = layers.iter().position(|l| l.slots[0].batch != batch || l.offset != offset) {
        return fail!(
            InvalidArgument,
            "cache {i} holds {} rows of {} positions but cache 0 holds {batch} of {offset}",
            layers[i].slots[0].batch,
            layers[i].offset
        );
    }
    let slots = || layers.iter().flat_map(|l| &l.slots);
    if blocked {
        let count: usize = slots().map(|s| s.blocks.len()).sum();
        if count as u64 > MAX_BLOCKS {
            return fail!(InvalidArgument, "{count} blocks in all (at most {MAX_BLOCKS})");
        }
    } else {
        // Tensors may not share bytes: a file cannot make the load hold more than it holds.
        let mut ranges: Vec<(u64, u64)> = slots().map(|s| (s.at, s.at + s.bytes)).collect();
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
            return fail!(InvalidArgument, "two tensors overlap in the file");
        }
        // The last tensor ends the file (as the seed writes it): bytes after it are damage.
        let end = ranges.last().map_or(0, |r| r.1);
        if end != file_len {
            return fail!(InvalidArgument, "{} bytes after the last tensor (the file is damaged)", file_len.saturating_sub(end));
        }
    }
    // Sizes are checked (inside the file, or listed in blocks); the caches they make must also
    // fit MLX's memory limit, checked before any tensor is read (a sparse file or a manifest can
    // announce more than memory holds).
    let total = slots().try_fold(0u64, |sum, s| sum.checked_add(s.bytes));
    check_alloc(total.and_then(|t| usize::try_from(t).ok()), "loading the file's caches")?;
    Ok((layers, info))
}

/// Reads, verifies and builds every layer (version 5's tensors from their blocks in `folder`);
/// any failure drops what was built.
fn build(r: &mut (impl Read + Seek), layers: Vec<LayerPlan>, folder: Option<&Path>) -> Result<Vec<LatentCache>> {
    let mut out = Vec::with_capacity(layers.len());
    for (i, layer) in layers.into_iter().enumerate() {
        let mut values = Vec::new();
        for slot in &layer.slots {
            // Allocated fallibly: a refusal, never an abort, should memory run out regardless.
            let len = usize::try_from(slot.bytes).map_err(|_| error!(Capacity, "cache {i}: a tensor of {} bytes", slot.bytes))?;
            let no_memory = || error!(Capacity, "cache {i}: {len} bytes for a tensor cannot be allocated");
            let mut bytes = Vec::new();
            bytes.try_reserve_exact(len).map_err(|_| no_memory())?;
            bytes.resize(len, 0u8);
            match (slot.blocks.is_empty(), folder) {
                (false, Some(folder)) => blocks::read_tensor(folder, &slot.blocks, &mut bytes).map_err(|mut e| {
                    e.message = format!("cache {i}: {}", e.message);
                    e
                })?,
                _ => {
                    r.seek(SeekFrom::Start(slot.at))
                        .and_then(|_| r.read_exact(&mut bytes))
                        .map_err(|e| error!(InvalidArgument, "cache {i}: reading a tensor: {e}"))?;
                    if tensor_hash(&bytes) != slot.hash {
                        return fail!(InvalidArgument, "cache {i}: a tensor does not match its hash (the file is damaged)");
                    }
                }
            }
            let mut floats = Vec::new();
            floats.try_reserve_exact(len / 4).map_err(|_| no_memory())?;
            floats.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())));
            drop(bytes);
            values.push(floats);
        }
        let mut cache = LatentCache::new(layer.geometry)?;
        let batch = layer.slots[0].batch;
        cache.append_host(batch, layer.offset, &values[0], &values[1], values.get(2).map(Vec::as_slice))?;
        out.push(cache);
    }
    Ok(out)
}

fn load_from(r: &mut (impl Read + Seek), file_len: u64, folder: Option<&Path>) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    let header = read_header(r, file_len)?;
    let (layers, info) = plan(&header, file_len, folder.is_some())?;
    Ok((build(r, layers, folder)?, info))
}

/// Loads a file the seed's implementation (or `save`) wrote: the header's hash, every field, and
/// every tensor's hash are checked, and nothing is returned unless all pass. Rows come back
/// right-justified, every row holding the layer's offset; the v4 attachments (the seed's MTP
/// draft state) are not read. The file is opened once, must be a regular file
/// (`file::open_regular`), and is read through that descriptor; the last tensor must end it,
/// and its tensors must fit MLX's memory limit (`CAPACITY`) before any is read. A version 5
/// manifest's tensors are read from `blocks/` beside it: each block a regular file of exactly
/// its listed length whose SHA-256 is its name (every block is hashed: the load reads each
/// byte twice).
pub fn load(path: &Path) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    let (mut file, len) = open_regular(path)?;
    load_from(&mut file, len, Some(&blocks::folder(path)))
}

/// `load` from bytes; a version 5 manifest is refused (its blocks are files beside it).
pub fn load_from_bytes(bytes: &[u8]) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    load_from(&mut std::io::Cursor::new(bytes), bytes.len() as u64, None)
}
