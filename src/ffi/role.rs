//! `latent_cache_role`: which model layer a cache serves, chosen in the config, and its checked
//! conversion from the integer C passes.
use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::Role;

/// Which model layer a cache serves (the config's `role`, passed as `uint32_t`). It is part of
/// the signature (`latent_cache_signature`), and caches of different roles never merge.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_role {
    /// A layer of the target model (signature `kv:mla:target`, or `kv:mla:target:dsa` with
    /// index keys).
    Target = 0,
    /// GLM-5.2's multi-token-prediction layer: its own MLA cache, never with index keys
    /// (signature `kv:mla:mtp`; `index_head_dim` must be 0).
    Mtp = 1,
}

impl latent_cache_role {
    pub(crate) fn of(role: Role) -> Self {
        match role {
            Role::Target => latent_cache_role::Target,
            Role::Mtp => latent_cache_role::Mtp,
        }
    }
}

/// Converts a `latent_cache_role` value received as an integer.
pub(crate) fn role(value: u32) -> FfiResult<Role> {
    match value {
        v if v == latent_cache_role::Target as u32 => Ok(Role::Target),
        v if v == latent_cache_role::Mtp as u32 => Ok(Role::Mtp),
        _ => Err(Failure::new(latent_cache_status::InvalidArgument, format!("role {value} is not a latent_cache_role"))),
    }
}
