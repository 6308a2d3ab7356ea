//! Header of the Metal split-K decode's kernels (before MLX's signature).

// Running maxima start here rather than at -inf, so that no comparison or exp2 depends on
// special values whatever math mode the kernel is compiled in.
constant constexpr float LC_NONE = -3.0e38f;
