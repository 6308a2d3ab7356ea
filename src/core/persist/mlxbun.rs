//! The seed's own prompt-cache files (mlx-bun's persistence, magic `MLXBUNKV2\n`, format version 3
//! as its `CACHE_CODECS` "mlx-cache-v3" write it) for the MLA kinds `mla`, `mla-dsa` and
//! `mtp-mla`, so a prompt cache written by the seed's implementation for GLM-5.2 loads here and
//! ours loads there.
//!
//! Layout: the magic, a u32 header length, a u32 data start and a u64 `Bun.hash` (wyhash) of the
//! JSON header, all little-endian; the JSON header at byte 26; zeros up to the data start (a
//! multiple of 16 KiB); each tensor at the data start plus its `off` (16 KiB-aligned), float32
//! `[B, offset, width]` row-major, hashed in the header as 16 hex digits. mlx-bun keeps one offset
//! per layer and no padding, so only caches whose rows all hold the same positions are written;
//! its float32-only caches mean only float32 storage is written.
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::Value;

use crate::core::error::{error, fail, Result};
use crate::core::model::geometry::{Family, Geometry, Role};
use crate::core::persist::file::{write_atomically, Access};
use crate::core::persist::json;
use crate::core::persist::wyhash::{tensor_hash, wyhash};
use crate::core::LatentCache;
use crate::core::StorageMode;

const MAGIC: &[u8; 10] = b"MLXBUNKV2\n";
const PREFIX_LEN: u64 = 26;
const ALIGN: u64 = 16384;
const CODEC_PROVIDER: &str = "mlx-cache-v3";
/// mlx-c's `MLX_FLOAT32`, as mlx-bun records a tensor's dtype.
const FLOAT32: u64 = 10;
/// `Number.MAX_SAFE_INTEGER`: mlx-bun's `maxTokens` of a cache without a limit (our 0).
const NO_LIMIT: u64 = 9_007_199_254_740_991;
/// Headers beyond this are refused before they are read (a damaged length field).
const MAX_HEADER: u64 = 1 << 30;
const MAX_LAYERS: usize = 4096;

/// What a file says besides the caches: the token prefix the state encodes, and the identity
/// strings mlx-bun's server checks before it reuses a file (left out when `None`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MlxbunInfo {
    pub tokens: Vec<u32>,
    pub model_id: Option<String>,
    pub config_fingerprint: Option<String>,
    pub tokenizer_hash: Option<String>,
    /// The adapter namespace; mlx-bun's SSD tier expects the key, `""` for the base model.
    pub ns: Option<String>,
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

fn kind(g: &Geometry) -> &'static str {
    match (g.role, g.index_head_dim) {
        (Role::Mtp, _) => "mtp-mla",
        (_, 0) => "mla",
        _ => "mla-dsa",
    }
}

fn families(g: &Geometry) -> Vec<(Family, usize)> {
    let mut f = vec![(Family::Latent, g.kv_lora_rank), (Family::Rope, g.rope_head_dim)];
    if g.index_head_dim > 0 {
        f.push((Family::IndexKeys, g.index_head_dim));
    }
    f
}

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

/// The JSON header, keys in mlx-bun's order, with each tensor's offset and hash (every tensor is
/// read once here to hash it, and again when written, so one layer's values are in memory at a
/// time).
fn header(layers: &[&LatentCache], info: &MlxbunInfo) -> Result<String> {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let mut h = format!("{{\"formatVersion\":3,\"createdAt\":{created}");
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
            slots.push(format!(
                "{{\"off\":{off},\"bytes\":{},\"shape\":[{},{},{width}],\"dtype\":{FLOAT32},\"hash\":\"{}\"}}",
                bytes.len(),
                layer.batch_size(),
                layer.offset(),
                tensor_hash(&bytes)
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
    let header = header(layers, info)?;
    let data_start = align_up(PREFIX_LEN + header.len() as u64);
    if data_start > u32::MAX as u64 {
        return fail!(InvalidArgument, "the header ({} bytes) is too large for the seed's format", header.len());
    }
    let io = |e: std::io::Error| error!(Backend, "writing the cache file: {e}");
    let mut prefix = Vec::with_capacity(PREFIX_LEN as usize);
    prefix.extend_from_slice(MAGIC);
    prefix.extend_from_slice(&(header.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&(data_start as u32).to_le_bytes());
    prefix.extend_from_slice(&wyhash(header.as_bytes(), 0).to_le_bytes());
    out.write_all(&prefix).map_err(io)?;
    out.write_all(header.as_bytes()).map_err(io)?;
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
    if layers.is_empty() || layers.len() > MAX_LAYERS {
        return fail!(InvalidArgument, "{} layers: a file holds 1 to {MAX_LAYERS}", layers.len());
    }
    for (i, layer) in layers.iter().enumerate() {
        check_savable(i, layer)?;
    }
    write_atomically(path, Access::Private, |file| {
        let mut out = BufWriter::new(file);
        write_to(&mut out, layers, info)?;
        out.flush().map_err(|e| error!(Backend, "writing {}: {e}", path.display()))
    })
}

/// Saves to bytes (the same layout as a file).
pub fn save_to_bytes(layers: &[&LatentCache], info: &MlxbunInfo) -> Result<Vec<u8>> {
    for (i, layer) in layers.iter().enumerate() {
        check_savable(i, layer)?;
    }
    let mut out = Vec::new();
    write_to(&mut out, layers, info)?;
    Ok(out)
}

/// A verified header: the JSON and where the data starts.
struct Header {
    json: Value,
    text: String,
    data_start: u64,
}

fn read_header(r: &mut impl Read, file_len: u64) -> Result<Header> {
    let mut prefix = [0u8; PREFIX_LEN as usize];
    r.read_exact(&mut prefix).map_err(|_| error!(InvalidArgument, "too short to be a cache file of the seed's format"))?;
    if &prefix[..10] != MAGIC {
        return fail!(
            InvalidArgument,
            "not a cache file of the seed's format (magic {:?})",
            String::from_utf8_lossy(&prefix[..10])
        );
    }
    let header_len = u32::from_le_bytes(prefix[10..14].try_into().unwrap()) as u64;
    let data_start = u32::from_le_bytes(prefix[14..18].try_into().unwrap()) as u64;
    let hash = u64::from_le_bytes(prefix[18..26].try_into().unwrap());
    if header_len > MAX_HEADER || data_start < PREFIX_LEN + header_len || PREFIX_LEN + header_len > file_len {
        return fail!(InvalidArgument, "damaged header fields (length {header_len}, data start {data_start})");
    }
    let mut text = vec![0u8; header_len as usize];
    r.read_exact(&mut text).map_err(|_| error!(InvalidArgument, "the file ends inside its header"))?;
    if wyhash(&text, 0) != hash {
        return fail!(InvalidArgument, "the header does not match its hash (the file is damaged)");
    }
    let text = String::from_utf8(text).map_err(|_| error!(InvalidArgument, "the header is not UTF-8"))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| error!(InvalidArgument, "the header is not JSON: {e}"))?;
    if !json.is_object() {
        return fail!(InvalidArgument, "the header is not a JSON object");
    }
    Ok(Header { json, text, data_start })
}

fn uint(v: &Value, what: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| error!(InvalidArgument, "{what} is not a non-negative integer"))
}

fn field<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a Value> {
    v.get(key).ok_or_else(|| error!(InvalidArgument, "{what}: {key} is missing"))
}

/// The header's info (tokens and identity strings).
fn info(h: &Value) -> Result<MlxbunInfo> {
    let tokens = field(h, "tokens", "header")?
        .as_array()
        .ok_or_else(|| error!(InvalidArgument, "tokens is not an array"))?
        .iter()
        .map(|t| {
            uint(t, "a token").and_then(|t| u32::try_from(t).map_err(|_| error!(InvalidArgument, "token {t} exceeds 32 bits")))
        })
        .collect::<Result<Vec<u32>>>()?;
    let text = |key: &str| -> Result<Option<String>> {
        match h.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => fail!(InvalidArgument, "{key} is not a string"),
        }
    };
    Ok(MlxbunInfo {
        tokens,
        model_id: text("modelId")?,
        config_fingerprint: text("configFingerprint")?,
        tokenizer_hash: text("tokenizerHash")?,
        ns: text("ns")?,
    })
}

/// One tensor to read: where, how long, its batch and its hash.
struct Slot {
    at: u64,
    bytes: u64,
    batch: usize,
    hash: String,
}

/// A layer as the header describes it, every field checked.
struct LayerPlan {
    geometry: Geometry,
    offset: usize,
    slots: Vec<Slot>,
}

fn plan_layer(i: usize, e: &Value, data_start: u64, file_len: u64) -> Result<LayerPlan> {
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
        m if m <= i32::MAX as u64 && m > 0 => m as usize,
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
        let at = data_start.checked_add(off).filter(|at| at.checked_add(bytes).is_some_and(|end| end <= file_len));
        let Some(at) = at else {
            return fail!(InvalidArgument, "{what}: bytes {off}..+{bytes} lie outside the file");
        };
        let hash = field(t, "hash", &what)?.as_str().unwrap_or("").to_string();
        if hash.len() != 16 || !hash.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) {
            return fail!(InvalidArgument, "{what}: hash {hash:?} is not 16 lowercase hex digits");
        }
        slots.push(Slot { at, bytes, batch: batch as usize, hash });
    }
    Ok(LayerPlan { geometry, offset, slots })
}

/// Checks the whole header: version, codec provider, tokens, every cache entry.
fn plan(h: &Header, file_len: u64) -> Result<(Vec<LayerPlan>, MlxbunInfo)> {
    let json = &h.json;
    match uint(field(json, "formatVersion", "header")?, "formatVersion")? {
        3 | 4 => {}
        5 => return fail!(InvalidArgument, "format version 5 (the seed's block layout, tensors in a blocks folder) is not read"),
        v => return fail!(InvalidArgument, "format version {v}: this library reads the seed's versions 3 and 4"),
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
        caches.iter().enumerate().map(|(i, e)| plan_layer(i, e, h.data_start, file_len)).collect::<Result<_>>()?;
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
    // Tensors may not share bytes: a file cannot make the load hold more than it holds.
    let mut ranges: Vec<(u64, u64)> = layers.iter().flat_map(|l| l.slots.iter().map(|s| (s.at, s.at + s.bytes))).collect();
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[1].0 < w[0].1) {
        return fail!(InvalidArgument, "two tensors overlap in the file");
    }
    Ok((layers, info))
}

/// Reads, verifies and builds every layer; any failure drops what was built.
fn build(r: &mut (impl Read + Seek), layers: Vec<LayerPlan>) -> Result<Vec<LatentCache>> {
    let mut out = Vec::with_capacity(layers.len());
    for (i, layer) in layers.into_iter().enumerate() {
        let mut values = Vec::new();
        for slot in &layer.slots {
            let mut bytes = vec![0u8; slot.bytes as usize];
            r.seek(SeekFrom::Start(slot.at))
                .and_then(|_| r.read_exact(&mut bytes))
                .map_err(|e| error!(InvalidArgument, "cache {i}: reading a tensor: {e}"))?;
            if tensor_hash(&bytes) != slot.hash {
                return fail!(InvalidArgument, "cache {i}: a tensor does not match its hash (the file is damaged)");
            }
            values.push(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<f32>>());
        }
        let mut cache = LatentCache::new(layer.geometry)?;
        let batch = layer.slots[0].batch;
        cache.append_host(batch, layer.offset, &values[0], &values[1], values.get(2).map(Vec::as_slice))?;
        out.push(cache);
    }
    Ok(out)
}

fn load_from(r: &mut (impl Read + Seek), file_len: u64) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    let header = read_header(r, file_len)?;
    let (layers, info) = plan(&header, file_len)?;
    Ok((build(r, layers)?, info))
}

/// Loads a file the seed's implementation (or `save`) wrote: the header's hash, every field, and
/// every tensor's hash are checked, and nothing is returned unless all pass. Rows come back
/// right-justified, every row holding the layer's offset; the v4 attachments (the seed's MTP
/// draft state) are not read.
pub fn load(path: &Path) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    let mut file = File::open(path).map_err(|e| error!(InvalidArgument, "opening {}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| error!(Backend, "{}: {e}", path.display()))?.len();
    load_from(&mut file, len)
}

pub fn load_from_bytes(bytes: &[u8]) -> Result<(Vec<LatentCache>, MlxbunInfo)> {
    load_from(&mut std::io::Cursor::new(bytes), bytes.len() as u64)
}

/// The verified JSON header of a file, and its info, without reading any tensor.
pub fn read_info(path: &Path) -> Result<(String, MlxbunInfo)> {
    let mut file = File::open(path).map_err(|e| error!(InvalidArgument, "opening {}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| error!(Backend, "{}: {e}", path.display()))?.len();
    let header = read_header(&mut file, len)?;
    let info = info(&header.json)?;
    Ok((header.text, info))
}
