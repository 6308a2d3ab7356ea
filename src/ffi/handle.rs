//! The opaque `latent_cache` handle: live caches in their registry (see `registry`: tokens,
//! never reused, so a NULL, foreign or freed handle is refused on every call), each locked for
//! one call at a time.
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::{Failure, FfiResult};
use super::registry::{Registry, Removal};
use super::status::latent_cache_status;
use crate::core::LatentCache;

/// One layer's cache, as C names it. Opaque and never dereferenced: a `latent_cache*` is a
/// token from `latent_cache_new` (or `latent_cache_extract_row`), released with
/// `latent_cache_free`.
pub struct latent_cache {
    _opaque: [u8; 0],
}

/// A live cache. Calls hold an `Arc` for their duration, so a free racing a call releases the
/// cache only after that call returns.
pub(crate) struct Handle {
    /// Serializes every call on this cache: a call's validate-then-commit must not interleave
    /// with another's.
    inner: Mutex<LatentCache>,
    /// A layer of a `latent_cache_set`: lent to the caller, released only with its set.
    owned_by_set: bool,
}

/// What `Handle::release` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Release {
    Released,
    NotLive,
    /// A set's layer: left alone (the set releases it).
    OwnedBySet,
}

/// Live caches by token.
static CACHES: Registry<Handle> = Registry::new("latent_cache (freed, or never created by this library)");

impl Handle {
    /// Registers a cache under a new token; the token is what C holds.
    pub(crate) fn register(cache: LatentCache) -> *mut latent_cache {
        Self::register_as(cache, false).0
    }

    /// Registers a set's layer: callable like any cache, released only by its set.
    pub(crate) fn register_layer(cache: LatentCache) -> (*mut latent_cache, Arc<Handle>) {
        Self::register_as(cache, true)
    }

    fn register_as(cache: LatentCache, owned_by_set: bool) -> (*mut latent_cache, Arc<Handle>) {
        let handle = Arc::new(Handle { inner: Mutex::new(cache), owned_by_set });
        (CACHES.insert(handle.clone()), handle)
    }

    /// Unregisters a token; its cache is dropped once no call holds it. A set's layer is left
    /// alone unless `by_set`.
    pub(crate) fn release(ptr: *const latent_cache, by_set: bool) -> Release {
        match CACHES.remove_if(ptr, |handle| !handle.owned_by_set || by_set) {
            Removal::Removed(_) => Release::Released,
            Removal::NotLive => Release::NotLive,
            Removal::Kept => Release::OwnedBySet,
        }
    }

    /// The live cache behind a token.
    pub(crate) fn get(ptr: *const latent_cache, name: &str) -> FfiResult<Arc<Handle>> {
        CACHES.get(ptr, name)
    }

    /// Locks the cache for one call.
    pub(crate) fn lock(&self) -> FfiResult<MutexGuard<'_, LatentCache>> {
        self.inner.lock().map_err(|_| {
            Failure::new(latent_cache_status::Panic, "this cache was left unusable by an earlier internal panic; free it")
        })
    }
}

/// Looks up `ptr`, locks its cache and runs `f` on it.
pub(crate) fn with_cache<T>(ptr: *const latent_cache, f: impl FnOnce(&mut LatentCache) -> FfiResult<T>) -> FfiResult<T> {
    let handle = Handle::get(ptr, "cache")?;
    let mut cache = handle.lock()?;
    f(&mut cache)
}
