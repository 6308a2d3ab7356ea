//! A composed layer's hot side in a safetensors file (format 3): written from a cache, read back
//! and checked against the layer's row layout before anything is made.
use mlx_rs::Array;

use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::layout::boundary::converted_for;
use crate::core::layout::row_layout::RowLayout;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::model::storage_mode::StorageMode;
use crate::core::persist::contents::{extents, Contents};
use crate::core::persist::metadata::{list, parse_list, PREFIX};

/// A composed layer's hot side (format 3): the composition, each row's boundary, where the
/// hot values start, and the hot values of each composed family `[B, T_h, width]`.
pub(super) fn add_hot(c: &mut Contents, i: usize, cache: &LatentCache) -> Result<()> {
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
pub(super) fn read_hot<'a>(
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
    // A saved cache is in no round and no padded prefill (saves refuse them): every row's
    // boundary stands at least where its length puts it (a bypass trim may leave it past that).
    if converted.iter().zip(&lengths).any(|(&c, &len)| c < converted_for(len, window)) {
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
        let s = extents(&a);
        let width = g.width(family).expect("composed families are present");
        if s.len() != 3 || s[0] != rows || s[2] != width || a.dtype() != mode.read_dtype() {
            return bad("hot values");
        }
        if span.is_some_and(|t| t != s[1]) {
            return bad("hot values");
        }
        span = Some(s[1]);
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
