//! `latent_cache_status_name`: a status's name for logs and exception messages. Apart from
//! `status` because an export runs inside the panic boundary, which itself returns statuses.
use std::ffi::c_char;

use super::panic::ffi_boundary;

/// The status's name without the `LATENT_CACHE_STATUS_` prefix ("OK", "NULL_ARGUMENT", ...), as
/// a static NUL-terminated string (never NULL, never freed); "UNKNOWN" for a value that is not a
/// `latent_cache_status`. For logs and exception messages.
#[no_mangle]
pub extern "C" fn latent_cache_status_name(status: u32) -> *const c_char {
    ffi_boundary!(on_panic = c"UNKNOWN".as_ptr();
        let name = match status {
            0 => c"OK",
            1 => c"NULL_ARGUMENT",
            2 => c"INVALID_ARGUMENT",
            3 => c"SHAPE",
            4 => c"DTYPE",
            5 => c"OUT_OF_RANGE",
            6 => c"INVALID_STATE",
            7 => c"CAPACITY",
            8 => c"BUFFER_TOO_SMALL",
            9 => c"BACKEND",
            10 => c"PANIC",
            _ => c"UNKNOWN",
        };
        name.as_ptr()
    )
}
