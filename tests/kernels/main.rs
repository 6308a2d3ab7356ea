//! The library's CUDA kernels that tests count by their launches: DSA's index scores and the
//! split-K decode over selected positions (`dsa`), and the FP8 encoding (`fp8_encode`). The
//! launch counts are process-wide, so these tests are apart from every other test that may
//! launch those kernels, and among themselves each counting test holds `COUNTING` (DSA's decode
//! over an FP8 latent launches the FP8 encoding), and a prefill chunk's selected attention
//! (`selected_chunk`). Elsewhere than on CUDA they check the MLX-ops
//! paths. (`tests/decode_kernel.rs` is apart on its own: it flips the process-wide wgmma switch
//! and counts the scales compiled into the process's kernels.)
#[path = "../common/mod.rs"]
mod common;

mod dsa;
mod fp8_encode;
mod selected_chunk;

/// Held by the tests that count kernel launches (the counts are process-wide, the tests run on
/// threads of one process), so that one's launches never land in another's count.
pub static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
