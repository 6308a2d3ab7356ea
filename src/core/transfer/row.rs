//! A set's row from one process to another. The two sides agree before any position crosses:
//! the sender sends a header (its layers' stored forms, hashed, and the row's positions, or a
//! refusal of its own), the receiver answers whether it takes the row (its set empty, of the
//! same stored forms, with room and memory for it), and only then do the parts cross, one array
//! per layer, family and part in that order, each evaluated before the next. Either side that
//! refuses says so to the other, so a refused handoff ends on both sides with a status instead
//! of one side waiting for arrays that never come.
use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::mlx::distributed::Group;
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::persist::wyhash::wyhash;
use crate::core::storage::buffers::Storage;

/// A header's first value.
const MAGIC: i32 = 0x4c43_5231;
/// The header: magic, layers (0: the sender refused), positions, the stored forms' hash (two
/// 31-bit halves).
const HEADER: usize = 5;

fn forms_hash(geometries: &[Geometry]) -> [i32; 2] {
    let text: String = geometries.iter().map(|g| g.stored_form() + "\n").collect();
    let h = wyhash(text.as_bytes(), 0);
    [(h & 0x7fff_ffff) as i32, ((h >> 31) & 0x7fff_ffff) as i32]
}

fn ints(values: &[i32]) -> Result<Array> {
    Ok(ops::indices(values, &[values.len()]))
}

fn values(a: &Array) -> Vec<i64> {
    ops::to_host_i64(a).unwrap_or_default()
}

/// What the sender checks of its own row: layers at rest, none composed, the row present.
fn check_row(layers: &[&LatentCache], row: usize) -> Result<usize> {
    let Some(first) = layers.first() else {
        return fail!(InvalidArgument, "the set holds no layers");
    };
    if layers.iter().any(|l| l.geometry().composed()) {
        return fail!(InvalidArgument, "composed storage: its hot side follows the whole row and is not handed over");
    }
    layers.iter().try_for_each(|l| l.check_saveable())?;
    if row >= first.batch_size() {
        return fail!(OutOfRange, "row {row} out of range: the set holds {} rows", first.batch_size());
    }
    Ok(first.row_offsets()[row])
}

/// Sends row `row` of `layers` (a set's layers) to rank `dst`, which calls `recv_row` with this
/// rank. Returns the positions sent. A row this side cannot send is refused to the receiver
/// too; a receiver that refuses the row makes this call fail (`State`) with nothing sent.
pub fn send_row(layers: &[&LatentCache], row: usize, group: &Group, dst: usize) -> Result<usize> {
    let geometries: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
    let [h0, h1] = forms_hash(&geometries);
    let checked = check_row(layers, row);
    let (count, positions) = match &checked {
        Ok(n) => (layers.len() as i32, *n as i32),
        Err(_) => (0, 0),
    };
    group.send(&ints(&[MAGIC, count, positions, h0, h1])?, dst)?;
    let n = checked?;
    let ack = group.recv(&[1], Dtype::Int32, dst)?;
    if values(&ack) != [1] {
        return fail!(State, "rank {dst} refused the row (its set holds rows, or differs from this one, or lacks room)");
    }
    for layer in layers {
        for family in Family::ALL.into_iter().filter(|&f| layer.geometry().width(f).is_some()) {
            for part in layer.stored_row_parts(family, row, 0, n)? {
                group.send(&ops::contiguous(&part)?, dst)?;
            }
        }
    }
    Ok(n)
}

/// Receives from rank `src` (which calls `send_row` with this rank) a row into `layers`, an
/// empty set of the sender's stored forms: it then holds that row, bit for bit. Returns its
/// positions. Every layer or none.
pub fn recv_row(layers: &mut [&mut LatentCache], group: &Group, src: usize) -> Result<usize> {
    let header = values(&group.recv(&[HEADER], Dtype::Int32, src)?);
    let geometries: Vec<Geometry> = layers.iter().map(|l| *l.geometry()).collect();
    let [h0, h1] = forms_hash(&geometries);
    if header.len() != HEADER || header[0] != MAGIC as i64 {
        return fail!(Backend, "rank {src} sent no row header (a protocol mismatch)");
    }
    if header[1] == 0 {
        return fail!(State, "rank {src} refused to send its row");
    }
    let n = header[2].max(0) as usize;
    let refusal = match () {
        _ if header[1] != layers.len() as i64 || [header[3], header[4]] != [h0 as i64, h1 as i64] => Some(format!(
            "rank {src}'s layers differ from this set's ({} layers, other widths, storage modes or roles)",
            header[1]
        )),
        _ if layers.iter().any(|l| l.batch_size() != 0 || l.shared_prefix().is_some()) => {
            Some("this set holds rows: a row is received into an empty set".to_owned())
        }
        _ if geometries.iter().any(|g| g.max_tokens != 0 && n >= g.max_tokens) => {
            Some(format!("{n} positions exceed max_tokens"))
        }
        _ if geometries.iter().any(|g| g.composed()) => Some("composed storage is not handed over".to_owned()),
        _ => {
            let bytes = n.checked_mul(geometries.iter().map(Geometry::bytes_per_token).sum());
            check_alloc(bytes, &format!("receiving a row of {n} positions")).err().map(|e| e.message)
        }
    };
    group.send(&ints(&[refusal.is_none() as i32])?, src)?;
    if let Some(why) = refusal {
        return fail!(InvalidArgument, "{why}");
    }
    let mut parts = Vec::with_capacity(layers.len());
    for g in &geometries {
        parts.push(Families::for_geometry(g, |family, _| family).try_map(|_, family| {
            let specs = Storage::part_specs(g, family);
            specs.iter().map(|spec| group.recv(&[1, n, spec.width], spec.dtype, src)).collect::<Result<Vec<_>>>()
        })?);
    }
    let mut changes = Vec::with_capacity(layers.len());
    for (layer, parts) in layers.iter().zip(parts) {
        changes.push(layer.prepare_append_stored(parts, n)?);
    }
    layers.iter_mut().zip(changes).for_each(|(l, c)| l.apply(c));
    Ok(n)
}
