//! Rows as integers: where each row of a batch starts and ends (`row_layout`), where composed
//! storage's hot and compact positions meet (`boundary`), and what an open padded prefill
//! records (`prefill`), and where rows lie among the buffers' slots (`slots`). Pure logic over
//! `usize`, tested without MLX.
//!
//! May import: `error` only.
pub mod boundary;
pub mod prefill;
pub mod row_layout;
pub mod slots;
