//! A model's caches moved together: every set-wide operation prepares each layer's change first
//! (the step that may fail, and allocates) and applies them only once every layer prepared, so a
//! failure on any layer leaves every layer as it was. Layers that disagree about their rows (a
//! caller drove one layer alone) are reported instead of being changed.
use crate::core::cache::Change;
use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::model::geometry::Geometry;
use crate::core::storage::shared::SharedPrefix;

/// Refuses a set-wide call on layers whose rows or rounds differ.
pub fn check_agree(layers: &[&mut LatentCache]) -> Result<()> {
    check_layers_agree(&layers.iter().map(|l| &**l).collect::<Vec<_>>())
}

fn check_layers_agree(layers: &[&LatentCache]) -> Result<()> {
    let Some(first) = layers.first() else {
        return Ok(());
    };
    for (i, layer) in layers.iter().enumerate().skip(1) {
        if layer.prefill != first.prefill {
            return fail!(State, "layer {i} and layer 0 differ in their open prefill: a layer was driven alone");
        }
        if layer.row_offsets() != first.row_offsets() || layer.in_spec_round() != first.in_spec_round() {
            return fail!(
                State,
                "layer {i} holds rows {:?}{} but layer 0 holds {:?}{}: a layer was driven alone",
                layer.row_offsets(),
                if layer.in_spec_round() { " in a round" } else { "" },
                first.row_offsets(),
                if first.in_spec_round() { " in a round" } else { "" }
            );
        }
    }
    Ok(())
}

/// Refuses a rollback of layers that did not begin one round over the same rows: every layer
/// in a round begun on the same rows (what they did since may differ: a forward refused at a
/// middle layer left the layers before it longer).
fn check_round_starts_agree(layers: &[&mut LatentCache]) -> Result<()> {
    let start = |l: &LatentCache| l.layout.round_start().map(|s| (s.to_vec(), l.shared_positions()));
    let Some(first) = layers.first().map(|l| start(l)) else {
        return Ok(());
    };
    if first.is_none() {
        return fail!(State, "no speculative round is open");
    }
    match layers.iter().position(|l| start(l) != first) {
        Some(i) => fail!(State, "layer {i} and layer 0 did not begin the same round: a layer was driven alone"),
        None => Ok(()),
    }
}

/// A set's rollback (`prepare(layer)`, one of the round's rollbacks, on every layer): layers
/// need only have begun the round together, so a round whose forward failed partway rolls back
/// on every layer (keeping 0 always can). Every layer or none.
pub fn rollback_all(layers: &mut [&mut LatentCache], prepare: impl Fn(&LatentCache) -> Result<Change>) -> Result<()> {
    check_round_starts_agree(layers)?;
    change_each(layers, |_, layer| prepare(layer))
}

/// Cuts every layer back to the positions all layers hold: where a forward was refused at a
/// middle layer (an append over MLX's memory limit, say), the layers before it hold the new
/// positions and the others do not. Each layer drops, from every row, what it holds beyond the
/// shortest layer (the same count on every row, as an append adds; with bypass, so composed
/// storage and an open round allow it). Returns the most positions a layer dropped (0 when the
/// layers agree). Every layer or none; refused (`State`) where layers differ otherwise (rows,
/// an open round or prefill, counts that differ from row to row).
pub fn recover_all(layers: &mut [&mut LatentCache]) -> Result<usize> {
    let Some(first) = layers.first() else {
        return Ok(0);
    };
    let (rows, round, prefill) = (first.batch_size(), first.in_spec_round(), first.prefill.clone());
    if let Some(i) = layers.iter().position(|l| l.batch_size() != rows || l.in_spec_round() != round || l.prefill != prefill) {
        return fail!(State, "layer {i} and layer 0 differ in their rows, round or prefill: not a forward refused partway");
    }
    let mut target = first.row_offsets();
    for layer in layers.iter() {
        target.iter_mut().zip(layer.row_offsets()).for_each(|(t, n)| *t = (*t).min(n));
    }
    let mut drops = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        let extra: Vec<usize> = layer.row_offsets().iter().zip(&target).map(|(n, t)| n - t).collect();
        match extra.first() {
            Some(&d) if extra.iter().any(|&e| e != d) => {
                return fail!(
                    State,
                    "layer {i} holds {extra:?} positions beyond the other layers' rows: not what an append adds"
                );
            }
            d => drops.push(d.copied().unwrap_or(0)),
        }
    }
    let most = drops.iter().copied().max().unwrap_or(0);
    if most == 0 {
        return Ok(0);
    }
    change_each(layers, |i, layer| layer.prepare_trim(drops[i], true))?;
    Ok(most)
}

/// Prepares `prepare(layer)` on every layer, then applies them all; the first failure is
/// returned with no layer changed.
pub fn change_all(layers: &mut [&mut LatentCache], prepare: impl Fn(&LatentCache) -> Result<Change>) -> Result<()> {
    check_agree(layers)?;
    change_each(layers, |_, layer| prepare(layer))
}

/// Prepares `prepare(i, layer)` on every layer, then applies them all (no agreement check).
fn change_each(layers: &mut [&mut LatentCache], prepare: impl Fn(usize, &LatentCache) -> Result<Change>) -> Result<()> {
    let mut changes = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        changes.push(prepare(i, layer).map_err(|mut err| {
            err.message = format!("layer {i}: {}", err.message);
            err
        })?);
    }
    for (layer, change) in layers.iter_mut().zip(changes) {
        layer.apply(change);
    }
    Ok(())
}

/// `count` new values (caches, a layer's prefix) made by `make(i)`; the first failure is
/// returned naming its layer, and every value made so far dropped (whatever `make` reads is not
/// changed).
pub fn make_all<T>(count: usize, make: impl Fn(usize) -> Result<T>) -> Result<Vec<T>> {
    (0..count)
        .map(|i| {
            make(i).map_err(|mut err| {
                err.message = format!("layer {i}: {}", err.message);
                err
            })
        })
        .collect()
}

/// A new set's layers: one empty cache per geometry (at least one), layer `i` with
/// `geometries[i]`; the first failure is returned naming its layer.
pub fn new_all(geometries: &[Geometry]) -> Result<Vec<LatentCache>> {
    if geometries.is_empty() {
        return fail!(InvalidArgument, "a set needs at least one layer");
    }
    make_all(geometries.len(), |i| LatentCache::new(geometries[i]))
}

/// New layers holding exactly row `row` of every layer (`LatentCache::extract_row` per layer),
/// from layers that agree about their rows; the layers are not changed.
pub fn extract_row_all(layers: &[&mut LatentCache], row: usize) -> Result<Vec<LatentCache>> {
    check_agree(layers)?;
    make_all(layers.len(), |i| layers[i].extract_row(row))
}

/// Every row of every source set after the rows of `destination`, in order (`sources[k][i]` is
/// source `k`'s layer `i`), layer by layer as `LatentCache::merge_rows` does: an empty set is
/// merged into new caches first, swapped in only when every layer merged; a set holding rows
/// prepares every layer's join before applying any.
pub fn merge_all(destination: &mut [&mut LatentCache], sources: &[Vec<&LatentCache>]) -> Result<()> {
    check_agree(destination)?;
    for (k, source) in sources.iter().enumerate() {
        if source.len() != destination.len() {
            return fail!(InvalidArgument, "source {k} has {} layers; the destination has {}", source.len(), destination.len());
        }
        check_layers_agree(source).map_err(|mut err| {
            err.message = format!("source {k}: {}", err.message);
            err
        })?;
    }
    let busy = |layer: &LatentCache| layer.in_spec_round() || layer.in_prefill() || layer.in_prefill_maintenance();
    if destination.iter().any(|layer| busy(layer)) {
        return fail!(State, "the merge destination must be outside a round, a prefill and prefill maintenance");
    }
    if destination.first().is_some_and(|layer| layer.batch_size() != 0) {
        return change_each(destination, |i, layer| layer.prepare_join(&sources.iter().map(|s| s[i]).collect::<Vec<_>>()));
    }
    let merged = make_all(destination.len(), |i| {
        let mut layer = LatentCache::new(destination[i].geometry)?;
        layer.reserved = destination[i].reserved;
        layer.storage.set_slots(destination[i].storage.slots());
        layer.merge_rows(&sources.iter().map(|s| s[i]).collect::<Vec<_>>())?;
        Ok(layer)
    })?;
    for (layer, new) in destination.iter_mut().zip(merged) {
        **layer = new;
    }
    Ok(())
}

/// Row `row`'s first `positions` positions of every layer as one prefix per layer
/// (`LatentCache::share_prefix`), from layers that agree about their rows.
pub fn share_all(layers: &[&mut LatentCache], row: usize, positions: usize) -> Result<Vec<SharedPrefix>> {
    check_agree(layers)?;
    make_all(layers.len(), |i| layers[i].share_prefix(row, positions))
}

/// Makes every empty layer `rows` rows over its layer's prefix (`LatentCache::attach_prefix`);
/// every layer or none.
pub fn attach_all(layers: &mut [&mut LatentCache], prefixes: &[SharedPrefix], rows: usize) -> Result<()> {
    if prefixes.len() != layers.len() {
        return fail!(InvalidArgument, "the prefix holds {} layers; the set has {}", prefixes.len(), layers.len());
    }
    change_each(layers, |i, layer| layer.prepare_attach(&prefixes[i], rows))
}
