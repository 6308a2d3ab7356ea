//! Several processes: MLX's distributed group (`latent_cache_group`), a set's row handed to
//! another process (prefill on one, decode on another), arrays sent between pipeline stages (a
//! selection, a hidden state), and GLM-5.2's pipeline stages (see `core::transfer` and
//! `core::model::presets`).
use std::ffi::c_char;
use std::sync::Arc;

use mlx_sys::mlx_array;

use super::args::{copy_out, optional_str, out_ptr, write, write_optional};
use super::error::{set_last_error, Failure, FfiResult};
use super::mlx_array::{borrow, give};
use super::panic::ffi_boundary;
use super::registry::Registry;
use super::set::{latent_cache_set, with_set_layers};
use super::status::latent_cache_status;
use crate::core::mlx::distributed::Group;
use crate::core::model::presets::{glm52_crossing, glm52_local_starts, glm52_stage_starts, GLM52_TARGET_LAYERS};
use crate::core::transfer::{recv_row, send_row};

/// A group of processes on MLX's distributed layer. Opaque: a token from
/// `latent_cache_group_init`, released with `latent_cache_group_free`, never reused.
pub struct latent_cache_group {
    _opaque: [u8; 0],
}

static GROUPS: Registry<Group> = Registry::new("latent_cache_group");

fn group(ptr: *const latent_cache_group) -> FfiResult<Arc<Group>> {
    GROUPS.get(ptr, "group")
}

/// Joins the group MLX's distributed `backend` describes (`"ring"`: TCP, configured by
/// `MLX_RANK` and `MLX_HOSTFILE`; `"mpi"`, `"jaccl"`, `"nccl"`, or `"any"`; NULL for `"any"`).
/// Without `strict`, a backend that is not configured gives a group of this process alone.
/// `*out` receives the group, owned by the caller (`latent_cache_group_free`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (a name not UTF-8), `BACKEND` (the backend
/// did not start).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_group_init(
    backend: *const c_char,
    strict: bool,
    out: *mut *mut latent_cache_group,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let backend = unsafe { optional_str(backend, "backend") }?.unwrap_or("any");
        let g = Group::init(backend, strict)?;
        unsafe { write(out, GROUPS.insert(Arc::new(g))) };
        Ok(())
    }
}

/// `*rank` and `*size` (each may be NULL): this process's rank and the group's size.
/// Returns `OK`, `NULL_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_group_info(
    g: *const latent_cache_group,
    rank: *mut usize,
    size: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let g = group(g)?;
        unsafe { write_optional(rank, g.rank()) };
        unsafe { write_optional(size, g.size()) };
        Ok(())
    }
}

/// Releases a group. `NULL` is accepted; a group that is not live is ignored with a message.
#[no_mangle]
pub unsafe extern "C" fn latent_cache_group_free(g: *mut latent_cache_group) {
    ffi_boundary!(on_panic = ();
        if !g.is_null() && GROUPS.remove(g).is_none() {
            set_last_error("latent_cache_group_free: not a live latent_cache_group (double free?)");
        }
    )
}

/// Sends `x` (borrowed) to rank `dst` of `g` and waits until it is sent (the receiver calls
/// `latent_cache_group_recv`). Pipeline stages send what a later stage needs this way: the
/// hidden state, and the DSA selection (`[B, Lq, k]` int32) where the split cuts between an
/// indexer layer and the layers that reuse it (`latent_cache_glm52_crossing`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`dst` this process or not in the group),
/// `BACKEND` (the send failed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_group_send(g: *const latent_cache_group, x: mlx_array, dst: usize) -> latent_cache_status {
    ffi_boundary! {
        let g = group(g)?;
        let x = unsafe { borrow(x, "x") }?;
        Ok(g.send(&x, dst)?)
    }
}

/// `*out` receives, evaluated, the array rank `src` of `g` sends next, which has the shape and
/// dtype of `like` (borrowed; only its shape and dtype are read). Owned by the caller.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`src` this process or not in the group),
/// `BACKEND` (the receive failed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_group_recv(
    g: *const latent_cache_group,
    like: mlx_array,
    src: usize,
    out: *mut mlx_array,
) -> latent_cache_status {
    ffi_boundary! {
        let out = out_ptr(out, "out")?;
        let g = group(g)?;
        let like = unsafe { borrow(like, "like") }?;
        let shape: Vec<usize> = like.shape().iter().map(|&d| d as usize).collect();
        let got = g.recv(&shape, like.dtype(), src)?;
        unsafe { write(out, give(got)) };
        Ok(())
    }
}

/// Hands row `row` of `set` to rank `dst` of `g`, which calls `latent_cache_set_recv_row` with
/// this rank: first a handshake (the receiver checks it can take the row: an empty set of the
/// same widths, storage modes and roles, room under `max_tokens`, memory under MLX's limit),
/// then each layer's stored parts as MLX arrays, exactly as stored. The set is not changed; its
/// layers stay locked, and the library's evaluations wait, until the row is sent. `*positions`
/// (may be NULL) receives the positions sent.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (composed storage), `OUT_OF_RANGE` (`row`),
/// `INVALID_STATE` (a round, prefill or maintenance open; the receiver refused the row; the
/// receiver is told of a refusal here too), `BACKEND` (the transfer failed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_send_row(
    set: *mut latent_cache_set,
    row: usize,
    g: *const latent_cache_group,
    dst: usize,
    positions: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let g = group(g)?;
        let n = with_set_layers(set, |layers| {
            let layers: Vec<&_> = layers.iter().map(|l| &**l).collect();
            Ok(send_row(&layers, row, &g, dst)?)
        })?;
        unsafe { write_optional(positions, n) };
        Ok(())
    }
}

/// Receives into `set` (empty) the row rank `src` of `g` sends with `latent_cache_set_send_row`:
/// the set then holds that row, bit for bit, and decodes on. `*positions` (may be NULL)
/// receives its positions. Every layer or none.
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (this set refused the row: it holds rows,
/// its layers differ from the sender's, it lacks room or memory; the sender is told),
/// `INVALID_STATE` (the sender refused to send), `BACKEND` (the transfer failed).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_set_recv_row(
    set: *mut latent_cache_set,
    g: *const latent_cache_group,
    src: usize,
    positions: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let g = group(g)?;
        let n = with_set_layers(set, |layers| Ok(recv_row(layers, &g, src)?))?;
        unsafe { write_optional(positions, n) };
        Ok(())
    }
}

/// Copies into `out` the target layers at which a pipeline stage of GLM-5.2 may begin with every
/// selection its layers attend with made on the stage (layer 0 and the 21 indexer layers;
/// `*written` = 21).
/// Returns `OK`, `NULL_ARGUMENT`, `BUFFER_TOO_SMALL` (`out_len` < 21; nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_glm52_local_starts(
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        unsafe { copy_out(out, out_len, &glm52_local_starts(), written, "out") }
    }
}

/// Copies into `out` the first target layer of each of `stages` pipeline stages of GLM-5.2 (stage
/// s holds the layers from `out[s]` to the next start, the last stage also the MTP layer), as
/// even as starts that keep every selection local allow (`*written` = `stages`).
/// Returns `OK`, `NULL_ARGUMENT`, `INVALID_ARGUMENT` (`stages` 0 or over 21),
/// `BUFFER_TOO_SMALL` (`out_len` < `stages`; nothing written).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_glm52_stage_starts(
    stages: usize,
    out: *mut usize,
    out_len: usize,
    written: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let written = out_ptr(written, "written")?;
        let Some(starts) = glm52_stage_starts(stages) else {
            return Err(Failure::new(latent_cache_status::InvalidArgument, format!("{stages} stages: 1 to 21")));
        };
        unsafe { copy_out(out, out_len, &starts, written, "out") }
    }
}

/// For a pipeline stage of GLM-5.2 beginning at target layer `start`: `*crosses` says whether
/// its first layers attend with a selection made on an earlier stage, and `*source` (when it
/// does) which layer's, to send each step with `latent_cache_group_send` (`[B, Lq, k]` int32).
/// Returns `OK`, `NULL_ARGUMENT`, `OUT_OF_RANGE` (`start` not a target layer).
#[no_mangle]
pub unsafe extern "C" fn latent_cache_glm52_crossing(
    start: usize,
    crosses: *mut bool,
    source: *mut usize,
) -> latent_cache_status {
    ffi_boundary! {
        let (crosses, source) = (out_ptr(crosses, "crosses")?, out_ptr(source, "source")?);
        if start >= GLM52_TARGET_LAYERS {
            return Err(Failure::new(latent_cache_status::OutOfRange, format!("layer {start}: GLM-5.2 has 78 target layers")));
        }
        let crossing = glm52_crossing(start);
        unsafe {
            write(crosses, crossing.is_some());
            write(source, crossing.unwrap_or(start));
        }
        Ok(())
    }
}
