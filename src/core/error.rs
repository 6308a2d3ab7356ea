//! The core's error type: a kind the FFI maps to a status code, and a message for the user.
use std::fmt;

/// What went wrong, coarse enough to map one-to-one onto the C status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// An argument is outside what the call accepts (a zero count, an unknown option).
    InvalidArgument,
    /// An array has the wrong rank, width, batch or token count.
    Shape,
    /// An array is not float32.
    Dtype,
    /// A row, count or position beyond what the cache holds.
    OutOfRange,
    /// The call is not allowed in the cache's current state (round misuse, empty cache).
    State,
    /// Beyond what the cache may hold: `max_tokens`, INT32_MAX positions, or memory MLX's
    /// memory limit does not leave.
    Capacity,
    /// MLX itself failed.
    Backend,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CacheError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CacheError { kind, message: message.into() }
    }
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CacheError {}

impl From<mlx_rs::error::Exception> for CacheError {
    fn from(err: mlx_rs::error::Exception) -> Self {
        CacheError::new(ErrorKind::Backend, format!("MLX: {}", without_source_location(err.what())))
    }
}

/// MLX's message without the ` at /path/to/file.cpp:123` mlx-c appends: the path is the MLX
/// build machine's, meaningless to the user.
fn without_source_location(message: &str) -> &str {
    match message.rfind(" at ") {
        Some(at) => {
            let location = &message[at + 4..];
            let is_location = location
                .rsplit_once(':')
                .is_some_and(|(file, line)| !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()));
            if is_location {
                message[..at].trim_end()
            } else {
                message
            }
        }
        None => message,
    }
}

pub type Result<T> = std::result::Result<T, CacheError>;

/// Builds an `Err` of the given kind with a formatted message.
macro_rules! fail {
    ($kind:ident, $($arg:tt)*) => {
        Err($crate::core::error::CacheError::new(
            $crate::core::error::ErrorKind::$kind,
            format!($($arg)*),
        ))
    };
}
pub(crate) use fail;

/// A `CacheError` of `kind` with a formatted message (for `map_err`).
macro_rules! error {
    ($kind:ident, $($arg:tt)*) => {
        $crate::core::error::CacheError::new($crate::core::error::ErrorKind::$kind, format!($($arg)*))
    };
}
pub(crate) use error;

#[cfg(test)]
mod tests {
    use super::without_source_location;

    #[test]
    fn mlx_source_locations_are_dropped() {
        let raw = "[eval] There is no Stream(cpu, 3) in current thread. at /Users/build/mlx-c/mlx/c/transforms.cpp:42";
        assert_eq!(without_source_location(raw), "[eval] There is no Stream(cpu, 3) in current thread.");
        assert_eq!(without_source_location("[slice] bad at index 3"), "[slice] bad at index 3");
        assert_eq!(without_source_location("plain"), "plain");
    }
}
