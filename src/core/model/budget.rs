//! Admission arithmetic: what a request of `batch` rows and `tokens` positions would hold in a
//! layer of a given geometry, before any cache is made.
use crate::core::error::{fail, Result};
use crate::core::model::geometry::Geometry;

/// The bytes `batch` rows of `tokens` positions hold in a cache of `geometry`
/// (`batch * tokens * bytes_per_token`); `Capacity` when the product overflows `usize`.
pub fn projected_bytes(geometry: &Geometry, batch: usize, tokens: usize) -> Result<usize> {
    match batch.checked_mul(tokens).and_then(|n| n.checked_mul(geometry.bytes_per_token())) {
        Some(bytes) => Ok(bytes),
        None => fail!(Capacity, "{batch} rows x {tokens} positions overflow size_t"),
    }
}
