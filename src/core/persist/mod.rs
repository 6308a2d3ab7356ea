//! Saving and loading a model's caches: safetensors through MLX's own IO.
//!
//! - Layers whose families are all float (f32, bf16, f16) are laid out as mlx-lm 0.32.2's
//!   `save_prompt_cache` lays out a GLM-5 prompt cache: layer `i` is a `CacheList(KVCache,
//!   KVCache)`, the latent `[B, 1, T, kv_lora_rank]` as the first cache's keys (`i.0.0.0`), the
//!   rope key as its values (`i.0.0.1`), the index keys as the second cache's keys (`i.1.0.0`,
//!   with zeros as values, as mlx-lm's indexer keeps them; an empty cache on a layer without
//!   index keys), offsets as scalars, and mlx-lm's class names and scalar table in the metadata.
//! - Layers with a quantized family store their parts under names of our own
//!   (`latent_cache.<i>.<family>.<part>`): no mlx-lm class holds them.
//! - Our metadata (in mlx-lm's user metadata, keys `0.latent_cache.*`): the format version, each
//!   layer's geometry, storage, layout, role, left pads and row ends, and a 64-bit checksum of
//!   every tensor (over dtype, shape and bytes) and of the metadata, since safetensors has none.
//! - Composed layers (format 3) add their composition, each row's boundary and where the hot
//!   values start, and the hot values of each composed family (`latent_cache.<i>.hot.<family>`).
//!
//! A load checks everything (version, geometry, every tensor's presence, dtype, shape and
//! checksum, the row layout) before it creates anything. A file mlx-lm wrote (no metadata of
//! ours) is imported: float storage in the file's dtype, rows right-justified, no padding.
pub mod checksum;
pub mod file;
pub mod json;
pub mod mlxbun;
pub mod safetensors;
pub mod tensor_bytes;
pub mod wyhash;

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::Path;

use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::error::{error, fail, Result};
use crate::core::layout::row_layout::{LayoutKind, RowLayout};
use crate::core::mlx::eval::eval;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry, Role};
use crate::core::model::storage_mode::StorageMode;
use crate::core::persist::checksum::Hasher;

use crate::core::mlx::ops;
use crate::core::persist::safetensors::Tensor;
use crate::core::storage::buffers::Storage;

/// The newest format this library reads. It writes version 2, or 3 when a layer is composed
/// (version 3 adds the hot side; older readers refuse it rather than load it without).
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The format of files without composed layers.
const PLAIN_VERSION: u32 = 2;
const PREFIX: &str = "0.latent_cache.";

/// A tensor's checksum as format `version` computes it (`checksum.rs`), evaluated and laid out
/// along its innermost axis first where it is not.
fn checksum(a: &Array, shape: &[i32], version: u32) -> Result<String> {
    eval([a])?;
    if tensor_bytes::inner_contiguous(a) {
        return checksum::checksum(a, shape, version);
    }
    let laid_out = ops::contiguous(a)?;
    eval([&laid_out])?;
    checksum::checksum(&laid_out, shape, version)
}

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

fn float_layer(g: &Geometry) -> bool {
    Family::ALL.iter().all(|&f| g.width(f).is_none() || g.storage(f).is_float())
}

fn describe(g: &Geometry) -> String {
    let layout = match g.layout {
        LayoutKind::RightJustified => "right-justified",
        LayoutKind::Ragged => "ragged",
    };
    let role = match g.role {
        Role::Target => "target",
        Role::Mtp => "mtp",
    };
    format!(
        "{};{};{};{};{};{};{};{};{}",
        g.kv_lora_rank,
        g.rope_head_dim,
        g.index_head_dim,
        g.max_tokens,
        g.latent_storage.name(),
        g.rope_storage.name(),
        g.index_storage.name(),
        layout,
        role
    )
}

fn parse_geometry(s: &str) -> Result<Geometry> {
    let f: Vec<&str> = s.split(';').collect();
    let bad = || fail!(InvalidArgument, "layer geometry {s:?} is not this library's");
    if f.len() != 9 {
        return bad();
    }
    let num = |x: &str| x.parse::<usize>().ok();
    let mode = StorageMode::from_name;
    let (Some(r), Some(p), Some(i), Some(m)) = (num(f[0]), num(f[1]), num(f[2]), num(f[3])) else { return bad() };
    let (Some(ls), Some(rs), Some(is)) = (mode(f[4]), mode(f[5]), mode(f[6])) else { return bad() };
    let layout = match f[7] {
        "right-justified" => LayoutKind::RightJustified,
        "ragged" => LayoutKind::Ragged,
        _ => return bad(),
    };
    let role = match f[8] {
        "target" => Role::Target,
        "mtp" => Role::Mtp,
        _ => return bad(),
    };
    let g = Geometry {
        kv_lora_rank: r,
        rope_head_dim: p,
        index_head_dim: i,
        max_tokens: m,
        latent_storage: ls,
        rope_storage: rs,
        index_storage: is,
        layout,
        role,
        ..Geometry::default()
    };
    g.validate()?;
    Ok(g)
}

/// A composed layer's hot side (format 3): the composition, each row's boundary, where the
/// hot values start, and the hot values of each composed family `[B, T_h, width]`.
fn add_hot(c: &mut Contents, i: usize, cache: &LatentCache) -> Result<()> {
    let g = cache.geometry();
    let Some(hot) = cache.capture_hot()? else { return Ok(()) };
    c.metadata.push((format!("{PREFIX}layer.{i}.hot"), format!("{};{}", g.hot_window, g.hot_storage.name())));
    c.metadata.push((format!("{PREFIX}layer.{i}.converted"), list(&cache.converted_positions())));
    c.metadata.push((format!("{PREFIX}layer.{i}.hot_bases"), list(&hot.bases)));
    for (family, values) in hot.values {
        c.tensor(format!("latent_cache.{i}.hot.{}", family.name()), values)?;
    }
    Ok(())
}

/// Reads a layer's hot side and makes its geometry composed (checked as a new cache's is); the
/// hot values' shapes and dtype and every row's boundary are checked against the layout.
#[allow(clippy::type_complexity)]
fn read_hot<'a>(
    i: usize,
    g: &mut Geometry,
    layout: &RowLayout,
    get: impl Fn(&str) -> Result<&'a String>,
    tensor: &impl Fn(&str) -> Result<Array>,
) -> Result<Option<(Vec<usize>, Vec<usize>, Vec<(Family, Array)>)>> {
    let Ok(spec) = get(&format!("layer.{i}.hot")) else { return Ok(None) };
    let bad = |what: &str| fail!(InvalidArgument, "layer {i}: composed storage's {what} is damaged");
    let Some((window, mode)) = spec.split_once(';') else { return bad("description") };
    let (Ok(window), Some(mode)) = (window.parse::<usize>(), StorageMode::from_name(mode)) else {
        return bad("description");
    };
    (g.hot_window, g.hot_storage) = (window, mode);
    g.validate()?;
    if !g.composed() {
        return bad("description");
    }
    let converted = parse_list(get(&format!("layer.{i}.converted"))?)?;
    let bases = parse_list(get(&format!("layer.{i}.hot_bases"))?)?;
    let lengths = layout.row_offsets();
    if converted.len() != lengths.len() || bases.len() != lengths.len() || converted.iter().zip(&lengths).any(|(c, l)| c > l) {
        return bad("row boundaries");
    }
    let rows = lengths.len();
    let mut values = Vec::new();
    let mut span = None;
    for family in Family::ALL.into_iter().filter(|&f| g.is_composed(f)) {
        let name = format!("latent_cache.{i}.hot.{}", family.name());
        let Ok(a) = tensor(&name) else {
            // No hot values: no row may read any.
            span = Some(0);
            continue;
        };
        let s = a.shape();
        let width = g.width(family).expect("composed families are present") as i32;
        if s.len() != 3 || s[0] as usize != rows || s[2] != width || a.dtype() != mode.read_dtype() {
            return bad("hot values");
        }
        if span.is_some_and(|t| t != s[1] as usize) {
            return bad("hot values");
        }
        span = Some(s[1] as usize);
        values.push((family, a));
    }
    // Every row that reads positions hot holds them in its hot row.
    let capacity = span.unwrap_or(0);
    for (((&pad, &c), &row_end), &base) in layout.left_pad().iter().zip(&converted).zip(layout.row_ends()).zip(&bases) {
        let start = pad + c;
        if start < row_end && (start < base || row_end > base.saturating_add(capacity)) {
            return bad("hot span");
        }
    }
    Ok(Some((bases, converted, values)))
}

fn list(values: &[usize]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

fn parse_list(s: &str) -> Result<Vec<usize>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|v| v.parse().map_err(|_| error!(InvalidArgument, "{s:?} is not a list of counts"))).collect()
}

/// What a save writes: tensors and metadata strings.
#[derive(Default)]
struct Contents {
    tensors: Vec<Tensor>,
    metadata: Vec<(String, String)>,
    /// mlx-lm's scalar table: (tensor name, "scalar" | "string" | "none").
    scalars: Vec<(String, &'static str)>,
}

impl Contents {
    /// Adds a tensor as it is (a view of the stored buffers): its checksum and the writer read
    /// it where it lies.
    fn tensor(&mut self, name: String, a: Array) -> Result<()> {
        let shape = a.shape().to_vec();
        self.tensor_as(name, a, shape)
    }

    /// Adds a tensor the file holds under `shape` (a reshape keeping its row-major order).
    fn tensor_as(&mut self, name: String, array: Array, shape: Vec<i32>) -> Result<()> {
        self.tensors.push(Tensor { name, array, shape });
        Ok(())
    }

    fn scalar(&mut self, name: String, a: Array, kind: &'static str) -> Result<()> {
        self.scalars.push((name.clone(), kind));
        self.tensor(name, a)
    }
}

/// `[B, T, w]` -> `[B, 1, T, w]`, as mlx-lm's caches hold keys and values.
fn with_head_axis(a: &Array) -> Vec<i32> {
    let s = a.shape();
    vec![s[0], 1, s[1], s[2]]
}

fn add_layer(c: &mut Contents, i: usize, cache: &LatentCache) -> Result<()> {
    let g = cache.geometry();
    let t = cache.offset();
    c.metadata.push((format!("{PREFIX}layer.{i}.geometry"), describe(g)));
    c.metadata.push((format!("{PREFIX}layer.{i}.left_pad"), list(cache.left_pad())));
    c.metadata.push((format!("{PREFIX}layer.{i}.row_ends"), list(cache.row_ends())));
    c.metadata.push((format!("{PREFIX}layer.{i}.positions"), t.to_string()));
    if !float_layer(g) {
        for family in Family::ALL {
            if g.width(family).is_some() {
                for (k, part) in cache.packed(family)?.into_iter().enumerate() {
                    c.tensor(format!("latent_cache.{i}.{}.{k}", family.name()), part)?;
                }
            }
        }
        return Ok(());
    }
    let state = cache.state()?;
    c.tensor_as(format!("{i}.0.0.0"), state.latent.clone(), with_head_axis(&state.latent))?;
    c.tensor_as(format!("{i}.0.0.1"), state.rope.clone(), with_head_axis(&state.rope))?;
    c.scalar(format!("{i}.0.0.2"), int_scalar(t), "scalar")?;
    c.scalar(format!("{i}.0.1"), string_array("KVCache"), "string")?;
    match &state.index_keys {
        Some(keys) => {
            let shape = with_head_axis(keys);
            let s = shape.iter().map(|&d| d as usize).collect::<Vec<_>>();
            c.tensor(format!("{i}.1.0.1"), ops::zeros(&s, keys.dtype())?)?;
            c.tensor_as(format!("{i}.1.0.0"), keys.clone(), shape)?;
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

/// Everything a save writes but the checksums: the tensors evaluated and laid out along their
/// innermost axis, the metadata; and the format version the checksums follow.
fn laid_out(layers: &[&LatentCache]) -> Result<(Contents, u32)> {
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
    let sums = c.tensors.iter().map(|t| checksum(&t.array, &t.shape, version)).collect::<Result<Vec<_>>>()?;
    seal(&mut c, sums);
    Ok(c)
}

/// FNV-1a 64 over every metadata entry but `meta_sum` itself, in key order.
fn metadata_checksum<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut entries: Vec<(&str, &str)> = entries.filter(|(k, _)| *k != format!("{PREFIX}meta_sum")).collect();
    entries.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in entries {
        for &b in k.as_bytes().iter().chain([0u8].iter()).chain(v.as_bytes()).chain([0u8].iter()) {
            hash ^= b as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| error!(InvalidArgument, "{s:?} contains a NUL byte"))
}

/// A path MLX may be handed. MLX's C API formats its error messages (which quote paths) with the
/// message as a format string, so a `%` in a path could crash the process: refused.
fn mlx_path(path: &Path) -> Result<CString> {
    let s = path.to_string_lossy();
    if s.contains('%') {
        return fail!(InvalidArgument, "{s:?}: paths with '%' are refused (MLX would read it as a format conversion)");
    }
    cstring(&s)
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

/// Checks a safetensors file's frame before MLX reads it: the header length fits the file, and
/// the header is printable ASCII without `%`. MLX's C API formats its error messages with the
/// message as a format string, and its parse errors quote the header: a `%` from a damaged or
/// hostile file would reach `vsnprintf` as a conversion.
fn check_frame(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| error!(InvalidArgument, "{}: {e}", path.display()))?;
    let size = file.metadata().map_err(|e| error!(InvalidArgument, "{}: {e}", path.display()))?.len();
    let mut len = [0u8; 8];
    if size < 8 || file.read_exact(&mut len).is_err() {
        return fail!(InvalidArgument, "{} is too short for a safetensors file", path.display());
    }
    let header_len = u64::from_le_bytes(len);
    if header_len == 0 || header_len > size - 8 || header_len > 256 << 20 {
        return fail!(InvalidArgument, "{} announces a {header_len}-byte header in {size} bytes", path.display());
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| error!(InvalidArgument, "{}: {e}", path.display()))?;
    if header[0] != b'{' || header.iter().any(|&b| !(0x20..=0x7e).contains(&b) || b == b'%') {
        return fail!(InvalidArgument, "{} has a damaged header (not printable JSON, or a '%' in it)", path.display());
    }
    Ok(())
}

/// Reads a safetensors file's tensors and metadata through MLX (its frame checked first).
fn read_safetensors(path: &Path) -> Result<(HashMap<String, Array>, HashMap<String, String>)> {
    if !path.is_file() {
        return fail!(InvalidArgument, "{} is not a file", path.display());
    }
    let file = mlx_path(path)?;
    check_frame(path)?;
    let stream = ops::library_stream();
    // SAFETY: the maps are MLX's results, read and freed here; arrays are copied into owned
    // handles, strings into Rust strings.
    unsafe {
        let mut arrays = mlx_sys::mlx_map_string_to_array_new();
        let mut strings = mlx_sys::mlx_map_string_to_string_new();
        let rc = mlx_sys::mlx_load_safetensors(&mut arrays, &mut strings, file.as_ptr(), stream);
        let mut tensors = HashMap::new();
        let mut metadata = HashMap::new();
        if rc == 0 {
            let it = mlx_sys::mlx_map_string_to_array_iterator_new(arrays);
            loop {
                let mut key = std::ptr::null();
                let mut value = mlx_sys::mlx_array_new();
                if mlx_sys::mlx_map_string_to_array_iterator_next(&mut key, &mut value, it) != 0 || key.is_null() {
                    mlx_sys::mlx_array_free(value);
                    break;
                }
                tensors.insert(CStr::from_ptr(key).to_string_lossy().into_owned(), Array::from_ptr(value));
            }
            mlx_sys::mlx_map_string_to_array_iterator_free(it);
            let it = mlx_sys::mlx_map_string_to_string_iterator_new(strings);
            loop {
                let (mut key, mut value) = (std::ptr::null(), std::ptr::null());
                if mlx_sys::mlx_map_string_to_string_iterator_next(&mut key, &mut value, it) != 0 || key.is_null() {
                    break;
                }
                metadata.insert(
                    CStr::from_ptr(key).to_string_lossy().into_owned(),
                    CStr::from_ptr(value).to_string_lossy().into_owned(),
                );
            }
            mlx_sys::mlx_map_string_to_string_iterator_free(it);
        }
        mlx_sys::mlx_map_string_to_array_free(arrays);
        mlx_sys::mlx_map_string_to_string_free(strings);
        if rc != 0 {
            return fail!(InvalidArgument, "{} is not a readable safetensors file", path.display());
        }
        Ok((tensors, metadata))
    }
}

/// Loads the caches saved in `path`, every check passed before any cache is made.
pub fn load(path: &Path) -> Result<Vec<LatentCache>> {
    let (tensors, metadata) = read_safetensors(path)?;
    // Any key of ours makes it our file: a damaged format key must not turn it into a foreign
    // (unchecked) one.
    if !metadata.keys().any(|k| k.starts_with(PREFIX)) {
        return import_mlx_lm(&tensors, &metadata);
    }
    match metadata.get(&format!("{PREFIX}format")) {
        Some(version) => load_ours(version, &tensors, &metadata),
        None => fail!(InvalidArgument, "the file's format version is missing (the file is damaged)"),
    }
}

fn load_ours(version: &str, tensors: &HashMap<String, Array>, meta: &HashMap<String, String>) -> Result<Vec<LatentCache>> {
    let Some(version) = version.parse::<u32>().ok().filter(|v| (1..=FORMAT_VERSION).contains(v)) else {
        return fail!(InvalidArgument, "format version {version:?}: this library reads 1 to {FORMAT_VERSION}");
    };
    // The metadata and every tensor in the file must match their checksums before anything is
    // read from them.
    let meta_sum = meta.get(&format!("{PREFIX}meta_sum"));
    if meta_sum != Some(&metadata_checksum(meta.iter().map(|(k, v)| (k.as_str(), v.as_str())))) {
        return fail!(InvalidArgument, "the file's metadata does not match its checksum (the file is damaged)");
    }
    for (name, a) in tensors {
        if meta.get(&format!("{PREFIX}sum.{name}")) != Some(&checksum(a, a.shape(), version)?) {
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
        let layout = RowLayout::from_rows(g.layout, &pads, &ends, positions).map_err(|mut e| {
            e.message = format!("layer {i}: {}", e.message);
            e
        })?;
        let rows = pads.len();
        let families = Families::for_geometry(&g, |family, _| family);
        let parts = families.try_map(|family, _| -> Result<Vec<Array>> {
            let specs = Storage::part_specs(&g, family);
            let arrays: Vec<Array> = if float_layer(&g) {
                let name = match family {
                    Family::Latent => format!("{i}.0.0.0"),
                    Family::Rope => format!("{i}.0.0.1"),
                    Family::IndexKeys => format!("{i}.1.0.0"),
                };
                let a = tensor(&name)?;
                if a.ndim() != 4 || a.shape()[1] != 1 {
                    return fail!(InvalidArgument, "tensor {name} is {:?}, not [B, 1, T, width]", a.shape());
                }
                let s = a.shape();
                vec![ops::reshape(&a, &[s[0] as usize, s[2] as usize, s[3] as usize])?]
            } else {
                (0..specs.len()).map(|k| tensor(&format!("latent_cache.{i}.{}.{k}", family.name()))).collect::<Result<_>>()?
            };
            if arrays.len() != specs.len() {
                return fail!(InvalidArgument, "layer {i}: {} has {} parts, not {}", family.name(), arrays.len(), specs.len());
            }
            for (a, spec) in arrays.iter().zip(&specs) {
                let want = [rows as i32, positions as i32, spec.width as i32];
                if a.shape() != want || a.dtype() != spec.dtype {
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

/// A prompt cache mlx-lm saved for a GLM-5-shaped model (batch rows without padding).
fn import_mlx_lm(tensors: &HashMap<String, Array>, meta: &HashMap<String, String>) -> Result<Vec<LatentCache>> {
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

/// Saves to bytes, the same bytes a file holds.
pub fn save_to_bytes(layers: &[&LatentCache]) -> Result<Vec<u8>> {
    let c = contents(layers)?;
    let mut out = Vec::new();
    safetensors::write(&mut out, &c.tensors, &c.metadata)?;
    Ok(out)
}

/// Loads from bytes a save wrote (through a new temporary file, removed after).
pub fn load_from_bytes(bytes: &[u8]) -> Result<Vec<LatentCache>> {
    use std::io::Write;
    let (path, mut file) = file::create_unique(&std::env::temp_dir(), "latent-cache-", ".safetensors", file::Access::Private)?;
    let result = file.write_all(bytes).map_err(|e| error!(Backend, "staging the bytes: {e}")).and_then(|_| {
        drop(file);
        load(&path)
    });
    let _ = std::fs::remove_file(&path);
    result
}
