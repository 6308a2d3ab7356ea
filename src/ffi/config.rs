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
///
/// The struct grows at its end (docs/packaging.md, "Versions and the ABI"): `struct_size` says
/// which version of it the caller compiled against, so a program built against an older header
/// keeps working with a newer library, and one built against a newer header works with an
/// older library as long as it leaves the fields that library does not know at 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct latent_cache_config {
    /// `sizeof(latent_cache_config)` as the caller's header declares it: set by
    /// `latent_cache_config_default()` (and `latent_cache_config_init`); leave it as they set
    /// it. 0 is read as this version's size.
    pub struct_size: usize,
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
            struct_size: CONFIG_SIZE,
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

/// Writes GLM-5.2's geometry for a sparse-attention (DSA) layer to `*out` (kv_lora_rank 512,
/// rope_head_dim 64, index_head_dim 128, unbounded, every family in float32, rows
/// right-justified; every later field 0) and sets `out->struct_size` to `struct_size`, the
/// size of the caller's `latent_cache_config` (`sizeof *out`). The header's inline
/// `latent_cache_config_default()` calls it; call it directly only from a language that cannot
/// use that inline. Set `index_head_dim = 0` for a layer without index keys.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a `struct_size` no header declares).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_config_init(out: *mut latent_cache_config, struct_size: usize) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        unsafe { write_config(out, struct_size, &GLM_DSA_LAYER) }
    }
}

/// `latent_cache_config_init` for Rust callers of the C layer (its tests and benchmarks); C,
/// C++ and Swift get the header's inline of the same name.
pub fn latent_cache_config_default() -> latent_cache_config {
    GLM_DSA_LAYER
}

/// This library's `latent_cache_config`.
pub(crate) const CONFIG_SIZE: usize = std::mem::size_of::<latent_cache_config>();
/// The largest `struct_size` taken: room for many more fields, and a bound that turns an
/// uninitialized `struct_size` into a refusal rather than a read of stray memory.
const CONFIG_SIZE_MAX: usize = 4096;

/// The size a caller's config says it has (0: this version's), checked: no smaller than the
/// first config with `struct_size` (this one), at most `CONFIG_SIZE_MAX`, a whole number of
/// words.
fn caller_size(struct_size: usize, name: &str) -> FfiResult<usize> {
    let size = if struct_size == 0 { CONFIG_SIZE } else { struct_size };
    if !(CONFIG_SIZE..=CONFIG_SIZE_MAX).contains(&size) || size % std::mem::align_of::<latent_cache_config>() != 0 {
        return Err(Failure::new(
            latent_cache_status::InvalidArgument,
            format!(
                "{name}.struct_size is {struct_size}, which no latent_cache_config declares (this library's is {CONFIG_SIZE}): \
                 start from latent_cache_config_default()"
            ),
        ));
    }
    Ok(size)
}

/// Reads a caller's config of `struct_size` bytes (0: this version's) at `ptr`. A larger config
/// (a newer header's) is taken when every field this library does not know is 0, their
/// default; otherwise `INVALID_ARGUMENT` names the first unknown byte that is set.
///
/// # Safety
/// `ptr` must point to `struct_size` readable bytes (this version's size when 0).
pub(crate) unsafe fn read_config_at(ptr: *const u8, struct_size: usize, name: &str) -> FfiResult<latent_cache_config> {
    let size = caller_size(struct_size, name)?;
    // SAFETY: the caller's promise: `size` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, size) };
    if let Some(at) = bytes[CONFIG_SIZE..].iter().position(|&b| b != 0) {
        return Err(Failure::new(
            latent_cache_status::InvalidArgument,
            format!(
                "{name} sets a field this library does not know (byte {} of its {size}; this library's config has {CONFIG_SIZE}): \
                 a newer header's option needs a newer library",
                CONFIG_SIZE + at
            ),
        ));
    }
    // SAFETY: at least CONFIG_SIZE readable bytes, and every bit pattern of the plain integer
    // fields is a valid latent_cache_config; read unaligned since it comes as bytes.
    let mut config = unsafe { ptr.cast::<latent_cache_config>().read_unaligned() };
    config.struct_size = CONFIG_SIZE;
    Ok(config)
}

/// Reads the config `ptr` points to (its own `struct_size` says how large it is).
pub(crate) unsafe fn read_config(ptr: *const latent_cache_config, name: &str) -> FfiResult<latent_cache_config> {
    if ptr.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: `struct_size` is the first field, at offset 0 of every version of the struct.
    let struct_size = unsafe { ptr.cast::<usize>().read() };
    unsafe { read_config_at(ptr.cast(), struct_size, name) }
}

/// Writes `value` into a caller's config of `struct_size` bytes: this library's fields, the
/// fields it does not know set to 0 (their defaults), and `struct_size` the caller's.
///
/// # Safety
/// `out` must point to `struct_size` writable bytes.
pub(crate) unsafe fn write_config(out: *mut latent_cache_config, struct_size: usize, value: &latent_cache_config) -> FfiResult {
    let size = caller_size(struct_size, "out")?;
    let mut config = *value;
    config.struct_size = size;
    // SAFETY: the caller's promise: `size` (at least CONFIG_SIZE) writable bytes.
    unsafe {
        out.cast::<u8>().add(CONFIG_SIZE).write_bytes(0, size - CONFIG_SIZE);
        out.write_unaligned(config);
    }
    Ok(())
}

const GLM_DSA_LAYER: latent_cache_config = latent_cache_config {
    struct_size: CONFIG_SIZE,
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
        let config = unsafe { read_config(config, "config") }?;
        let bytes = projected_bytes(&config.geometry()?, batch, tokens)?;
        unsafe { write(out, bytes) };
        Ok(())
    }
}

/// `*out` = the config the cache was made with (or loaded as): its geometry, storage modes,
/// layout, role and composition (`hot_window`, `hot_storage`). `struct_size` is the size of the
/// caller's `latent_cache_config` (`sizeof *out`); the header's inline
/// `latent_cache_get_config(cache, out)` passes it.
/// Returns `OK`, `NULL_ARGUMENT` (cache or out NULL), `INVALID_ARGUMENT` (a `struct_size` no
/// header declares); nothing is written on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_get_config_sized(
    cache: *const latent_cache,
    out: *mut latent_cache_config,
    struct_size: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        caller_size(struct_size, "out")?;
        let config = with_cache(cache, |cache| Ok(latent_cache_config::of(cache.geometry())))?;
        unsafe { write_config(out, struct_size, &config) }
    }
}

/// `latent_cache_get_config_sized` for Rust callers of the C layer (C, C++ and Swift get the
/// header's inline of the same name).
pub unsafe fn latent_cache_get_config(cache: *const latent_cache, out: *mut latent_cache_config) -> latent_cache_status {
    unsafe { latent_cache_get_config_sized(cache, out, CONFIG_SIZE) }
}
