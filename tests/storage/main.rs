//! Storage modes and composed storage: what each mode reads back through the C ABI
//! (`storage_modes`), composed storage against its independent reference (`composed`) and in
//! hostile sequences (`composed_hostile`). Grouped in one binary (one link of mlx-c): none of
//! these tests sets process-wide state or counts process-wide kernel launches or memory. (The
//! FP8 encoding kernel's test counts launches: it is in `tests/kernels/`; the in-place appends'
//! test reads MLX's process-wide peak memory: `tests/in_place.rs`.)
#[path = "../common/mod.rs"]
mod common;

mod composed;
mod composed_hostile;
mod storage_modes;
