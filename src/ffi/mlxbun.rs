//! The seed's own prompt-cache files (mlx-bun's `MLXBUNKV2` layout, see
//! `core::persist::mlxbun`): a set saved for, or loaded from, the seed's implementation, and a
//! file's header read on its own.
use std::ffi::c_char;

use super::args::{copy_out, copy_out_str, in_slice, optional_str, out_ptr, path, write};
use super::error::FfiResult;
use super::panic::ffi_boundary;
use super::set::{latent_cache_set, register_set, with_set_layers};
use super::status::latent_cache_status;
use crate::core::persist::mlxbun;
use crate::core::persist::mlxbun::MlxbunInfo;

/// What a file of the seed's format says besides the caches. Every pointer is borrowed for the
/// call; a NULL string is left out of the file.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct latent_cache_mlxbun_info {
    /// The token ids the state encodes (the prompt prefix), `tokens_len` of them.
    pub tokens: *const u32,
    pub tokens_len: usize,
    /// Identity strings the seed's server compares before it reuses a file (UTF-8).
    pub model_id: *const c_char,
    pub config_fingerprint: *const c_char,
    pub tokenizer_hash: *const c_char,
    /// The adapter namespace (`""` for the base model; the seed's SSD tier expects the key).
    pub ns: *const c_char,
}

unsafe fn info(info: *const latent_cache_mlxbun_info) -> FfiResult<MlxbunInfo> {
    // SAFETY: NULL or a valid struct from the caller.
    let Some(i) = (unsafe { info.as_ref() }) else {
        return Ok(MlxbunInfo::default());
    };
    Ok(MlxbunInfo {
        tokens: unsafe { in_slice(i.tokens, i.tokens_len, "info->tokens") }?.to_vec(),
        model_id: unsafe { optional_str(i.model_id, "info->model_id") }?.map(str::to_owned),
        config_fingerprint: unsafe { optional_str(i.config_fingerprint, "info->config_fingerprint") }?.map(str::to_owned),
        tokenizer_hash: unsafe { optional_str(i.tokenizer_hash, "info->tokenizer_hash") }?.map(str::to_owned),
        ns: unsafe { optional_str(i.ns, "info->ns") }?.map(str::to_owned),
    })
}

/// Saves every layer of `set` as the seed's implementation (mlx-bun) saves a prompt cache, so
/// its loader reads it: format version 3, kinds `mla`, `mla-dsa` and `mtp-mla`, float32
/// `[B, offset, width]` tensors at 16 KiB-aligned offsets, the header and every tensor hashed;
/// written to a temporary file beside `path` (mode 0600), synced and renamed. `info` may be NULL
/// (no tokens, no identity strings). The seed's format keeps one offset per layer and float32
/// values only, so every layer must store float32 and hold rows of one length without padding
/// (extract a row first to save one request of a batch). As `latent_cache_set_save`, a layer
/// with a speculative round, a padded prefill or prefill maintenance open is refused
/// (`INVALID_STATE`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a path or string that is not UTF-8, compact
/// storage, rows of different lengths, an empty layer), `INVALID_STATE` (layers that disagree),
/// `BACKEND` (the file could not be written). On failure no file is left under `path` or beside it.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save_mlxbun(
    set: *const latent_cache_set,
    path: *const c_char,
    info: *const latent_cache_mlxbun_info,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let info = unsafe { self::info(info) }?;
        with_set_layers(set, |layers| Ok(mlxbun::save(&layers.iter().map(|l| &**l).collect::<Vec<_>>(), &info, &path)?))
    }
}

/// `latent_cache_set_save_mlxbun` in the seed's block layout (mlx-bun's format version 5, its
/// SSD tier's `layout: "blocks"`): `path` is written as a manifest (the same header, listing each
/// tensor's blocks), and each tensor's float32 bytes are cut per batch row into blocks of
/// `block_bytes` (0: mlx-bun's default, 1 MiB; rounded down to whole values), each written to
/// `blocks/<sha256 of its bytes>` in the folder of `path` (made if missing, mode 0700) unless a
/// block of that name is there. Saving a conversation again after it grew writes its new
/// positions' blocks and each row's last, partial block, and reuses every other block, so a chain
/// of manifests in one folder holds each position about once. Blocks no manifest names (after
/// a failed save, or manifests removed) are left for mlx-bun's collector. Load with
/// `latent_cache_set_load_mlxbun`.
/// Returns what `latent_cache_set_save_mlxbun` returns, and `INVALID_ARGUMENT` for `block_bytes`
/// above 1 GiB. On failure no manifest is left under `path`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_save_mlxbun_blocks(
    set: *const latent_cache_set,
    path: *const c_char,
    info: *const latent_cache_mlxbun_info,
    block_bytes: usize,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let info = unsafe { self::info(info) }?;
        with_set_layers(set, |layers| {
            Ok(mlxbun::save_blocks(&layers.iter().map(|l| &**l).collect::<Vec<_>>(), &info, &path, block_bytes)?)
        })
    }
}

/// Loads a prompt cache the seed's implementation wrote (format versions 3 and 4; its v4
/// attachments, such as the MTP draft state, are not read; version 5, a manifest whose tensors
/// lie in `blocks/` beside it, each block checked against its SHA-256 name) or
/// `latent_cache_set_save_mlxbun` / `latent_cache_set_save_mlxbun_blocks`
/// wrote. The magic, the header's hash, every field (kinds, geometry, `maxTokens`, shapes, dtype,
/// offsets inside the file) and every tensor's hash are checked; on any failure nothing is
/// created. `*out` receives a set of float32 layers in the file's order, rows right-justified and
/// all holding the layer's offset, owned by the caller. The tokens and identity strings: read
/// them with `latent_cache_mlxbun_header` / `latent_cache_mlxbun_tokens`.
/// The path is opened once and must name a regular file (a FIFO, a device or a folder is
/// `INVALID_ARGUMENT`); the file must end with its last tensor (a manifest, with its header).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (unreadable, damaged or foreign files, bytes
/// after the last tensor, a block missing, of another length or not matching its name), `CAPACITY` (its tensors would take MLX past its memory
/// limit; checked before any is read), `BACKEND`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_load_mlxbun(
    path: *const c_char,
    out: *mut *mut latent_cache_set,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let out = out_ptr(out, "out")?;
        let (caches, _) = mlxbun::load(&path)?;
        unsafe { write(out, register_set(caches)) };
        Ok(())
    }
}

/// Copies the token ids of a file of the seed's format into `out` (`out_len` entries) and their
/// count into `*written`, after checking the header's hash; no tensor is read.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (not such a file, or damaged),
/// `BUFFER_TOO_SMALL` (nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_mlxbun_tokens(
    path: *const c_char,
    out: *mut u32,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let written = out_ptr(written, "written")?;
        let (_, info) = mlxbun::read_info(&path)?;
        unsafe { copy_out(out, out_len, &info.tokens, written, "out") }
    }
}

/// Copies the JSON header of a file of the seed's format, after checking its hash, into `out`
/// (`out_len` bytes, holding the text and its terminator); `*written` receives the length
/// without the terminator. For engines that check the identity strings (`modelId`,
/// `configFingerprint`, `tokenizerHash`, `ns`) before loading.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (not such a file, or damaged),
/// `BUFFER_TOO_SMALL` (nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_mlxbun_header(
    path: *const c_char,
    out: *mut c_char,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let path = unsafe { self::path(path) }?;
        let written = out_ptr(written, "written")?;
        let (text, _) = mlxbun::read_info(&path)?;
        unsafe { copy_out_str(out, out_len, &text, written) }
    }
}
