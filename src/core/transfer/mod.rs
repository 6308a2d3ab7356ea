//! Beyond one process: a set's row handed to another process over MLX's own distributed layer
//! (`mlx::distributed`), as prefill-to-decode engines and pipeline stages move caches. The
//! row's stored parts cross as MLX arrays, exactly as stored (never decoded or re-encoded), so
//! the receiver holds the sender's row bit for bit and decodes on.
//!
//! | file | its job |
//! |---|---|
//! | `row.rs` | sending a set's row; receiving it into an empty set (the handshake, then the parts) |
mod row;

pub use row::{recv_row, send_row};
