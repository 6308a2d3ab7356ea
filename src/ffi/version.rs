//! The library version at run time; the header's LATENT_CACHE_VERSION macros give it at compile
//! time (a test checks they agree with Cargo.toml).
use std::ffi::c_char;

use super::panic::ffi_boundary;

static VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// The library's version as a static NUL-terminated string ("MAJOR.MINOR.PATCH"); never NULL,
/// never freed.
#[no_mangle]
pub extern "C" fn latent_cache_version() -> *const c_char {
    ffi_boundary!(on_panic = VERSION.as_ptr().cast(); VERSION.as_ptr().cast())
}
