//! Segments: one row's positions `[from, to)` of a set saved apart (to a file or to bytes),
//! a set restored from an ordered chain of segments or extended along it, a segment's header
//! read alone, and the chain a set knows it holds (see `core::persist::segment`).
use std::ffi::c_char;
use std::path::PathBuf;

use super::args::{in_slice, out_ptr, path, write, write_optional};
use super::error::{Failure, FfiResult};
use super::panic::ffi_boundary;
use super::persist::give_bytes;
use super::set::{latent_cache_set, register_set, with_set_layers};
use super::status::latent_cache_status;
use crate::core::cache::ChainMark;
use crate::core::persist::segment::{
    extend_segments, load_segments, read_segment_header, save_segment, save_segment_to_bytes, SegmentHeader, SegmentRange,
    SegmentSource,
};
use crate::core::LatentCache;

/// What a segment says of itself (`latent_cache_segment_read_info`): the row positions
/// `[from, to)` it holds, the digest of the chain before it (`previous_digest`, 0 for a first
/// segment) and of the chain up to and including it (`digest`), its key's length and its layer
/// count. Digests are integrity links (wyhash), not cryptographic ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct latent_cache_segment_info {
    pub from: usize,
    pub to: usize,
    pub previous_digest: u64,
    pub digest: u64,
    pub key_len: usize,
    pub n_layers: usize,
}

fn info(h: &SegmentHeader) -> latent_cache_segment_info {
    latent_cache_segment_info {
        from: h.from,
        to: h.to,
        previous_digest: h.previous,
        digest: h.digest,
        key_len: h.key.len(),
        n_layers: h.geometries.len(),
    }
}

/// The caller's paths, each checked as a save's or a load's path is.
unsafe fn paths(paths: *const *const c_char, n: usize) -> FfiResult<Vec<PathBuf>> {
    let list = unsafe { in_slice(paths, n, "paths") }?;
    list.iter().map(|&p| unsafe { path(p) }).collect()
}

/// The caller's buffers `(data[k], lens[k])`, borrowed for the call.
unsafe fn buffers<'a>(data: *const *const u8, lens: *const usize, n: usize) -> FfiResult<Vec<&'a [u8]>> {
    let (data, lens) = (unsafe { in_slice(data, n, "data") }?, unsafe { in_slice(lens, n, "lens") }?);
    data.iter().zip(lens).map(|(&d, &len)| unsafe { in_slice(d, len, "data[k]") }).collect()
}

/// Saves positions `[from, to)` of row `row` of every layer of `set` (the MTP layer included)
/// to `path` as one segment: each family's parts for those positions exactly as stored (float
/// modes in their dtype; Q8 and Q4 codes, scales and biases; FP8 codes and scales), the layers'
/// geometry and storage, the range, the caller's `key` (`key_len` bytes, at most 4096, borrowed;
/// NULL with 0 for none), the digest of the chain before it and its own. Costs the range's
/// positions and a small header, whatever the row holds before `from` (only those positions are
/// read, through views). Written whole or not at all, as `latent_cache_set_save`.
/// `from` is 0 (a new chain) or where row `row`'s known chain ends (the last segment saved
/// from, or restored into, that row, or the chain it inherited from the row it was forked from
/// or the prefix it was attached over; with nothing since that moved those positions: appends,
/// and trims or rollbacks that stay above them, keep it; a filter, merge, extract, join or
/// another fork forgets it). Chains form a tree: continuations of one forked prompt each save
/// only their own positions, linked to the prompt's segments. The row then holds the chain up
/// to `to` (the other rows keep theirs). `*digest` (optional: NULL for none) receives the segment's digest.
/// A composed layer's segment also holds its hot row as it stands (about twice a hot window of
/// positions in the hot mode, whatever the history), so with composed layers only the newest
/// positions (`to` = the row's length) of a set of one row can be saved.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a path that is not UTF-8, a key over 4096
/// bytes, composed layers with several rows or `to` short of the row's length), `OUT_OF_RANGE`
/// (`row` or `[from, to)` outside the row, or empty), `INVALID_STATE` (layers that disagree, an
/// operation open as for `latent_cache_set_save`, or `from` not where the row's known chain
/// ends), `BACKEND` (the file could not be written). Nothing is written or changed on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save_segment(
    set: *mut latent_cache_set,
    row: usize,
    from: usize,
    to: usize,
    key: *const u8,
    key_len: usize,
    path: *const c_char,
    digest: *mut u64,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let key = unsafe { in_slice(key, key_len, "key") }?;
        let range = SegmentRange { row, from, to, key };
        let h = with_set_layers(set, |layers| Ok(save_segment(layers, range, &path)?))?;
        unsafe { write_optional(digest, h.digest) };
        Ok(())
    }
}

/// `latent_cache_set_save_segment` into bytes: `*out` (`*out_len` bytes) receives them, owned
/// by the caller (free with `latent_cache_bytes_free`); the bytes a file holds. Returns what
/// `latent_cache_set_save_segment` returns (no file, so no `BACKEND` for writing one).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save_segment_to_buffer(
    set: *mut latent_cache_set,
    row: usize,
    from: usize,
    to: usize,
    key: *const u8,
    key_len: usize,
    out: *mut *mut u8,
    out_len: *mut usize,
    digest: *mut u64,
) -> latent_cache_status {
    ffi_boundary! {
        let (out, out_len) = (out_ptr(out, "out")?, out_ptr(out_len, "out_len")?);
        let key = unsafe { in_slice(key, key_len, "key") }?;
        let range = SegmentRange { row, from, to, key };
        let (bytes, h) = with_set_layers(set, |layers| Ok(save_segment_to_bytes(layers, range)?))?;
        unsafe { give_bytes(bytes, out, out_len) };
        unsafe { write_optional(digest, h.digest) };
        Ok(())
    }
}

/// Restores a set from the chain of `n` segments at `paths` (in order): the first from
/// position 0, each next one starting where the one before ends, its previous digest the
/// digest of the chain before it, all of one geometry. Every header is read and the links
/// checked before any tensor is read; then each segment is read through the checks of
/// `latent_cache_set_load` (frame, checksums, shapes, dtypes) before anything is made. `*out`
/// receives a set of one row holding the chain's positions exactly as saved, owned by the
/// caller; the set knows it holds the chain (so it may save the next segment, or be extended).
/// Composed layers take the hot side the last segment holds, so the set goes on exactly as the
/// saved one did.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (no segment, an unreadable or damaged
/// segment, not a segment, a gap, an overlap, a broken link, another geometry), `CAPACITY`
/// (the positions would take MLX past its memory limit), `BACKEND`. Nothing is made on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_load_segments(
    paths: *const *const c_char,
    n: usize,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        let paths = unsafe { self::paths(paths, n) }?;
        unsafe { load_into(&paths.iter().map(|p| SegmentSource::Path(p)).collect::<Vec<_>>(), out) }
    }
}

/// `latent_cache_set_load_segments` from `n` buffers (`data[k]`, `lens[k]` bytes; borrowed for
/// the call), read from memory.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_load_segments_from_buffers(
    data: *const *const u8,
    lens: *const usize,
    n: usize,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        let buffers = unsafe { buffers(data, lens, n) }?;
        unsafe { load_into(&buffers.iter().map(|b| SegmentSource::Bytes(b)).collect::<Vec<_>>(), out) }
    }
}

/// Appends to `set` the positions of the segments of a chain it does not hold yet. `set` holds
/// one row that is exactly the start of the chain (restored from it, or saved segment by
/// segment, with no position since: its length must equal its known chain's), or it is empty.
/// `paths` (`n`, in order) is the whole chain from position 0, or its continuation from where
/// the set's chain ends; links are checked as by `latent_cache_set_load_segments`, and only the
/// segments the set lacks are read. Every layer changes, or none. `*appended` (optional: NULL
/// for none) receives how many segments were appended (0 when the set already holds them all).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a damaged segment, a gap, an overlap, a
/// broken link, another geometry than the set's, a chain that does not contain the set's),
/// `INVALID_STATE` (several rows, a set that knows no chain, a set longer than
/// its chain, an operation open), `CAPACITY`, `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_extend_segments(
    set: *mut latent_cache_set,
    paths: *const *const c_char,
    n: usize,
    appended: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let paths = unsafe { self::paths(paths, n) }?;
        unsafe { extend_with(set, &paths.iter().map(|p| SegmentSource::Path(p)).collect::<Vec<_>>(), appended) }
    }
}

/// `latent_cache_set_extend_segments` from `n` buffers (`data[k]`, `lens[k]` bytes; borrowed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_extend_segments_from_buffers(
    set: *mut latent_cache_set,
    data: *const *const u8,
    lens: *const usize,
    n: usize,
    appended: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let buffers = unsafe { buffers(data, lens, n) }?;
        unsafe { extend_with(set, &buffers.iter().map(|b| SegmentSource::Bytes(b)).collect::<Vec<_>>(), appended) }
    }
}

/// A set restored from `sources` (`latent_cache_set_load_segments`) written to `*out`.
unsafe fn load_into(sources: &[SegmentSource<'_>], out: *mut *mut latent_cache_set) -> FfiResult {
    let out = out_ptr(out, "out")?;
    let caches = load_segments(sources)?;
    unsafe { write(out, register_set(caches)) };
    Ok(())
}

/// `set` extended by `sources` (`latent_cache_set_extend_segments`); `*appended` (optional)
/// receives how many segments were appended.
unsafe fn extend_with(set: *mut latent_cache_set, sources: &[SegmentSource<'_>], appended: *mut usize) -> FfiResult {
    let count = with_set_layers(set, |layers| Ok(extend_segments(layers, sources)?))?;
    unsafe { write_optional(appended, count) };
    Ok(())
}

/// Copies the key into `(key, key_capacity)` when `key` is not NULL, then writes `*out`.
unsafe fn give_info(h: SegmentHeader, out: *mut latent_cache_segment_info, key: *mut u8, key_capacity: usize) -> FfiResult {
    let out = out_ptr(out, "out")?;
    if !key.is_null() {
        if key_capacity < h.key.len() {
            return Err(Failure::new(
                latent_cache_status::BufferTooSmall,
                format!("key holds {key_capacity} bytes; the segment's key is {}", h.key.len()),
            ));
        }
        // SAFETY: the caller's buffer holds `key_capacity` bytes, at least the key's length.
        unsafe { std::ptr::copy_nonoverlapping(h.key.as_ptr(), key, h.key.len()) };
    }
    unsafe { write(out, info(&h)) };
    Ok(())
}

/// Reads the header of the segment at `path` without reading its positions: the frame and the
/// metadata's checksum are checked, and the digest against the header's fields (the positions'
/// checksums are checked when a load reads them). `*out` receives the range, digests, key
/// length and layer count; the key is copied into `key` (`key_capacity` bytes) unless `key` is
/// NULL (ask for `out.key_len` first, then again with a buffer that large).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (unreadable, damaged, not a segment),
/// `BUFFER_TOO_SMALL` (`key` shorter than the key; nothing written), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_segment_read_info(
    path: *const c_char,
    out: *mut latent_cache_segment_info,
    key: *mut u8,
    key_capacity: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let h = read_segment_header(SegmentSource::Path(&path))?;
        unsafe { give_info(h, out, key, key_capacity) }
    }
}

/// `latent_cache_segment_read_info` of a segment in `len` bytes at `data` (borrowed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_segment_read_info_from_buffer(
    data: *const u8,
    len: usize,
    out: *mut latent_cache_segment_info,
    key: *mut u8,
    key_capacity: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let data = unsafe { in_slice(data, len, "data") }?;
        let h = read_segment_header(SegmentSource::Bytes(data))?;
        unsafe { give_info(h, out, key, key_capacity) }
    }
}

/// The segment chain `set` knows it holds, on its first row that holds a known one:
/// `*row` receives that row, `*positions` the chain's length (the row's first `*positions`
/// positions) and `*digest` its digest, the `previous_digest` the next segment saved from it
/// will carry. Each row has its own (`latent_cache_set_row_segment_chain`). Returns `OK`,
/// `NULL_ARGUMENT`, `INVALID_STATE` (no row's chain is known: none saved or restored, or a
/// change since moved its positions).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_segment_chain(
    set: *const latent_cache_set,
    row: *mut usize,
    positions: *mut usize,
    digest: *mut u64,
) -> latent_cache_status {
    ffi_boundary! {
        let (row, positions, digest) = (out_ptr(row, "row")?, out_ptr(positions, "positions")?, out_ptr(digest, "digest")?);
        let mark = with_set_layers(set, |layers| agreed_mark(layers, LatentCache::chain, "the set knows no segment chain"))?;
        unsafe {
            write(row, mark.row);
            write(positions, mark.positions);
            write(digest, mark.digest);
        }
        Ok(())
    }
}

/// The segment chain row `row` of `set` is known to hold: saved or restored there, or
/// inherited from the row it was forked from (`latent_cache_set_fork_row`: every continuation
/// holds its parent's chain) or the prefix it was attached over (a prefix shared from a row
/// holding a chain within its positions carries it). `*positions` receives the chain's length
/// and `*digest` its digest: the row's next segment is saved from `*positions` and links to it.
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (no such row), `INVALID_STATE` (the row's
/// chain is not known: none saved, restored or inherited, or a change since moved its positions).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_row_segment_chain(
    set: *const latent_cache_set,
    row: usize,
    positions: *mut usize,
    digest: *mut u64,
) -> latent_cache_status {
    ffi_boundary! {
        let (positions, digest) = (out_ptr(positions, "positions")?, out_ptr(digest, "digest")?);
        let mark = with_set_layers(set, |layers| {
            let rows = layers[0].batch_size();
            if row >= rows {
                return Err(Failure::new(latent_cache_status::OutOfRange, format!("row {row} out of range: the set holds {rows} rows")));
            }
            agreed_mark(layers, |l| l.row_chain(row), &format!("the set knows no segment chain of row {row}"))
        })?;
        unsafe {
            write(positions, mark.positions);
            write(digest, mark.digest);
        }
        Ok(())
    }
}

/// The chain mark `mark` reads on every layer, where all layers know the same one; else
/// INVALID_STATE with `none`.
fn agreed_mark(
    layers: &[&mut LatentCache],
    mark: impl Fn(&LatentCache) -> Option<ChainMark>,
    none: &str,
) -> FfiResult<ChainMark> {
    let first = mark(&*layers[0]);
    match first {
        Some(m) if layers.iter().all(|l| mark(l) == first) => Ok(m),
        _ => Err(Failure::new(latent_cache_status::InvalidState, none.to_owned())),
    }
}
