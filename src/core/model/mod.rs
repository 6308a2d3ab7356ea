//! What a layer is, before anything is stored: its geometry (widths, role, layout, limits), its
//! families (latent, rope, index keys), its storage modes as facts (parts, bits, what kernels
//! read), what a request would hold before a cache is made (`budget`), and the presets of whole
//! models (GLM-5.2).
//!
//! A new storage mode starts in `storage_mode.rs` (its parts and facts) and `storage::codec`
//! (its encode and decode).
//!
//! May import: `error`, `layout`.
pub mod budget;
pub mod families;
pub mod geometry;
pub mod presets;
pub mod storage_mode;
