//! Rows: the row layout's integer logic (`layout`), random operation sequences through the Rust
//! API (`core_model`), padded batched prefills (`prefill`, `prefill_edges`) and the model-level
//! set through the C ABI (`set`), each against the reference model. Grouped in one binary (one
//! link of mlx-c): none of these tests sets or measures process-wide state.
#[path = "../common/mod.rs"]
mod common;

mod core_model;
mod layout;
mod prefill;
mod prefill_edges;
mod set;
