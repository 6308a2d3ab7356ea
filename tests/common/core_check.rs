//! Checks a cache against the reference model through the Rust API: batch, offset, row offsets,
//! padding, row ends and every row's values bit for bit.
#![allow(dead_code)]

use latent_cache::{Family, Geometry, LatentCache, LayoutKind};

use super::model::Model;

pub fn widths(g: &Geometry) -> [usize; 3] {
    [g.kv_lora_rank, g.rope_head_dim, g.index_head_dim]
}

/// The model of a cache with `g`'s widths and storage modes.
pub fn model_of(g: &Geometry) -> Model {
    let mut model = Model::with_modes(widths(g), [g.latent_storage, g.rope_storage, g.index_storage]);
    model.ragged = g.layout == LayoutKind::Ragged;
    model
}

pub fn assert_matches(cache: &LatentCache, model: &Model, step: &str) {
    assert_eq!(cache.batch_size(), model.rows.len(), "batch_size after {step}");
    assert_eq!(cache.offset(), model.offset(), "offset after {step}");
    assert_eq!(cache.row_offsets(), model.row_offsets(), "row_offsets after {step}");
    assert_eq!(cache.left_pad(), model.left_pad().as_slice(), "left_pad after {step}");
    assert_eq!(cache.row_ends(), model.row_ends().as_slice(), "row_ends after {step}");
    for (f, family) in Family::ALL.into_iter().enumerate() {
        if model.widths[f] == 0 {
            continue;
        }
        for row in 0..model.rows.len() {
            let got = cache.read_row(family, row).unwrap();
            // Bit-for-bit: compare the representations, not float equality.
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = model.rows[row].families[f].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{} row {row} after {step}", family.name());
        }
    }
}
