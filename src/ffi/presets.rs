//! GLM-5.2's presets: its layers' configs, and which layer's DSA selection each layer attends
//! with (the indexer runs on 21 of 78 layers; the others reuse the nearest one's top-k).
use super::args::{copy_out, out_ptr, write};
use super::config::{latent_cache_config, write_config, CONFIG_SIZE};
use super::error::Failure;
use super::panic::ffi_boundary;
use super::status::latent_cache_status;
use crate::core::model::presets::{glm52_layers, glm52_selection_source, GLM52_TARGET_LAYERS};

/// Copies GLM-5.2's layer configs into `out` (`*written` = 79): 78 target layers
/// (kv_lora_rank 512, rope_head_dim 64, float32, right-justified) with index keys (128) on the
/// 21 that run the DSA indexer (its config's `indexer_types`: layers 0, 1, 2, then every
/// fourth from 6 to 74; `latent_cache_glm52_selection_sources` says which selection the
/// others use), then the MTP layer (`LATENT_CACHE_ROLE_MTP`, no index keys). Edit the copies (storage modes, layout, limits)
/// before `latent_cache_set_new`.
/// `struct_size` is the size of the caller's `latent_cache_config` (`sizeof *out`, the array's
/// stride); the header's inline `latent_cache_glm52_configs(out, out_len, written)` passes it.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a `struct_size` no header declares),
/// `BUFFER_TOO_SMALL` (`out_len` < 79); nothing is written on failure.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_glm52_configs_sized(
    out: *mut latent_cache_config,
    out_len: usize,
    struct_size: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        let configs: Vec<latent_cache_config> = glm52_layers().iter().map(latent_cache_config::of).collect();
        if out.is_null() && out_len > 0 {
            return Err(Failure::null("out"));
        }
        if out_len < configs.len() {
            return Err(Failure::new(
                latent_cache_status::BufferTooSmall,
                format!("out holds {out_len} configs; {} are needed", configs.len()),
            ));
        }
        let stride = if struct_size == 0 { CONFIG_SIZE } else { struct_size };
        for (i, config) in configs.iter().enumerate() {
            // SAFETY: the caller's promise: `out_len` (>= 79) configs of `struct_size` bytes;
            // write_config checks the size before it writes (the first write refuses a bad one).
            unsafe { write_config(out.cast::<u8>().add(i * stride).cast(), struct_size, config) }?;
        }
        unsafe { write(written, configs.len()) };
        Ok(())
    }
}

/// `latent_cache_glm52_configs_sized` for Rust callers of the C layer (C, C++ and Swift get the
/// header's inline of the same name).
pub unsafe fn latent_cache_glm52_configs(
    out: *mut latent_cache_config,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    unsafe { latent_cache_glm52_configs_sized(out, out_len, CONFIG_SIZE, written) }
}

/// Copies, for each of GLM-5.2's 78 target layers, the layer whose DSA top-k selection it
/// attends with into `out` (`*written` = 78): the layer itself where it runs the indexer (and
/// so has index keys: `latent_cache_glm52_configs`), otherwise the nearest indexer layer before
/// it, whose selection (`latent_cache_donor_select`) the engine passes on to
/// `latent_cache_donor_attend_selected` of the layers that share it, as GLM-5.2's model does.
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL` (`out_len` < 78; nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_glm52_selection_sources(
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        let sources: Vec<usize> = (0..GLM52_TARGET_LAYERS).map(glm52_selection_source).collect();
        unsafe { copy_out(out, out_len, &sources, written, "out") }
    }
}
