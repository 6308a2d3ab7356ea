//! The per-thread last failure message, and the failure type the export bodies return.
use std::cell::RefCell;

use super::status::latent_cache_status;
use crate::core::CacheError;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A failed call: the status to return and the message to keep for this thread.
#[derive(Debug)]
pub struct Failure {
    pub status: latent_cache_status,
    pub message: String,
}

impl Failure {
    pub fn new(status: latent_cache_status, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }

    pub fn null(name: &str) -> Self {
        Failure::new(latent_cache_status::NullArgument, format!("{name} is NULL"))
    }

    /// The same failure, its message naming where it happened (`"layers[3]: ..."`).
    pub fn prefixed(self, what: &str) -> Self {
        Failure { status: self.status, message: format!("{what}: {}", self.message) }
    }
}

impl From<CacheError> for Failure {
    fn from(err: CacheError) -> Self {
        Failure { status: err.kind.into(), message: err.message }
    }
}

pub type FfiResult<T = ()> = Result<T, Failure>;

pub(crate) fn set_last_error(message: &str) {
    LAST_ERROR.with(|last| {
        let mut last = last.borrow_mut();
        last.clear();
        last.push_str(message);
    });
}

/// Runs `f` on this thread's last failure message.
pub(crate) fn with_last_error<T>(f: impl FnOnce(&str) -> T) -> T {
    LAST_ERROR.with(|last| f(&last.borrow()))
}
