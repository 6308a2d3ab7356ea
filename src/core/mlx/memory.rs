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

/// Refuses (CAPACITY) an allocation of `bytes` (`None`: beyond `usize`) that would take MLX's
/// active memory past its memory limit (`mlx_set_memory_limit`; by default a share of the
/// device's memory). `what` names the request in the message.
pub fn check_alloc(bytes: Option<usize>, what: &str) -> Result<()> {
    let (limit, active) = limit_and_active();
    match bytes {
        Some(bytes) if bytes <= limit.saturating_sub(active) => Ok(()),
        Some(bytes) => fail!(
            Capacity,
            "{what} needs {bytes} bytes; MLX has {active} of its {limit}-byte memory limit in use (mlx_set_memory_limit raises it)"
        ),
        None => fail!(Capacity, "{what} needs more bytes than this process can address"),
    }
}
