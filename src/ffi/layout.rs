//! `latent_cache_layout`: how rows sit in the stored window, chosen in the config, and its
//! checked conversion from the integer C passes.
use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::LayoutKind;

/// How rows sit in the stored window (the config's `layout`, passed as `uint32_t`).
///
/// Row `b` holds its valid positions at `[left_pad[b], row_end[b])` of the window
/// `[batch_size, offset, width]`, and `row_offsets[b] = row_end[b] - left_pad[b]`.
///
/// - `RIGHT_JUSTIFIED` (the seed's layout, the default): every row ends at `offset`. A rollback
///   in which rows keep different counts moves the rows that dropped more, so it costs
///   O(their stored positions).
/// - `RAGGED`: rows end where they end (`latent_cache_row_ends`). An append writes each row's
///   new positions at its own end; a rollback in which rows keep different counts only moves row
///   ends, so a round costs what it appended. Filter, merge and extract place rebuilt rows at
///   position 0. Build the attention mask per row from `[left_pad[b], row_end[b])` and RoPE
///   positions as `t - left_pad[b]` for window position `t`: for example
///   `valid = t >= left_pad[b] && t < row_end[b]`.
///
/// Caches of different layouts do not merge (`INVALID_ARGUMENT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_layout {
    RightJustified = 0,
    Ragged = 1,
}

impl latent_cache_layout {
    pub(crate) fn of(kind: LayoutKind) -> Self {
        match kind {
            LayoutKind::RightJustified => latent_cache_layout::RightJustified,
            LayoutKind::Ragged => latent_cache_layout::Ragged,
        }
    }
}

/// Converts a `latent_cache_layout` value received as an integer.
pub(crate) fn layout_kind(value: u32) -> FfiResult<LayoutKind> {
    match value {
        v if v == latent_cache_layout::RightJustified as u32 => Ok(LayoutKind::RightJustified),
        v if v == latent_cache_layout::Ragged as u32 => Ok(LayoutKind::Ragged),
        _ => Err(Failure::new(latent_cache_status::InvalidArgument, format!("layout {value} is not a latent_cache_layout"))),
    }
}
