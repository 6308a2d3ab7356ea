//! The registry behind every opaque handle (caches, sets, donors). The pointer C holds is a
//! token, not an address: a number drawn once from a process-wide counter and never reused,
//! looked up in the registry of its type. A NULL, foreign or freed handle, or one of another
//! type, is refused on every call, even when the allocator has since reused memory, and a
//! second free touches nothing.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use once_cell::sync::Lazy;

use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;

/// Tokens step by 16 so they look like aligned pointers to tools that inspect them; the counter
/// starts at 1 so no token is NULL. A 64-bit counter does not wrap within a process's life.
const TOKEN_STEP: usize = 16;
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

/// A fresh token, never handed out before (every registry draws from this one counter, so a
/// token of one type is never live in another's registry).
fn next_token() -> usize {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) * TOKEN_STEP
}

type Live<T> = RwLock<HashMap<usize, Arc<T>>>;

fn empty<T>() -> Live<T> {
    RwLock::new(HashMap::new())
}

/// Live values of one handle type by token. Calls hold an `Arc` for their duration, so a free
/// racing a call releases the value only after that call returns.
pub(crate) struct Registry<T> {
    live: Lazy<Live<T>>,
    /// What a refused handle is not, after "`name` is not a live ".
    not_live: &'static str,
}

/// What `Registry::remove_if` did.
pub(crate) enum Removal<T> {
    Removed(Arc<T>),
    NotLive,
    /// Live, and left alone (the condition refused it).
    Kept,
}

impl<T> Registry<T> {
    /// An empty registry; a refused handle's message says it `is not a live {not_live}`.
    pub(crate) const fn new(not_live: &'static str) -> Self {
        Registry { live: Lazy::new(empty::<T>), not_live }
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<usize, Arc<T>>> {
        self.live.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<usize, Arc<T>>> {
        self.live.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `value` under a new token; the token, as a pointer, is what C holds.
    pub(crate) fn insert<P>(&self, value: Arc<T>) -> *mut P {
        let token = next_token();
        self.write().insert(token, value);
        token as *mut P
    }

    /// The live value behind `ptr`; NULL and tokens not live here are refused (`NULL_ARGUMENT`),
    /// the message naming the argument `name`.
    pub(crate) fn get<P>(&self, ptr: *const P, name: &str) -> FfiResult<Arc<T>> {
        if ptr.is_null() {
            return Err(Failure::null(name));
        }
        self.read()
            .get(&(ptr as usize))
            .cloned()
            .ok_or_else(|| Failure::new(latent_cache_status::NullArgument, format!("{name} is not a live {}", self.not_live)))
    }

    /// Unregisters `ptr` when `remove(value)` allows it; the value is dropped once no call
    /// holds it.
    pub(crate) fn remove_if<P>(&self, ptr: *const P, remove: impl FnOnce(&T) -> bool) -> Removal<T> {
        let mut live = self.write();
        match live.get(&(ptr as usize)) {
            None => Removal::NotLive,
            Some(value) if !remove(value) => Removal::Kept,
            Some(_) => live.remove(&(ptr as usize)).map_or(Removal::NotLive, Removal::Removed),
        }
    }

    /// Unregisters `ptr`; `None` when it was not live.
    pub(crate) fn remove<P>(&self, ptr: *const P) -> Option<Arc<T>> {
        match self.remove_if(ptr, |_| true) {
            Removal::Removed(value) => Some(value),
            Removal::NotLive | Removal::Kept => None,
        }
    }
}
