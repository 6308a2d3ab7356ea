//! Attention over donor rows: the absorbed MLA attention against float64 (`donor`), DSA's
//! selected attention against dense attention masked to the same positions (`selected`), and the Metal
//! decode kernels' sources run in a C++ emulation of Metal (`metal_emulation`). Grouped in one
//! binary (one link of mlx-c): none of these tests sets process-wide state or counts
//! process-wide kernel launches, so they may run on threads of one process. The kernel tests that
//! count launches are apart (`tests/kernels/`, `tests/decode_kernel.rs`).
#[path = "../common/mod.rs"]
mod common;

mod donor;
mod metal_emulation;
mod selected;
