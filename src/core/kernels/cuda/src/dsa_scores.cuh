//! Header of the DSA index-score kernel (after `mma.cuh`): two 16-bit floats as one 32-bit
//! operand register of `mma.sync`, the lower channel in the low half.

// Whether the kernel also counts the top-k histogram of its scores (`dsa_scores_counted.cuh`).
#ifndef LC_SCORES_COUNT
#define LC_SCORES_COUNT 0
#endif

template <typename T>
__device__ __forceinline__ uint32_t lc_pack(T lo, T hi) {
  return static_cast<uint32_t>(*reinterpret_cast<const unsigned short*>(&lo)) |
         (static_cast<uint32_t>(*reinterpret_cast<const unsigned short*>(&hi)) << 16);
}

// The element type behind the kernel's `const T*` inputs.
template <typename T>
struct lc_elem;
template <typename T>
struct lc_elem<const T*> {
  using type = T;
};
