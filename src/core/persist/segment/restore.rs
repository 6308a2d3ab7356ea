//! Restoring from segments: a chain's headers read and linked first (frames checked, metadata
//! and digests verified, ranges contiguous, each previous digest the one before it, one
//! geometry), then the tensors of the segments needed, each checked against its checksum, shape
//! and dtype; only then is anything built: a new set (each family part one array, the segments'
//! parts joined once) or the next positions appended to a set that holds the chain's start. A
//! composed layer takes the hot side the chain's last segment holds.
use std::collections::HashMap;
use std::path::Path;

use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::eval::eval;
use crate::core::mlx::math;
use crate::core::mlx::memory::check_alloc;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;
use crate::core::persist::contents::extents;
use crate::core::persist::mlx_read::{read_metadata, read_metadata_bytes, read_safetensors, read_safetensors_bytes};
use crate::core::persist::segment::header::{describe_layer, parse, tensor_name, SegmentHeader, SUM_VERSION};
use crate::core::persist::streamed::of_read;
use crate::core::storage::buffers::Storage;

/// Where a segment is: a file, or bytes the caller lends for the call.
#[derive(Clone, Copy, Debug)]
pub enum SegmentSource<'a> {
    Path(&'a Path),
    Bytes(&'a [u8]),
}

impl SegmentSource<'_> {
    fn what(&self, k: usize) -> String {
        match self {
            SegmentSource::Path(p) => format!("segment {k} ({})", p.display()),
            SegmentSource::Bytes(_) => format!("segment {k}"),
        }
    }
}

/// A segment's header, read and checked without reading its tensors (the frame, the metadata
/// checksum, every field, the digest against the fields and the listed checksums).
pub fn read_segment_header(source: SegmentSource<'_>) -> Result<SegmentHeader> {
    header_of(source, &source.what(0))
}

fn header_of(source: SegmentSource<'_>, what: &str) -> Result<SegmentHeader> {
    let meta = match source {
        SegmentSource::Path(p) => read_metadata(p)?,
        SegmentSource::Bytes(b) => read_metadata_bytes(b)?,
    };
    Ok(parse(&meta, what)?.0)
}

/// One segment's header and each layer's stored parts (`[1, to - from, part_width]`), every
/// tensor checked against its checksum, shape and dtype: what the prefix store reads of a
/// block. Segments of composed storage (with a hot side) are refused.
pub fn read_segment(source: SegmentSource<'_>) -> Result<(SegmentHeader, Vec<Families<Vec<Array>>>)> {
    let what = source.what(0);
    let header = header_of(source, &what)?;
    if header.hot.iter().any(Option::is_some) {
        return fail!(InvalidArgument, "{what} holds composed storage's hot side");
    }
    let layers = read_parts(source, 0, &header)?;
    Ok((header, layers.into_iter().map(|(parts, _)| parts).collect()))
}

/// Checks that `headers` follow `start` (the digest and length of the chain before them) link
/// by link, all of one geometry (`geometry`, each layer described).
fn check_links(headers: &[SegmentHeader], start: (u64, usize), geometry: &[String]) -> Result<()> {
    let (mut digest, mut at) = start;
    for (k, h) in headers.iter().enumerate() {
        let described: Vec<String> = h.geometries.iter().map(describe_layer).collect();
        if described != geometry {
            return fail!(InvalidArgument, "segment {k} is of another geometry ({described:?}; the chain's is {geometry:?})");
        }
        if h.from != at {
            let how = if h.from > at { "a gap" } else { "an overlap" };
            return fail!(InvalidArgument, "segment {k} holds positions [{}, {}) but the chain is at {at}: {how}", h.from, h.to);
        }
        if h.previous != digest {
            return fail!(
                InvalidArgument,
                "segment {k} follows the chain {:016x}, not this one ({digest:016x}): a broken link",
                h.previous
            );
        }
        (digest, at) = (h.digest, h.to);
    }
    Ok(())
}

/// One layer's arrays in a segment: each family's stored parts, and a composed layer's hot
/// values (`[1, capacity, width]` per composed family).
type LayerArrays = (Families<Vec<Array>>, Vec<(Family, Array)>);

/// Reads segment `k`'s tensors, checked against its header (read again: the source must not
/// have changed), their checksums, shapes and dtypes.
fn read_parts(source: SegmentSource<'_>, k: usize, expected: &SegmentHeader) -> Result<Vec<LayerArrays>> {
    let what = source.what(k);
    let (tensors, meta, streamed) = match source {
        SegmentSource::Path(p) => read_safetensors(p)?,
        SegmentSource::Bytes(b) => read_safetensors_bytes(b)?,
    };
    let (header, sums) = parse(&meta, &what)?;
    if &header != expected {
        return fail!(InvalidArgument, "{what} changed while it was read");
    }
    if tensors.len() != sums.len() {
        return fail!(InvalidArgument, "{what} holds {} tensors, not {}", tensors.len(), sums.len());
    }
    let sums: HashMap<String, String> = sums.into_iter().collect();
    let checked = |name: String, want: [usize; 3], dtype: Dtype| -> Result<Array> {
        let Some(a) = tensors.get(&name) else {
            return fail!(InvalidArgument, "{what}: tensor {name} is missing");
        };
        if extents(a) != want || a.dtype() != dtype {
            return fail!(InvalidArgument, "{what}: tensor {name} is {:?} {:?}, not {want:?} {dtype:?}", a.shape(), a.dtype());
        }
        if sums.get(&name) != Some(&of_read(a, SUM_VERSION, streamed.get(&name))?) {
            return fail!(InvalidArgument, "{what}: tensor {name} does not match its checksum (damaged)");
        }
        Ok(a.clone())
    };
    let n = header.to - header.from;
    let mut out = Vec::with_capacity(header.geometries.len());
    for (i, (g, hot)) in header.geometries.iter().zip(&header.hot).enumerate() {
        let parts = Families::for_geometry(g, |family, _| family).try_map(|family, _| {
            let specs = Storage::part_specs(g, family);
            let named = specs.iter().enumerate().map(|(p, spec)| (tensor_name(i, family, Some(p)), spec));
            named.map(|(name, spec)| checked(name, [1, n, spec.width], spec.dtype)).collect::<Result<Vec<Array>>>()
        })?;
        let mut values = Vec::new();
        if let Some(hot) = hot.filter(|h| h.capacity > 0) {
            for family in Family::ALL.into_iter().filter(|&f| g.is_composed(f)) {
                let width = g.width(family).expect("composed families are present");
                let want = [1, hot.capacity, width];
                values.push((family, checked(tensor_name(i, family, None), want, g.hot_storage.read_dtype())?));
            }
        }
        out.push((parts, values));
    }
    Ok(out)
}

/// Each layer's parts of `segments` joined along the positions (one array per part), evaluated.
fn joined(segments: Vec<Vec<Families<Vec<Array>>>>, bytes: usize) -> Result<Vec<Families<Vec<Array>>>> {
    check_alloc(Some(bytes), "joining the segments' positions")?;
    let layers = segments[0].len();
    let mut per_layer: Vec<Vec<Families<Vec<Array>>>> = (0..layers).map(|_| Vec::new()).collect();
    for segment in segments {
        for (i, parts) in segment.into_iter().enumerate() {
            per_layer[i].push(parts);
        }
    }
    let out = per_layer
        .into_iter()
        .map(|pieces| {
            pieces[0].as_ref().try_map(|family, first| {
                (0..first.len())
                    .map(|p| match pieces.len() {
                        1 => Ok(first[p].clone()),
                        _ => {
                            let all: Vec<&Array> = pieces.iter().map(|s| &s.get(family).expect("one geometry")[p]).collect();
                            math::concatenate(&all, 1)
                        }
                    })
                    .collect::<Result<Vec<Array>>>()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    eval(out.iter().flat_map(|f| f.iter().flatten()))?;
    Ok(out)
}

/// Headers of every source, each checked.
fn headers(sources: &[SegmentSource<'_>]) -> Result<Vec<SegmentHeader>> {
    if sources.is_empty() {
        return fail!(InvalidArgument, "a chain needs at least one segment");
    }
    sources.iter().enumerate().map(|(k, s)| header_of(*s, &s.what(k))).collect()
}

/// The joined parts of segments `first..` (headers checked), and each layer's hot values of
/// the last segment (its hot side as it stood at the chain's end).
fn read_from(sources: &[SegmentSource<'_>], headers: &[SegmentHeader], first: usize) -> Result<Vec<LayerArrays>> {
    let g = &headers[0].geometries;
    let positions = headers.last().expect("a chain").to - headers[first].from;
    let bytes = positions.saturating_mul(g.iter().map(|g| g.bytes_per_token()).sum());
    let mut parts = Vec::new();
    let mut hot = Vec::new();
    for k in first..sources.len() {
        let (stored, values): (Vec<_>, Vec<_>) = read_parts(sources[k], k, &headers[k])?.into_iter().unzip();
        parts.push(stored);
        hot = values;
    }
    Ok(joined(parts, bytes)?.into_iter().zip(hot).collect())
}

/// Gives a composed layer the hot side a chain's last segment holds.
fn adopt_hot(cache: &mut LatentCache, last: &SegmentHeader, i: usize, values: Vec<(Family, Array)>) {
    if let Some(h) = last.hot[i] {
        cache.adopt_hot(vec![h.base], vec![h.converted], values);
    }
}

/// A new set (one row) holding the chain `sources` (in order, from position 0); nothing is
/// made unless every segment is whole and linked.
pub fn load_segments(sources: &[SegmentSource<'_>]) -> Result<Vec<LatentCache>> {
    let headers = headers(sources)?;
    let geometry: Vec<String> = headers[0].geometries.iter().map(describe_layer).collect();
    check_links(&headers, (0, 0), &geometry)?;
    let last = headers.last().expect("a chain");
    let parts = read_from(sources, &headers, 0)?;
    Ok(headers[0]
        .geometries
        .iter()
        .zip(parts)
        .enumerate()
        .map(|(i, (g, (parts, hot)))| {
            let layout = RowLayout::rebuilt(g.layout, &[last.to]);
            let mut cache = LatentCache::adopt(*g, layout, Storage::from_parts(g, 1, last.to, parts));
            adopt_hot(&mut cache, last, i, hot);
            cache.mark_chain(last.digest, 0, last.to);
            cache
        })
        .collect())
}

/// Appends to `layers` (one row holding exactly the start of the chain `sources`, as its chain
/// mark says, or empty) the positions of the segments it does not hold yet. `sources` is the
/// whole chain from position 0, or its continuation from where the layers' chain ends. Every
/// layer changes, or none. Returns the segments appended.
pub fn extend_segments(layers: &mut [&mut LatentCache], sources: &[SegmentSource<'_>]) -> Result<usize> {
    let headers = headers(sources)?;
    let geometry: Vec<String> = layers.iter().map(|l| describe_layer(l.geometry())).collect();
    let marks: Vec<_> = layers.iter().map(|l| l.row_chain(0)).collect();
    let start = match (layers.first().map_or(0, |l| l.batch_size()), marks.first().copied().flatten()) {
        (0, _) => (0, 0),
        (1, Some(m)) if marks.iter().all(|x| *x == Some(m)) => {
            if layers[0].row_offsets()[0] != m.positions {
                return fail!(
                    State,
                    "the set holds {} positions, the chain it knows {}: extend a set that holds exactly a chain's start",
                    layers[0].row_offsets()[0],
                    m.positions
                );
            }
            (m.digest, m.positions)
        }
        (rows, _) => {
            return fail!(State, "the set ({rows} rows) does not know which segment chain it holds: restore it from segments");
        }
    };
    let first = if headers[0].from == 0 && start.1 != 0 {
        // The whole chain: linked from position 0; the set holds its first `first` segments.
        check_links(&headers, (0, 0), &geometry)?;
        match headers.iter().position(|h| (h.digest, h.to) == start) {
            Some(k) => k + 1,
            None => {
                return fail!(
                    InvalidArgument,
                    "the set holds a chain ({:016x}, {} positions) none of these segments ends",
                    start.0,
                    start.1
                )
            }
        }
    } else {
        check_links(&headers, start, &geometry)?;
        0
    };
    if first == headers.len() {
        return Ok(0);
    }
    let tokens = headers.last().expect("a chain").to - headers[first].from;
    let parts = read_from(sources, &headers, first)?;
    let mut changes = Vec::with_capacity(layers.len());
    for (i, (layer, (parts, hot))) in layers.iter().zip(parts).enumerate() {
        let change = layer.prepare_append_stored(parts, tokens).map_err(|mut e| {
            e.message = format!("layer {i}: {}", e.message);
            e
        })?;
        changes.push((change, hot));
    }
    let last = headers.last().expect("a chain");
    for (i, (layer, (change, hot))) in layers.iter_mut().zip(changes).enumerate() {
        layer.apply(change);
        adopt_hot(layer, last, i, hot);
        layer.mark_chain(last.digest, 0, last.to);
    }
    Ok(headers.len() - first)
}
