//! Saving a segment: one row's positions `[from, to)` of every layer, each family's parts as
//! stored, read through views of the buffers (only those positions are evaluated and written),
//! and a composed layer's hot row as it stands (about a hot window of positions), to a file
//! (through `file.rs`, hashed as written) or to bytes; then the layers are marked as holding the
//! chain up to `to`.
use std::path::Path;

use mlx_rs::Array;

use crate::core::cache::LatentCache;
use crate::core::error::{error, fail, Result};
use crate::core::mlx::eval::eval;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Geometry;
use crate::core::persist::checksum::{self, Hasher};
use crate::core::persist::file;
use crate::core::persist::mlx_read::mlx_path;
use crate::core::persist::safetensors::{self, Tensor};
use crate::core::persist::save::check_at_rest;
use crate::core::persist::segment::header::{metadata, tensor_names, HotRow, SegmentHeader, MAX_KEY, SUM_VERSION};
use crate::core::persist::tensor_bytes;

/// What to save: row `row`'s positions `[from, to)`, under the caller's `key`.
#[derive(Clone, Copy, Debug)]
pub struct SegmentRange<'a> {
    pub row: usize,
    pub from: usize,
    pub to: usize,
    pub key: &'a [u8],
}

/// The header of the segment `range` of `layers` would be (its digest not yet known), after
/// every check: layers at rest and not composed, the range inside the row, and the chain before
/// `from` known (`from` 0, or every layer marking this row as holding a chain of exactly `from`
/// positions: saved or restored there, or inherited from the row it was forked or attached from).
fn plan(layers: &[&LatentCache], range: SegmentRange<'_>) -> Result<SegmentHeader> {
    let SegmentRange { row, from, to, key } = range;
    check_at_rest(layers)?;
    if key.len() > MAX_KEY {
        return fail!(InvalidArgument, "a key of {} bytes (at most {MAX_KEY})", key.len());
    }
    let Some(first) = layers.first() else {
        return fail!(InvalidArgument, "a segment needs at least one layer");
    };
    if row >= first.batch_size() {
        return fail!(OutOfRange, "row {row} out of range: the set holds {} rows", first.batch_size());
    }
    let len = first.row_offsets()[row];
    if from >= to || to > len {
        return fail!(OutOfRange, "positions [{from}, {to}) of row {row}, which holds {len} (a segment holds at least one)");
    }
    let previous = match from {
        0 => 0,
        _ => {
            let marks: Vec<_> = layers.iter().map(|l| l.row_chain(row)).collect();
            match marks[0] {
                Some(m) if m.positions == from && marks.iter().all(|x| *x == marks[0]) => m.digest,
                _ => {
                    let known = marks[0].filter(|m| marks.iter().all(|x| *x == Some(*m)));
                    let known = known.map_or("no chain".to_owned(), |m| format!("its first {} positions", m.positions));
                    return fail!(
                        State,
                        "the set does not know the chain before position {from} of row {row} (it knows {known}): \
                         start a chain at 0, or continue where the row's last segment saved or restored ended"
                    );
                }
            }
        }
    };
    let geometries = layers.iter().map(|l| *l.geometry()).collect();
    let hot = layers.iter().map(|l| hot_row(l, to)).collect::<Result<Vec<_>>>()?;
    Ok(SegmentHeader { from, to, previous, digest: 0, key: key.to_vec(), geometries, hot })
}

/// A composed layer's hot row as it stands (`None` for the others). Only the newest positions
/// of a one-row set can be saved then: the hot side is the state's at its end.
fn hot_row(layer: &LatentCache, to: usize) -> Result<Option<HotRow>> {
    if !layer.geometry().composed() {
        return Ok(None);
    }
    if layer.batch_size() != 1 || layer.left_pad()[0] != 0 || layer.row_offsets()[0] != to {
        return fail!(
            InvalidArgument,
            "composed storage: a segment holds the hot side as it stands, so only a one-row set's newest positions \
             (up to its length, {}) can be saved",
            layer.row_offsets().first().copied().unwrap_or(0)
        );
    }
    let (converted, base, capacity) = layer.hot_row_now();
    Ok(Some(HotRow { converted, base, capacity }))
}

/// The segment's tensors: views of the row's positions, evaluated (only those positions) and
/// laid out along their innermost axis where they are not.
fn tensors(layers: &[&LatentCache], h: &SegmentHeader, row: usize) -> Result<Vec<Tensor>> {
    let mut out = Vec::new();
    for (i, family, k, name) in tensor_names(&h.geometries, &h.hot) {
        let array = match k {
            Some(k) => layers[i].stored_row_parts(family, row, h.from, h.to)?.swap_remove(k),
            None => layers[i].hot_values(family)?,
        };
        out.push(Tensor { name, shape: array.shape().to_vec(), array });
    }
    eval(out.iter().map(|t| &t.array))?;
    for t in out.iter_mut().filter(|t| !tensor_bytes::inner_contiguous(&t.array)) {
        t.array = ops::contiguous(&t.array)?;
        eval([&t.array])?;
    }
    Ok(out)
}

fn named_sums(tensors: &[Tensor], sums: Vec<String>) -> Vec<(String, String)> {
    tensors.iter().map(|t| t.name.clone()).zip(sums).collect()
}

fn mark(layers: &mut [&mut LatentCache], digest: u64, range: SegmentRange<'_>) {
    for layer in layers.iter_mut() {
        layer.mark_chain(digest, range.row, range.to);
    }
}

/// Saves `range` of `layers` to `path` (written whole or not at all) and returns its header;
/// the layers then know they hold the chain up to `range.to`. Nothing is written or changed on
/// a refusal.
pub fn save_segment(layers: &mut [&mut LatentCache], range: SegmentRange<'_>, path: &Path) -> Result<SegmentHeader> {
    use std::io::{Seek, SeekFrom, Write};
    mlx_path(path)?;
    let shared: Vec<&LatentCache> = layers.iter().map(|l| &**l).collect();
    let mut h = plan(&shared, range)?;
    let tensors = tensors(&shared, &h, range.row)?;
    file::write_atomically(path, file::Access::Shared, |file| {
        // Written with placeholder sums (and so a placeholder digest, of the same length), every
        // tensor hashed as it is written; then the header again with the real ones.
        let placeholders = named_sums(&tensors, vec!["0".repeat(16); tensors.len()]);
        let (meta, _) = metadata(&h, &placeholders);
        let mut hashers: Vec<Hasher> = tensors.iter().map(|t| Hasher::new(t.array.dtype(), &t.shape, SUM_VERSION)).collect();
        let io = |e: std::io::Error| error!(Backend, "writing {}: {e}", path.display());
        let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut *file);
        let written = safetensors::write_with(&mut out, &tensors, &meta, |i, run| hashers[i].update(run))?;
        out.flush().map_err(io)?;
        drop(out);
        let (meta, digest) = metadata(&h, &named_sums(&tensors, hashers.into_iter().map(Hasher::finish).collect()));
        let header = safetensors::header(&tensors, &meta)?;
        if header.len() != written {
            return fail!(Backend, "the segment's header changed length when its checksums were written");
        }
        file.seek(SeekFrom::Start(8)).map_err(io)?;
        file.write_all(header.as_bytes()).map_err(io)?;
        h.digest = digest;
        Ok(())
    })?;
    mark(layers, h.digest, range);
    Ok(h)
}

/// `save_segment` into bytes (the bytes a file holds).
pub fn save_segment_to_bytes(layers: &mut [&mut LatentCache], range: SegmentRange<'_>) -> Result<(Vec<u8>, SegmentHeader)> {
    let shared: Vec<&LatentCache> = layers.iter().map(|l| &**l).collect();
    let mut h = plan(&shared, range)?;
    let tensors = tensors(&shared, &h, range.row)?;
    let out = to_bytes(&mut h, &tensors)?;
    mark(layers, h.digest, range);
    Ok((out, h))
}

/// The bytes of a segment of `tensors` under `h`, whose digest is set.
fn to_bytes(h: &mut SegmentHeader, tensors: &[Tensor]) -> Result<Vec<u8>> {
    let sums = tensors.iter().map(|t| checksum::checksum(&t.array, &t.shape, SUM_VERSION)).collect::<Result<Vec<_>>>()?;
    let (meta, digest) = metadata(h, &named_sums(tensors, sums));
    let mut out = Vec::new();
    safetensors::write(&mut out, tensors, &meta)?;
    h.digest = digest;
    Ok(out)
}

/// A first segment (no chain before it) of positions `[from, to)` given as each layer's stored
/// parts (`[1, to - from, part_width]` in `tensor_names` order, evaluated, laid out along their
/// innermost axis), as the bytes a file holds: what a block of the prefix store writes. No
/// cache is read or marked; composed storage is not written this way (its hot side is a row's).
pub fn segment_of_parts(
    geometries: &[Geometry],
    parts: &[Families<Vec<Array>>],
    (from, to): (usize, usize),
    key: &[u8],
) -> Result<(Vec<u8>, SegmentHeader)> {
    if key.len() > MAX_KEY || geometries.is_empty() || geometries.len() != parts.len() || from >= to {
        return fail!(InvalidArgument, "a segment of {} layers, positions [{from}, {to}), a {}-byte key", parts.len(), key.len());
    }
    if geometries.iter().any(|g| g.composed()) {
        return fail!(InvalidArgument, "composed storage is saved as a row's segment, with its hot side");
    }
    let hot = vec![None; geometries.len()];
    let mut h = SegmentHeader { from, to, previous: 0, digest: 0, key: key.to_vec(), geometries: geometries.to_vec(), hot };
    let mut tensors = Vec::new();
    for (i, family, k, name) in tensor_names(&h.geometries, &h.hot) {
        let Some(array) = parts[i].get(family).and_then(|p| p.get(k.expect("no hot values"))) else {
            return fail!(InvalidArgument, "layer {i} lacks its {} parts", family.name());
        };
        if array.shape() != [1, (to - from) as i32, array.shape().get(2).copied().unwrap_or(0)] {
            return fail!(
                InvalidArgument,
                "layer {i}'s {} part is {:?}, not {} positions",
                family.name(),
                array.shape(),
                to - from
            );
        }
        tensors.push(Tensor { name, shape: array.shape().to_vec(), array: array.clone() });
    }
    let out = to_bytes(&mut h, &tensors)?;
    Ok((out, h))
}
