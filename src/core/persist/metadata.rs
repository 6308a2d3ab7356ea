//! Our metadata in a safetensors file (keys `0.latent_cache.*` in mlx-lm's user metadata): the
//! format versions, a layer's geometry as text and back, lists of counts, and which layers mlx-lm's
//! own classes can hold (all families float).
use crate::core::error::{error, fail, Result};
use crate::core::layout::row_layout::LayoutKind;
use crate::core::model::geometry::{Family, Geometry, Role};
use crate::core::model::storage_mode::StorageMode;

/// The newest format this library reads. It writes version 2, or 3 when a layer is composed
/// (version 3 adds the hot side; older readers refuse it rather than load it without).
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The format of files without composed layers.
pub(super) const PLAIN_VERSION: u32 = 2;
pub(super) const PREFIX: &str = "0.latent_cache.";

/// Whether mlx-lm's classes hold the layer: every family it has is float.
pub(super) fn float_layer(g: &Geometry) -> bool {
    Family::ALL.iter().all(|&f| g.width(f).is_none() || g.storage(f).is_float())
}

pub(super) fn describe(g: &Geometry) -> String {
    let layout = match g.layout {
        LayoutKind::RightJustified => "right-justified",
        LayoutKind::Ragged => "ragged",
    };
    let role = match g.role {
        Role::Target => "target",
        Role::Mtp => "mtp",
    };
    format!(
        "{};{};{};{};{};{};{};{};{}",
        g.kv_lora_rank,
        g.rope_head_dim,
        g.index_head_dim,
        g.max_tokens,
        g.latent_storage.name(),
        g.rope_storage.name(),
        g.index_storage.name(),
        layout,
        role
    )
}

pub(super) fn parse_geometry(s: &str) -> Result<Geometry> {
    let f: Vec<&str> = s.split(';').collect();
    let bad = || fail!(InvalidArgument, "layer geometry {s:?} is not this library's");
    if f.len() != 9 {
        return bad();
    }
    let num = |x: &str| x.parse::<usize>().ok();
    let mode = StorageMode::from_name;
    let (Some(r), Some(p), Some(i), Some(m)) = (num(f[0]), num(f[1]), num(f[2]), num(f[3])) else { return bad() };
    let (Some(ls), Some(rs), Some(is)) = (mode(f[4]), mode(f[5]), mode(f[6])) else { return bad() };
    let layout = match f[7] {
        "right-justified" => LayoutKind::RightJustified,
        "ragged" => LayoutKind::Ragged,
        _ => return bad(),
    };
    let role = match f[8] {
        "target" => Role::Target,
        "mtp" => Role::Mtp,
        _ => return bad(),
    };
    let g = Geometry {
        kv_lora_rank: r,
        rope_head_dim: p,
        index_head_dim: i,
        max_tokens: m,
        latent_storage: ls,
        rope_storage: rs,
        index_storage: is,
        layout,
        role,
        ..Geometry::default()
    };
    g.validate()?;
    Ok(g)
}

pub(super) fn list(values: &[usize]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}

pub(super) fn parse_list(s: &str) -> Result<Vec<usize>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|v| v.parse().map_err(|_| error!(InvalidArgument, "{s:?} is not a list of counts"))).collect()
}
