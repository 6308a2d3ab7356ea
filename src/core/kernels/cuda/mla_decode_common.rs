//! What the split-K decode's two partial passes (`mla_decode`'s mma.sync one and
//! `mla_decode_wgmma`'s) share: the start of their bodies, and their inputs' and outputs' names.
//! Both passes produce the outputs the one `combine` kernel reads.

/// The partial passes' shared start: thread indices, the split's positions, the inputs'
/// pointers and strides, and whether 16-byte copies apply. A macro, so that each pass's body is
/// one `concat!` of literals (`include_str!`s) and stays a `&'static str`.
macro_rules! partial_prologue {
    () => {
        include_str!("src/mla_decode_partial_prologue.cuh")
    };
}
pub(crate) use partial_prologue;

/// The partial passes' inputs and outputs, by the names their bodies give them.
/// `sel` holds the selected positions of a gathered pass (any array, unread, otherwise).
pub(crate) const PARTIAL_INPUTS: &[&str] = &["q_latent", "q_rope", "latent", "rope", "ranges", "sel"];
pub(crate) const PARTIAL_OUTPUTS: &[&str] = &["o_part", "ml"];

/// A two-pass partial's two outputs.
pub(crate) fn two(out: Vec<mlx_rs::Array>) -> [mlx_rs::Array; 2] {
    let mut out = out.into_iter();
    [out.next().expect("two outputs"), out.next().expect("two outputs")]
}
