//! Header of the split-K decode's mma.sync partial and combine kernels (before MLX's signature).

#include <cuda_fp8.h>
#define LC_NEG_INF __int_as_float(0xff800000)
// MLX writes the kernel's signature; this module holds only our kernels, so their launch bound
// (at most 512 threads a block, hence at most 128 registers a thread) is given this way.
#undef __global__
#define __global__ __location__(global) __launch_bounds__(512)
__device__ __forceinline__ void lc_cp_async16(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 16 : 0));
}
__device__ __forceinline__ void lc_cp_async4(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 4 : 0));
}
__device__ __forceinline__ void lc_ldmatrix_x4_trans(uint32_t* r, const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
