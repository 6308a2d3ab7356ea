//! The MLX runtime this process runs, checked once, at the library's first call, against the
//! versions this library admits. The library is compiled against MLX 0.32.2's headers (its mlx-c,
//! and the template and inline code of MLX's headers that mlx-c instantiates, are inside it), so
//! it admits the MLX versions whose C++ API and array layout are 0.32.2's. Measured with PyPI's
//! `mlx-cpu` wheels against an `MLX=host` build (tests/host_mlx): 0.32.2 and 0.32.3 link and pass;
//! 0.32.1, 0.32.4 (whose allocator API changed) and 0.31.1 do not link at all (the loader or the
//! linker names the missing MLX function). The check is for the rest: a runtime that links but is
//! not one of those is refused, every call `BACKEND` with both versions named, instead of
//! running on a layout nobody checked. Its dev builds (`0.32.2.dev...`) count as their version.
//!
//! `LATENT_CACHE_ADMIT_MLX` (read once) replaces the admitted list: versions separated by
//! commas, or `any` to skip the check (an engine trying a runtime at its own risk).
use once_cell::sync::OnceCell;

use crate::core::error::{error, Result};

/// The MLX versions this library admits (see the module doc).
pub const ADMITTED: &[&str] = &["0.32.2", "0.32.3"];

/// The running MLX's version, as `mlx::core::version()` reports it.
pub fn running_version() -> Result<String> {
    // SAFETY: a fresh mlx-c string, written by mlx_version and freed here; its data is a C string
    // owned by it while it lives.
    unsafe {
        let mut out = mlx_sys::mlx_string_new();
        let rc = mlx_sys::mlx_version(&mut out);
        let data = mlx_sys::mlx_string_data(out);
        let version = match rc == 0 && !data.is_null() {
            true => Some(std::ffi::CStr::from_ptr(data).to_string_lossy().into_owned()),
            false => None,
        };
        mlx_sys::mlx_string_free(out);
        version.ok_or_else(|| error!(Backend, "MLX did not report its version"))
    }
}

/// Whether `running` is one of `admitted` (or a dev build of one).
fn admits(admitted: &[String], running: &str) -> bool {
    admitted.iter().any(|a| a == "any" || running == a || running.starts_with(&format!("{a}.dev")))
}

static CHECKED: OnceCell<std::result::Result<(), String>> = OnceCell::new();

/// `Ok` when the running MLX is admitted; else a `Backend` error naming the running version and
/// the admitted ones (the same for every call of the process).
pub fn check_admitted() -> Result<()> {
    let outcome = CHECKED.get_or_init(|| {
        let admitted: Vec<String> = match std::env::var("LATENT_CACHE_ADMIT_MLX") {
            Ok(list) if !list.trim().is_empty() => list.split(',').map(|v| v.trim().to_string()).collect(),
            _ => ADMITTED.iter().map(|v| v.to_string()).collect(),
        };
        if admitted.iter().any(|a| a == "any") {
            return Ok(());
        }
        let running = running_version().map_err(|e| e.to_string())?;
        match admits(&admitted, &running) {
            true => Ok(()),
            false => Err(format!(
                "this process runs MLX {running}, which latent-cache (built against MLX 0.32.2) does not admit: it \
                 runs on MLX {} (LATENT_CACHE_ADMIT_MLX overrides the list)",
                admitted.join(", ")
            )),
        }
    });
    outcome.clone().map_err(|message| error!(Backend, "{message}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_dev_builds_are_admitted_by_their_version() {
        let admitted: Vec<String> = ADMITTED.iter().map(|v| v.to_string()).collect();
        assert!(admits(&admitted, "0.32.2") && admits(&admitted, "0.32.3"));
        assert!(admits(&admitted, "0.32.2.dev20260101+abcdef"));
        assert!(!admits(&admitted, "0.32.4") && !admits(&admitted, "0.32.1") && !admits(&admitted, "0.31.1"));
        assert!(!admits(&admitted, "0.32.20") && !admits(&admitted, "0.32"));
        assert!(admits(&["any".to_string()], "9.9.9"));
    }

    #[test]
    fn the_runtime_reports_an_admitted_version() {
        let running = running_version().unwrap();
        assert!(admits(&ADMITTED.iter().map(|v| v.to_string()).collect::<Vec<_>>(), &running), "{running}");
    }
}
