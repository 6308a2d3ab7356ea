//! Reading safetensors through MLX's own loader, from bytes this library holds: a file opened
//! once (`file::open_regular`: a regular file, read through that one descriptor) or a caller's
//! buffer, handed to MLX as an `mlx_io_reader`. No path reaches MLX and no temporary file is
//! made. Before MLX reads anything the frame is checked here: the header length fits the bytes,
//! the header is printable ASCII JSON without `%` (MLX's C API formats its error messages with
//! the message as a format string, and its parse errors quote the header), and every tensor's
//! dtype, shape and byte range agree and tile the data exactly (no gap, no overlap, nothing past
//! the end, nothing after the last tensor), within MLX's memory limit.
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use mlx_rs::Array;
use serde_json::Value;

use crate::core::error::{error, fail, Result};
use crate::core::mlx::{device, eval::eval, memory::check_alloc};
use crate::core::persist::file::open_regular;
use crate::core::persist::safetensors::{dtype_of_name, dtype_size};
use crate::core::persist::streamed::{streamed, track, Streamed, Tracked};

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| error!(InvalidArgument, "{s:?} contains a NUL byte"))
}

/// A path MLX may be handed (a save checks its target with it). MLX's C API formats its error
/// messages (which quote paths) with the message as a format string, so a `%` in a path could
/// crash the process: refused.
pub(super) fn mlx_path(path: &Path) -> Result<CString> {
    let s = path.to_string_lossy();
    if s.contains('%') {
        return fail!(InvalidArgument, "{s:?}: paths with '%' are refused (MLX would read it as a format conversion)");
    }
    cstring(&s)
}

/// Headers beyond this are refused before they are read (a damaged length field).
const MAX_HEADER: u64 = 256 << 20;

/// Where the bytes are.
enum Data {
    File(File),
    /// A caller's buffer: only read while the load that borrowed it runs (`Source::revoke`).
    Bytes(*const u8, usize),
}

// SAFETY: the buffer is only read, and only while its `Source` is not revoked, which the load
// that borrowed it does (waiting out every read in flight) before it returns.
unsafe impl Send for Data {}
unsafe impl Sync for Data {}

impl Data {
    /// Fills `buf` from byte `at`; returns how many bytes were there (fewer only at the end, or
    /// on a read error).
    fn read_at(&self, buf: &mut [u8], at: u64) -> usize {
        match self {
            Data::File(file) => {
                let mut done = 0;
                while done < buf.len() {
                    #[cfg(unix)]
                    let read = std::os::unix::fs::FileExt::read_at(file, &mut buf[done..], at + done as u64);
                    #[cfg(windows)]
                    let read = std::os::windows::fs::FileExt::seek_read(file, &mut buf[done..], at + done as u64);
                    match read {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                done
            }
            &Data::Bytes(ptr, len) => {
                let Some(at) = usize::try_from(at).ok().filter(|&at| at < len) else {
                    return 0;
                };
                let n = buf.len().min(len - at);
                // SAFETY: `at + n <= len`, the buffer is alive while the source is not revoked
                // (the caller holds the read lock), and `buf` is ours.
                unsafe { std::ptr::copy_nonoverlapping(ptr.add(at), buf.as_mut_ptr(), n) };
                n
            }
        }
    }
}

/// The bytes one load reads, shared by the load and MLX's reader (which MLX may keep until its
/// arrays are evaluated): revoked when the load ends, after which every read finds nothing.
struct Source {
    data: RwLock<Option<Data>>,
    len: u64,
    /// A read found fewer bytes than the frame promised (a file shortened while it was read, or
    /// a read after the load ended): the load is refused.
    short: AtomicBool,
}

impl Source {
    /// Fills `buf` from `at`, zeros past what was there; false when some bytes were missing.
    fn read_at(&self, buf: &mut [u8], at: u64) -> bool {
        let data = self.data.read().unwrap_or_else(PoisonError::into_inner);
        let n = data.as_ref().map_or(0, |d| d.read_at(buf, at));
        buf[n..].fill(0);
        if n < buf.len() {
            self.short.store(true, Ordering::Relaxed);
        }
        n == buf.len()
    }

    /// Ends reading: waits for reads in flight, then drops the data (closing a file, releasing
    /// a borrowed buffer).
    fn revoke(&self) {
        *self.data.write().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Revokes a source when the load ends, however it ends.
struct Revoke<'a>(&'a Source);

impl Drop for Revoke<'_> {
    fn drop(&mut self) {
        self.0.revoke();
    }
}

/// MLX's view of a source: the source, a position, the tensors to checksum as read (`streamed`).
struct Reader {
    source: Arc<Source>,
    pos: Mutex<u64>,
    tracked: Arc<Vec<Tracked>>,
}

/// The reader behind `desc`.
///
/// # Safety
/// `desc` is a `Reader` made by `read_source`, not yet freed (MLX calls no function after
/// `free`).
unsafe fn reader<'a>(desc: *mut c_void) -> &'a Reader {
    unsafe { &*(desc as *const Reader) }
}

unsafe extern "C" fn is_open(desc: *mut c_void) -> bool {
    unsafe { reader(desc) }.source.data.read().unwrap_or_else(PoisonError::into_inner).is_some()
}

unsafe extern "C" fn tell(desc: *mut c_void) -> usize {
    let pos = *unsafe { reader(desc) }.pos.lock().unwrap_or_else(PoisonError::into_inner);
    usize::try_from(pos).unwrap_or(usize::MAX)
}

unsafe extern "C" fn seek(desc: *mut c_void, off: i64, whence: c_int) -> c_int {
    let r = unsafe { reader(desc) };
    let mut pos = r.pos.lock().unwrap_or_else(PoisonError::into_inner);
    let base = match whence {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => *pos,
        libc::SEEK_END => r.source.len,
        _ => return -1,
    };
    match base.checked_add_signed(off) {
        Some(at) => {
            *pos = at;
            0
        }
        None => -1,
    }
}

/// Reads `n` bytes at `at` into `data`. Always reports `n` (zeros past what was there, noted in
/// the source): MLX turns a short read into an exception, which on its reading threads would end
/// the process; the load sees the note and refuses instead.
unsafe fn fill(r: &Reader, data: *mut c_char, n: usize, at: u64) -> usize {
    if n > 0 {
        // SAFETY: MLX hands a buffer of `n` bytes.
        let buf = unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), n) };
        if r.source.read_at(buf, at) {
            track(&r.tracked, buf, at);
        }
    }
    n
}

unsafe extern "C" fn read(desc: *mut c_void, data: *mut c_char, n: usize) -> usize {
    let r = unsafe { reader(desc) };
    let mut pos = r.pos.lock().unwrap_or_else(PoisonError::into_inner);
    let at = *pos;
    *pos = at.saturating_add(n as u64);
    unsafe { fill(r, data, n, at) }
}

unsafe extern "C" fn read_at_offset(desc: *mut c_void, data: *mut c_char, n: usize, off: usize) -> usize {
    unsafe { fill(reader(desc), data, n, off as u64) }
}

unsafe extern "C" fn write(_: *mut c_void, _: *const c_char, _: usize) -> usize {
    0
}

/// A fixed label: MLX quotes it in error messages it formats, so it holds no `%` (and no path).
unsafe extern "C" fn label(_: *mut c_void) -> *const c_char {
    c"latent-cache's reader".as_ptr()
}

unsafe extern "C" fn free(desc: *mut c_void) {
    drop(unsafe { Box::from_raw(desc as *mut Reader) });
}

const VTABLE: mlx_sys::mlx_io_vtable = mlx_sys::mlx_io_vtable {
    is_open: Some(is_open),
    good: Some(is_open),
    tell: Some(tell),
    seek: Some(seek),
    read: Some(read),
    read_at_offset: Some(read_at_offset),
    write: Some(write),
    label: Some(label),
    free: Some(free),
};

/// A checked frame: the header's metadata (its string entries), the bytes its tensors take, and
/// the tensors to checksum as read (ordered by their starts).
struct Frame {
    metadata: HashMap<String, String>,
    data_bytes: u64,
    tracked: Vec<Tracked>,
}

/// Checks the frame (see the module's comment) before MLX reads anything.
fn check_frame(source: &Source, what: &str) -> Result<Frame> {
    let size = source.len;
    let mut len = [0u8; 8];
    if size < 8 || !source.read_at(&mut len, 0) {
        return fail!(InvalidArgument, "{what} is too short for a safetensors file");
    }
    let header_len = u64::from_le_bytes(len);
    let header_bytes =
        usize::try_from(header_len).ok().filter(|_| header_len != 0 && header_len <= size - 8 && header_len <= MAX_HEADER);
    let Some(header_bytes) = header_bytes else {
        return fail!(InvalidArgument, "{what} announces a {header_len}-byte header in {size} bytes");
    };
    let mut header = vec![0u8; header_bytes];
    if !source.read_at(&mut header, 8) {
        return fail!(InvalidArgument, "{what} ends inside its header");
    }
    if header[0] != b'{' || header.iter().any(|&b| !(0x20..=0x7e).contains(&b) || b == b'%') {
        return fail!(InvalidArgument, "{what} has a damaged header (not printable JSON, or a '%' in it)");
    }
    let json: Value = serde_json::from_slice(&header).map_err(|_| error!(InvalidArgument, "{what}: the header is not JSON"))?;
    let Some(entries) = json.as_object() else {
        return fail!(InvalidArgument, "{what}: the header is not a JSON object");
    };
    let data_len = size - 8 - header_len;
    let mut ranges = Vec::with_capacity(entries.len());
    let mut tracked = Vec::with_capacity(entries.len());
    for (name, t) in entries.iter().filter(|(name, _)| *name != "__metadata__") {
        let damaged = || error!(InvalidArgument, "{what}: tensor {name:?} has a damaged entry (dtype, shape or data_offsets)");
        let dtype = t.get("dtype").and_then(Value::as_str).ok_or_else(damaged)?;
        let item = dtype_size(dtype).ok_or_else(damaged)?;
        let shape = t.get("shape").and_then(Value::as_array).ok_or_else(damaged)?;
        let mut bytes = Some(item);
        let mut dims = Vec::with_capacity(shape.len());
        for d in shape {
            let d = d.as_u64().filter(|&d| d <= i32::MAX as u64).ok_or_else(damaged)?;
            bytes = bytes.and_then(|b| b.checked_mul(d));
            dims.push(d as i32);
        }
        let offsets = t.get("data_offsets").and_then(Value::as_array).ok_or_else(damaged)?;
        let [start, end] = offsets.as_slice() else {
            return Err(damaged());
        };
        let (start, end) = (start.as_u64().ok_or_else(damaged)?, end.as_u64().ok_or_else(damaged)?);
        if end < start || bytes != Some(end - start) {
            return fail!(InvalidArgument, "{what}: tensor {name:?} spans bytes {start}..{end}, not its shape's size");
        }
        ranges.push((start, end));
        if let Some(dtype) = dtype_of_name(dtype) {
            let data = 8 + header_len;
            tracked.push(Tracked::new(name.clone(), dtype, dims, data + start, data + end));
        }
    }
    ranges.sort_unstable();
    tracked.sort_unstable_by_key(|t| t.start);
    let mut at = 0u64;
    for (start, end) in ranges {
        if start != at {
            return fail!(InvalidArgument, "{what}: its tensors overlap or leave a gap at byte {at} of the data");
        }
        at = end;
    }
    if at > data_len {
        return fail!(InvalidArgument, "{what}: its tensors need {at} bytes of data but {data_len} are there");
    }
    if at < data_len {
        return fail!(InvalidArgument, "{what}: {} bytes after the last tensor", data_len - at);
    }
    let metadata = json.get("__metadata__").and_then(Value::as_object);
    let strings = metadata.into_iter().flatten().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())));
    Ok(Frame { metadata: strings.collect(), data_bytes: at, tracked })
}

/// The tensors and metadata of a safetensors file, and the checksums of the tensors computed as
/// they were read (by name; where a tensor's reads allowed it).
type Contents = (HashMap<String, Array>, HashMap<String, String>, HashMap<String, Streamed>);

/// Reads the safetensors file at `path` through MLX: opened once, a regular file, read through
/// that descriptor only.
pub(super) fn read_safetensors(path: &Path) -> Result<Contents> {
    let (file, len) = open_regular(path)?;
    read_source(Data::File(file), len, &path.display().to_string())
}

/// Reads safetensors from `bytes` through MLX, from memory (no temporary file).
pub(super) fn read_safetensors_bytes(bytes: &[u8]) -> Result<Contents> {
    read_source(Data::Bytes(bytes.as_ptr(), bytes.len()), bytes.len() as u64, "the bytes")
}

/// The metadata of the safetensors file at `path` (its frame checked), no tensor read.
pub(super) fn read_metadata(path: &Path) -> Result<HashMap<String, String>> {
    let (file, len) = open_regular(path)?;
    let source = Source { data: RwLock::new(Some(Data::File(file))), len, short: AtomicBool::new(false) };
    Ok(check_frame(&source, &path.display().to_string())?.metadata)
}

/// `read_metadata` of safetensors in `bytes`.
pub(super) fn read_metadata_bytes(bytes: &[u8]) -> Result<HashMap<String, String>> {
    let source = Source {
        data: RwLock::new(Some(Data::Bytes(bytes.as_ptr(), bytes.len()))),
        len: bytes.len() as u64,
        short: AtomicBool::new(false),
    };
    Ok(check_frame(&source, "the bytes")?.metadata)
}

/// Checks the frame, has MLX read the tensors and metadata, and evaluates every tensor, all
/// before the source is revoked (MLX's reads are lazy: the arrays read when evaluated).
fn read_source(data: Data, len: u64, what: &str) -> Result<Contents> {
    let source = Arc::new(Source { data: RwLock::new(Some(data)), len, short: AtomicBool::new(false) });
    let _revoke = Revoke(&source);
    // Only the tensors are MLX's to allocate: a header read alone is not measured against its limit.
    let Frame { data_bytes, tracked, .. } = check_frame(&source, what)?;
    check_alloc(usize::try_from(data_bytes).ok(), &format!("loading {what}"))?;
    let tracked = Arc::new(tracked);
    let reader = Reader { source: Arc::clone(&source), pos: Mutex::new(0), tracked: Arc::clone(&tracked) };
    let desc = Box::into_raw(Box::new(reader)).cast::<c_void>();
    let stream = device::library_stream();
    // SAFETY: `desc` is handed to MLX's reader, which frees it through `free` (or here when no
    // reader was made); the maps are MLX's results, read and freed here; arrays are copied into
    // owned handles, strings into Rust strings.
    let (rc, tensors, metadata) = unsafe {
        let io = mlx_sys::mlx_io_reader_new(desc, VTABLE);
        if io.ctx.is_null() {
            // Left to leak: MLX may have freed it already (a reader made, then its holder not).
            return fail!(Backend, "MLX could not make a reader for {what}");
        }
        let mut arrays = mlx_sys::mlx_map_string_to_array_new();
        let mut strings = mlx_sys::mlx_map_string_to_string_new();
        let rc = mlx_sys::mlx_load_safetensors_reader(&mut arrays, &mut strings, io, stream);
        mlx_sys::mlx_io_reader_free(io);
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
        (rc, tensors, metadata)
    };
    if rc != 0 {
        return fail!(InvalidArgument, "{what} is not a readable safetensors file");
    }
    eval(tensors.values())?;
    if source.short.load(Ordering::Relaxed) {
        return fail!(InvalidArgument, "{what} changed while it was read (fewer bytes than it announced)");
    }
    Ok((tensors, metadata, streamed(&tracked)))
}
