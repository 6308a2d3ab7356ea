//! The status code every fallible export returns. Numbers are part of the ABI: never reuse or
//! renumber one; add new codes at the end.
use crate::core::ErrorKind;

/// Result of a call. `LATENT_CACHE_STATUS_OK` is 0; every other value is a failure, after which
/// `latent_cache_last_error` holds a message and the cache is exactly as it was before the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_status {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL (or a handle was not a live cache).
    NullArgument = 1,
    /// An argument is outside what the call accepts (zero counts, a wrong family, a config's
    /// `struct_size` no header declares, duplicate rows).
    InvalidArgument = 2,
    /// An array or buffer has the wrong rank, width, batch, token count or length.
    Shape = 3,
    /// An array's element type is not one the call takes (appends: float32, bfloat16 or
    /// float16; host arrays: `latent_cache_dtype`'s FLOAT32, BFLOAT16, FLOAT16 or INT32).
    Dtype = 4,
    /// A row, count or position beyond what the cache holds.
    OutOfRange = 5,
    /// The call is not allowed in the cache's current state (speculative round misuse, a
    /// non-empty merge destination).
    InvalidState = 6,
    /// Beyond what the cache may hold: `max_tokens`, INT32_MAX positions, or memory MLX's
    /// memory limit does not leave (nothing was allocated).
    Capacity = 7,
    /// The caller's output buffer is too small; nothing was written.
    BufferTooSmall = 8,
    /// MLX itself failed.
    Backend = 9,
    /// The library panicked; the panic was caught at the boundary. The handle involved should be
    /// freed.
    Panic = 10,
}

impl From<ErrorKind> for latent_cache_status {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => latent_cache_status::InvalidArgument,
            ErrorKind::Shape => latent_cache_status::Shape,
            ErrorKind::Dtype => latent_cache_status::Dtype,
            ErrorKind::OutOfRange => latent_cache_status::OutOfRange,
            ErrorKind::State => latent_cache_status::InvalidState,
            ErrorKind::Capacity => latent_cache_status::Capacity,
            ErrorKind::Backend => latent_cache_status::Backend,
        }
    }
}
