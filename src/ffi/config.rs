//! `latent_cache_config`: a layer's geometry as C passes it to `latent_cache_new`, its
//! defaults, the bytes it would hold, and the config a cache was made with.
use super::args::{out_ptr, write};
use super::error::{Failure, FfiResult};
use super::handle::{latent_cache, with_cache};
use super::layout::{latent_cache_layout, layout_kind};
use super::panic::ffi_boundary;
use super::role::{latent_cache_role, role};
use super::status::latent_cache_status;
use super::storage::{latent_cache_storage, storage_mode};
use crate::core::model::budget::projected_bytes;
use crate::core::{Geometry, StorageMode};

/// Geometry of one layer's cache. Start from `latent_cache_config_default()` and set the fields
/// you need, so that code written today keeps compiling and meaning the same when fields are
/// added. A field left 0 keeps the default behaviour.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct latent_cache_config {
    /// Width of the compressed KV latent per position (GLM-5.2: 512). From 1 to 1,048,576.
    pub kv_lora_rank: usize,
    /// Width of the decoupled RoPE key per position (GLM-5.2: 64). From 1 to 1,048,576.
    pub rope_head_dim: usize,
    /// Width of the DSA index key per position (GLM-5.2: 128 on sparse-attention layers);
    /// 0 for a layer without index keys; at most 1,048,576.
    pub index_head_dim: usize,
    /// Most positions a row may hold; 0 for unbounded (then INT32_MAX, MLX's largest extent).
    /// At most INT32_MAX.
    pub max_tokens: usize,
    /// How the latent is stored: a `latent_cache_storage` value (0, `F32`, is exact).
    pub latent_storage: u32,
    /// How the rope key is stored: a `latent_cache_storage` value.
    pub rope_storage: u32,
    /// How the index keys are stored: a `latent_cache_storage` value; ignored on a layer
    /// without index keys (any value is then accepted; one that names no mode reads back as
    /// `F32` from `latent_cache_get_config`).
    pub index_storage: u32,
    /// How rows sit in the stored window: a `latent_cache_layout` value (0, right-justified,
    /// is the seed's layout).
    pub layout: u32,
    /// Which model layer the cache serves: a `latent_cache_role` value (0, a target-model layer).
    pub role: u32,
    /// The float mode of composed storage's hot positions: a `latent_cache_storage` value,
    /// `F32` (0), `BF16` or `F16`; ignored while `hot_window` is 0 (any value is then
    /// accepted; one that names no mode reads back as `F32` from `latent_cache_get_config`).
    pub hot_storage: u32,
    /// Composed storage: 0 (the default) stores every position in its family's mode. Otherwise
    /// the newest `hot_window` positions of every row (up to 63 more: boundaries move in blocks
    /// of 64 positions) are read in `hot_storage`, older ones in their family's mode. Families
    /// stored in `hot_storage` itself are not composed; a family more precise than
    /// `hot_storage`, or no family to compose, is refused. See "Composed storage" in the header.
    pub hot_window: usize,
}

impl latent_cache_config {
    /// The config that makes a cache of `geometry`.
    pub(crate) fn of(geometry: &Geometry) -> Self {
        latent_cache_config {
            kv_lora_rank: geometry.kv_lora_rank,
            rope_head_dim: geometry.rope_head_dim,
            index_head_dim: geometry.index_head_dim,
            max_tokens: geometry.max_tokens,
            latent_storage: latent_cache_storage::of(geometry.latent_storage) as u32,
            rope_storage: latent_cache_storage::of(geometry.rope_storage) as u32,
            index_storage: latent_cache_storage::of(geometry.index_storage) as u32,
            layout: latent_cache_layout::of(geometry.layout) as u32,
            role: latent_cache_role::of(geometry.role) as u32,
            hot_storage: latent_cache_storage::of(geometry.hot_storage) as u32,
            hot_window: geometry.hot_window,
        }
    }

    pub(crate) fn geometry(&self) -> FfiResult<Geometry> {
        let geometry = Geometry {
            kv_lora_rank: self.kv_lora_rank,
            rope_head_dim: self.rope_head_dim,
            index_head_dim: self.index_head_dim,
            max_tokens: self.max_tokens,
            latent_storage: storage_mode(self.latent_storage, "latent_storage")?,
            rope_storage: storage_mode(self.rope_storage, "rope_storage")?,
            index_storage: ignorable_storage(self.index_storage, "index_storage", self.index_head_dim == 0)?,
            layout: layout_kind(self.layout)?,
            role: role(self.role)?,
            hot_window: self.hot_window,
            hot_storage: ignorable_storage(self.hot_storage, "hot_storage", self.hot_window == 0)?,
        };
        geometry.validate()?;
        Ok(geometry)
    }
}

/// A storage field's mode; where the field is `ignored` (no index keys, no composition), any
/// value: one that names no mode is the default, `F32`.
fn ignorable_storage(value: u32, name: &str, ignored: bool) -> FfiResult<StorageMode> {
    match storage_mode(value, name) {
        Err(_) if ignored => Ok(StorageMode::F32),
        mode => mode,
    }
}

/// GLM-5.2's geometry for a sparse-attention (DSA) layer: kv_lora_rank 512, rope_head_dim 64,
/// index_head_dim 128, unbounded, every family in float32, rows right-justified. Set
/// `index_head_dim = 0` for a layer without index keys.
/// Never fails.
#[no_mangle]
pub extern "C" fn latent_cache_config_default() -> latent_cache_config {
    ffi_boundary!(on_panic = GLM_DSA_LAYER; GLM_DSA_LAYER)
}

const GLM_DSA_LAYER: latent_cache_config = latent_cache_config {
    kv_lora_rank: 512,
    rope_head_dim: 64,
    index_head_dim: 128,
    max_tokens: 0,
    latent_storage: 0,
    rope_storage: 0,
    index_storage: 0,
    layout: 0,
    role: 0,
    hot_storage: 0,
    hot_window: 0,
};

/// `*out` = the bytes `batch` rows of `tokens` positions would hold in a cache made from
/// `*config` (`batch * tokens * bytes_per_token`): admission control before a request is
/// created. Buffers grow in steps, so a cache may hold up to one growth step more; with composed
/// storage, plus its hot side (about twice `hot_window + 64` positions per row, plus the last
/// append's length, in `hot_storage`, of the composed families).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a config `latent_cache_new` refuses),
/// `CAPACITY` (the product overflows `size_t`).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_projected_bytes(
    config: *const latent_cache_config,
    batch: usize,
    tokens: usize,
    out: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        // SAFETY: a non-NULL config is a readable latent_cache_config (the caller's promise).
        let config = unsafe { config.as_ref() }.ok_or_else(|| Failure::null("config"))?;
        let bytes = projected_bytes(&config.geometry()?, batch, tokens)?;
        unsafe { write(out, bytes) };
        Ok(())
    }
}

/// `*out` = the config the cache was made with (or loaded as): its geometry, storage modes,
/// layout, role and composition (`hot_window`, `hot_storage`).
/// Returns `OK`, or `NULL_ARGUMENT` when cache or out is NULL (nothing is written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_get_config(
    cache: *const latent_cache,
    out: *mut latent_cache_config,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        with_cache(cache, |cache| {
            unsafe { write(out, latent_cache_config::of(cache.geometry())) };
            Ok(())
        })
    }
}
