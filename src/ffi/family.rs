//! `latent_cache_family`: which state family a host read addresses, and its checked conversion
//! from the integer C passes.
use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::Family;

/// The state families, for the `family` argument of the host reads (passed as `uint32_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub enum latent_cache_family {
    /// The compressed KV latent, `kv_lora_rank` wide.
    Latent = 0,
    /// The decoupled RoPE key, `rope_head_dim` wide.
    Rope = 1,
    /// The DSA index key, `index_head_dim` wide (DSA layers only).
    IndexKeys = 2,
}

/// Converts a `latent_cache_family` value received as an integer (an out-of-range C enum value
/// must not become a Rust enum).
pub(crate) fn family(value: u32) -> FfiResult<Family> {
    match value {
        v if v == latent_cache_family::Latent as u32 => Ok(Family::Latent),
        v if v == latent_cache_family::Rope as u32 => Ok(Family::Rope),
        v if v == latent_cache_family::IndexKeys as u32 => Ok(Family::IndexKeys),
        _ => Err(Failure::new(latent_cache_status::InvalidArgument, format!("family {value} is not a latent_cache_family"))),
    }
}
