//! Writes in place under a pipelined decode loop. MLX writes into a buffer in place only when
//! nothing but the array being written holds it; otherwise it copies the whole buffer. Besides
//! the engine's own views, what holds a buffer is MLX's work in flight: every backend keeps a
//! kernel's inputs referenced until its work has completed. An engine that hands step n + 1 to
//! MLX before step n has finished (mlx-lm's `generate_step`, mlx-swift-lm's loop) appends into
//! buffers step n's attention still reads, and each such append would copy its layer's history.
//!
//! So before an append builds its write, the library looks at who holds the buffer
//! (`lc_mlx_data_holders`, the shared count of MLX's buffer) and, while the work in flight still
//! holds it, waits for that work to let go: the layer's reads of the previous step complete
//! long before the whole step does (MLX hands a step to the device in batches of operations and
//! releases each batch's inputs when it completes), so the host builds step n + 1 a layer behind
//! the device's progress on step n, and both still overlap. The poll lasts while MLX counts work
//! in flight, then the library's stream is synchronised. A buffer still held after that is held
//! by views someone keeps (an engine's
//! views of an earlier step, a donor not yet freed): the write then copies, as it always did,
//! and the buffer's next waits are skipped for a while, so a loop that keeps views pays the
//! wait rarely, not at every append.
//!
//! `LATENT_CACHE_WAIT_FOR_READERS=0` turns the wait off (read once), to measure what it saves.
use std::time::{Duration, Instant};

use mlx_rs::Array;
use once_cell::sync::Lazy;

use crate::core::error::Result;
use crate::core::mlx::eval::settle;

/// Whether appends wait for readers in flight (the default).
static ENABLED: Lazy<bool> = Lazy::new(|| std::env::var("LATENT_CACHE_WAIT_FOR_READERS").map_or(true, |v| v.trim() != "0"));

/// Longest the host polls for the work in flight to let go before it synchronises the stream:
/// longer than a decode step's device time, so the poll ends when the layer's reads complete (or
/// when MLX counts nothing in flight: then the synchronisation covers what it does not count).
const POLL: Duration = Duration::from_millis(250);

/// Longest pause between two looks at the holders.
const MAX_PAUSE: Duration = Duration::from_micros(50);

/// Appends that skip the wait on a buffer found held by views after a full wait.
pub(crate) const SKIP_AFTER_VIEWS: u32 = 64;

/// References holding `a`'s buffer (0 before it is evaluated).
fn holders(a: &Array) -> i64 {
    // SAFETY: a valid array handle; the call only reads the shared count of its buffer.
    unsafe { mlx_sys::lc_mlx_data_holders(a.as_ptr()) as i64 }
}

/// Whether something besides `a` itself (a view, another array over its buffer, work in
/// flight) holds `a`'s buffer.
pub fn held_elsewhere(a: &Array) -> bool {
    holders(a) > 1
}

/// Whether MLX counts work in flight.
fn in_flight() -> bool {
    // SAFETY: reads the scheduler's count.
    unsafe { mlx_sys::lc_mlx_active_tasks() > 0 }
}

/// Whether some buffer of `arrays` is held by more than its array.
fn shared(arrays: &[Array]) -> bool {
    arrays.iter().any(|a| holders(a) > 1)
}

/// What a wait found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holders {
    /// Every buffer is held by its array alone: the write is done in place.
    Alone,
    /// Some buffer is held by views someone keeps: the write copies it.
    Views,
}

/// Waits until the work in flight has let go of the buffers of `arrays` (see the module doc).
/// `skip` (the caller is skipping waits on these buffers) answers `Views` at once.
pub fn wait_for_readers(arrays: &[Array], skip: bool) -> Result<Holders> {
    if !*ENABLED || !shared(arrays) {
        return Ok(Holders::Alone);
    }
    if skip {
        return Ok(Holders::Views);
    }
    let deadline = Instant::now() + POLL;
    let mut pause = Duration::from_micros(2);
    while in_flight() && Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
        if !shared(arrays) {
            return Ok(Holders::Alone);
        }
    }
    settle()?;
    Ok(if shared(arrays) { Holders::Views } else { Holders::Alone })
}
