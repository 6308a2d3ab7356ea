//! Reading a safetensors file through MLX's own loader, after checking what MLX would otherwise
//! hand to a format string: the path, and the file's frame and header.
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::Path;

use mlx_rs::Array;

use crate::core::error::{error, fail, Result};
use crate::core::mlx::ops;

fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| error!(InvalidArgument, "{s:?} contains a NUL byte"))
}

/// A path MLX may be handed. MLX's C API formats its error messages (which quote paths) with the
/// message as a format string, so a `%` in a path could crash the process: refused.
pub(super) fn mlx_path(path: &Path) -> Result<CString> {
    let s = path.to_string_lossy();
    if s.contains('%') {
        return fail!(InvalidArgument, "{s:?}: paths with '%' are refused (MLX would read it as a format conversion)");
    }
    cstring(&s)
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
pub(super) fn read_safetensors(path: &Path) -> Result<(HashMap<String, Array>, HashMap<String, String>)> {
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
