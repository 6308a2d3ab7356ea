//! Header of the index-score kernel that also counts its scores' top-k histogram (after the
//! index-score and top-k headers): DSA's selection in two operations, not three.

#undef LC_SCORES_COUNT
#define LC_SCORES_COUNT 1
// The top-k header bounds its kernels at 512 threads; this one launches 256 (registers as the
// scores kernel has them).
#undef __global__
#define __global__ __location__(global) __launch_bounds__(256)
