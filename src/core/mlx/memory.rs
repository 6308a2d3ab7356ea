//! The allocation check: every buffer the library allocates is checked against MLX's memory
//! limit before any graph is built. MLX's CPU allocator does not refuse an allocation it cannot
//! make (it hands out a NULL buffer and the next kernel writes through it), so a request the
//! process cannot hold must be refused here, as a status, with nothing changed.
use crate::core::error::{fail, Result};

/// MLX's memory limit and the bytes its arrays hold now.
fn limit_and_active() -> (usize, usize) {
    let (mut limit, mut active) = (0usize, 0usize);
    // SAFETY: plain getters writing one integer each.
    unsafe {
        mlx_sys::mlx_get_memory_limit(&mut limit);
        mlx_sys::mlx_get_active_memory(&mut active);
    }
    (limit, active)
}

/// The machine's physical memory in bytes (`usize::MAX` where the system does not say).
fn physical_memory() -> usize {
    // SAFETY: sysconf reads two system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 && page > 0 => pages.saturating_mul(page),
        _ => usize::MAX,
    }
}

/// Refuses (CAPACITY) an allocation of `bytes` (`None`: beyond `usize`) that would take MLX's
/// active memory past its memory limit (`mlx_set_memory_limit`; by default a share of the
/// device's memory) or past the machine's physical memory, whichever is lower: an engine may
/// raise MLX's limit to anything (`SIZE_MAX` included), and MLX's CPU allocator then hands out
/// a NULL buffer for what it cannot allocate, which its next kernel writes through. `what`
/// names the request in the message.
pub fn check_alloc(bytes: Option<usize>, what: &str) -> Result<()> {
    let (limit, active) = limit_and_active();
    let physical = physical_memory();
    match bytes {
        Some(bytes) if bytes <= limit.min(physical).saturating_sub(active) => Ok(()),
        Some(bytes) if bytes <= limit.saturating_sub(active) => fail!(
            Capacity,
            "{what} needs {bytes} bytes; MLX has {active} bytes in use on a machine of {physical} bytes of memory"
        ),
        Some(bytes) => fail!(
            Capacity,
            "{what} needs {bytes} bytes; MLX has {active} of its {limit}-byte memory limit in use (latent_cache_set_memory_limit raises it)"
        ),
        None => fail!(Capacity, "{what} needs more bytes than this process can address"),
    }
}

/// What MLX's allocator holds, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Held by live arrays.
    pub active: usize,
    /// Freed by arrays but kept by MLX for reuse (returned to the system by `clear_cache`).
    pub cache: usize,
    /// The most `active` has been since the process started (or MLX's peak was reset).
    pub peak: usize,
    /// The limit `check_alloc` and MLX's own allocator measure requests against.
    pub limit: usize,
}

pub fn info() -> MemoryInfo {
    let (limit, active) = limit_and_active();
    let (mut cache, mut peak) = (0usize, 0usize);
    // SAFETY: plain getters writing one integer each.
    unsafe {
        mlx_sys::mlx_get_cache_memory(&mut cache);
        mlx_sys::mlx_get_peak_memory(&mut peak);
    }
    MemoryInfo { active, cache, peak, limit }
}

/// Sets MLX's memory limit (process-wide; what every later allocation check measures against)
/// and returns the previous one.
pub fn set_limit(bytes: usize) -> Result<usize> {
    let mut previous = 0usize;
    // SAFETY: a plain setter writing the previous limit to one integer.
    if unsafe { mlx_sys::mlx_set_memory_limit(&mut previous, bytes) } != 0 {
        return fail!(Backend, "MLX refused the memory limit {bytes}");
    }
    Ok(previous)
}

/// Returns the buffers MLX keeps for reuse to the system (arrays still alive are untouched).
pub fn clear_cache() -> Result<()> {
    // SAFETY: no arguments; MLX's allocator locks itself.
    if unsafe { mlx_sys::mlx_clear_cache() } != 0 {
        return fail!(Backend, "MLX could not clear its buffer cache");
    }
    Ok(())
}

/// Starts MLX's peak count again from the memory active now (what a measurement of one call's
/// transient allocations needs).
pub fn reset_peak() -> Result<()> {
    // SAFETY: no arguments; MLX's allocator locks itself.
    if unsafe { mlx_sys::mlx_reset_peak_memory() } != 0 {
        return fail!(Backend, "MLX could not reset its peak memory");
    }
    Ok(())
}
