//! A segment's header: its metadata entries as written (format, geometry per layer, range,
//! links, key, a composed layer's hot row, tensor checksums), parsed back with every field
//! checked, and the chain digest that links a segment to the chain before it.
use std::collections::HashMap;

use crate::core::error::{error, fail, Result};
use crate::core::layout::boundary::converted_for;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::model::storage_mode::StorageMode;
use crate::core::persist::checksum::metadata_checksum;
use crate::core::persist::metadata::{describe, parse_geometry, PREFIX};
use crate::core::persist::wyhash::wyhash;

/// The format value of a segment (`0.latent_cache.format`): whole-set loads refuse it.
pub(super) const SEGMENT_FORMAT: &str = "segment-1";
/// The checksum version a segment's tensors are summed with (`checksum.rs`).
pub(super) const SUM_VERSION: u32 = 2;
/// The longest caller key a segment holds.
pub(crate) const MAX_KEY: usize = 4096;
/// Most layers a segment may name (as whole-set files).
const MAX_LAYERS: usize = 4096;

/// What a segment says of itself, read without its tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The row's positions it holds: `[from, to)`.
    pub from: usize,
    pub to: usize,
    /// The digest of the chain before it (0 for a first segment).
    pub previous: u64,
    /// The digest of the chain up to and including it.
    pub digest: u64,
    /// The caller's key.
    pub key: Vec<u8>,
    /// Each layer's geometry (composition included).
    pub geometries: Vec<Geometry>,
    /// Each composed layer's hot side as it stood at `to` (`None` for the others).
    pub hot: Vec<Option<HotRow>>,
}

/// A composed layer's one row at the end of a segment: its boundary (compact positions), the
/// first position its hot row holds, and the hot row's length (0: nothing is read hot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HotRow {
    pub converted: usize,
    pub base: usize,
    pub capacity: usize,
}

/// A layer's geometry as a chain compares it: `describe`'s, and the composition.
pub(super) fn describe_layer(g: &Geometry) -> String {
    match g.composed() {
        true => format!("{};hot {} {}", describe(g), g.hot_window, g.hot_storage.name()),
        false => describe(g),
    }
}

/// The name of layer `i`'s stored part `k` of `family` (`Some(k)`), or of its hot values
/// (`None`).
pub(super) fn tensor_name(i: usize, family: Family, k: Option<usize>) -> String {
    match k {
        Some(k) => format!("segment.{i}.{}.{k}", family.name()),
        None => format!("segment.{i}.hot.{}", family.name()),
    }
}

/// Every tensor a segment of these layers holds, in the order it writes and sums them: each
/// layer's stored parts, then its hot values (composed families, when its hot row holds any).
pub(super) fn tensor_names(geometries: &[Geometry], hot: &[Option<HotRow>]) -> Vec<(usize, Family, Option<usize>, String)> {
    let mut names = Vec::new();
    for (i, g) in geometries.iter().enumerate() {
        for family in Family::ALL {
            if let Some(width) = g.width(family) {
                for k in 0..g.storage(family).parts(width).len() {
                    names.push((i, family, Some(k), tensor_name(i, family, Some(k))));
                }
            }
        }
        if hot[i].is_some_and(|h| h.capacity > 0) {
            for family in Family::ALL.into_iter().filter(|&f| g.is_composed(f)) {
                names.push((i, family, None, tensor_name(i, family, None)));
            }
        }
    }
    names
}

fn hot_text(h: &HotRow) -> String {
    format!("{};{};{}", h.converted, h.base, h.capacity)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// The chain digest: wyhash over the segment's header fields and its tensors' checksums (each
/// over its dtype, shape and bytes), after the previous digest. An integrity link, so that a
/// chain is checked segment by segment; not a cryptographic one (anyone can forge a chain).
pub(super) fn chain_digest(h: &SegmentHeader, sums: &[(String, String)]) -> u64 {
    let mut text = format!("latent-cache {SEGMENT_FORMAT}\n{:016x}\n{}\n{}\n{}\n", h.previous, h.from, h.to, hex(&h.key));
    for (g, hot) in h.geometries.iter().zip(&h.hot) {
        text.push_str(&describe_layer(g));
        if let Some(hot) = hot {
            text.push_str(&format!(";{}", hot_text(hot)));
        }
        text.push('\n');
    }
    for (name, sum) in sums {
        text.push_str(&format!("{name}={sum}\n"));
    }
    wyhash(text.as_bytes(), 0)
}

/// The metadata a segment writes, `sums` its tensors' checksums (in `tensor_names` order);
/// returns it with the segment's digest, sealed by the metadata checksum.
pub(super) fn metadata(h: &SegmentHeader, sums: &[(String, String)]) -> (Vec<(String, String)>, u64) {
    let digest = chain_digest(h, sums);
    let mut m =
        vec![(format!("{PREFIX}format"), SEGMENT_FORMAT.to_owned()), (format!("{PREFIX}layers"), h.geometries.len().to_string())];
    for (i, (g, hot)) in h.geometries.iter().zip(&h.hot).enumerate() {
        m.push((format!("{PREFIX}layer.{i}.geometry"), describe(g)));
        if let Some(hot) = hot {
            let spec = format!("{};{};{}", g.hot_window, g.hot_storage.name(), hot_text(hot));
            m.push((format!("{PREFIX}layer.{i}.hot"), spec));
        }
    }
    m.push((format!("{PREFIX}segment.from"), h.from.to_string()));
    m.push((format!("{PREFIX}segment.to"), h.to.to_string()));
    m.push((format!("{PREFIX}segment.previous"), format!("{:016x}", h.previous)));
    m.push((format!("{PREFIX}segment.key"), hex(&h.key)));
    m.push((format!("{PREFIX}segment.digest"), format!("{digest:016x}")));
    m.extend(sums.iter().map(|(name, sum)| (format!("{PREFIX}sum.{name}"), sum.clone())));
    let sealed = metadata_checksum(m.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    m.push((format!("{PREFIX}meta_sum"), sealed));
    (m, digest)
}

/// Parses and checks a segment's metadata (format, metadata checksum, every field, the digest
/// against the fields and the listed checksums); returns the header and the listed checksums,
/// in `tensor_names` order. The tensors themselves are checked against those sums by the load.
pub(super) fn parse(meta: &HashMap<String, String>, what: &str) -> Result<(SegmentHeader, Vec<(String, String)>)> {
    let get = |k: &str| {
        meta.get(&format!("{PREFIX}{k}"))
            .ok_or_else(|| error!(InvalidArgument, "{what}: metadata {k} is missing (not a segment)"))
    };
    let format = get("format")?;
    if format != SEGMENT_FORMAT {
        return fail!(InvalidArgument, "{what}: format {format:?} is not a segment ({SEGMENT_FORMAT})");
    }
    if meta.get(&format!("{PREFIX}meta_sum")) != Some(&metadata_checksum(meta.iter().map(|(k, v)| (k.as_str(), v.as_str())))) {
        return fail!(InvalidArgument, "{what}: the metadata does not match its checksum (the segment is damaged)");
    }
    let count = |k: &str| -> Result<usize> {
        let v = get(k)?;
        v.parse().map_err(|_| error!(InvalidArgument, "{what}: metadata {k} {v:?} is not a count"))
    };
    let digest = |k: &str| -> Result<u64> {
        let v = get(k)?;
        u64::from_str_radix(v, 16).ok().filter(|_| v.len() == 16).ok_or_else(|| error!(InvalidArgument, "{what}: {k} {v:?}"))
    };
    let layers = count("layers")?;
    if layers == 0 || layers > MAX_LAYERS {
        return fail!(InvalidArgument, "{what}: a segment of {layers} layers");
    }
    let (from, to) = (count("segment.from")?, count("segment.to")?);
    if from >= to || to > i32::MAX as usize {
        return fail!(InvalidArgument, "{what}: positions [{from}, {to})");
    }
    let mut geometries = Vec::with_capacity(layers);
    let mut hot = Vec::with_capacity(layers);
    for i in 0..layers {
        let mut g = parse_geometry(get(&format!("layer.{i}.geometry"))?)?;
        hot.push(match meta.get(&format!("{PREFIX}layer.{i}.hot")) {
            Some(spec) => Some(parse_hot(spec, &mut g, to).map_err(|mut e| {
                e.message = format!("{what}: layer {i}: {}", e.message);
                e
            })?),
            None => None,
        });
        geometries.push(g);
    }
    if let Some(i) = geometries.iter().position(|g| g.max_tokens != 0 && to > g.max_tokens) {
        return fail!(InvalidArgument, "{what}: position {to} is past layer {i}'s max_tokens ({})", geometries[i].max_tokens);
    }
    let key = unhex(get("segment.key")?).filter(|k| k.len() <= MAX_KEY);
    let Some(key) = key else {
        return fail!(InvalidArgument, "{what}: the key is not hex of at most {MAX_KEY} bytes");
    };
    let (previous, digest) = (digest("segment.previous")?, digest("segment.digest")?);
    let header = SegmentHeader { from, to, previous, digest, key, geometries, hot };
    let sums = tensor_names(&header.geometries, &header.hot)
        .into_iter()
        .map(|(.., name)| Ok((name.clone(), get(&format!("sum.{name}"))?.clone())))
        .collect::<Result<Vec<_>>>()?;
    if chain_digest(&header, &sums) != header.digest {
        return fail!(InvalidArgument, "{what}: its digest does not match its contents (the segment is damaged)");
    }
    Ok((header, sums))
}

/// A composed layer's hot description (`window;mode;converted;base;capacity`): the composition
/// set on `g` (checked as a new cache's is), the row's boundary at least where the rule puts it
/// for `len` positions and not past them, and the hot row holding every position read hot.
fn parse_hot(spec: &str, g: &mut Geometry, len: usize) -> Result<HotRow> {
    let f: Vec<&str> = spec.split(';').collect();
    let num = |x: &str| x.parse::<usize>().ok();
    let parsed = match f.as_slice() {
        [w, m, c, b, n] => (num(w), StorageMode::from_name(m), num(c), num(b), num(n)),
        _ => return fail!(InvalidArgument, "composed storage {spec:?} is damaged"),
    };
    let (Some(window), Some(mode), Some(converted), Some(base), Some(capacity)) = parsed else {
        return fail!(InvalidArgument, "composed storage {spec:?} is damaged");
    };
    (g.hot_window, g.hot_storage) = (window, mode);
    g.validate()?;
    if !g.composed() || capacity > i32::MAX as usize || converted > len || converted < converted_for(len, window) {
        return fail!(InvalidArgument, "composed storage {spec:?} does not fit a row of {len} positions");
    }
    if converted < len && (converted < base || len > base.saturating_add(capacity)) {
        return fail!(InvalidArgument, "composed storage {spec:?}: the hot row misses positions read hot");
    }
    Ok(HotRow { converted, base, capacity })
}
