//! Header of the split-K decode's wgmma partial pass (before MLX's signature).

#define LC_NEG_INF __int_as_float(0xff800000)
// Three warpgroups a block: two compute (216 registers a thread, for the 128 float32 output
// accumulators), one streams the tiles in (64; see `setmaxnreg` below).
#undef __global__
#define __global__ __location__(global) __launch_bounds__(384, 1)
#define LC_D16(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define LC_D32(d) LC_D16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
  "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
  "+f"(d[30]), "+f"(d[31])
// d[64 x 32] += a[64 x 16] b[32 x 16]^T, both from shared memory, K-major.
#define LC_WG_SS(T) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
  : LC_D16(d) : "l"(a), "l"(b), "r"(1))
// d[64 x 64] += a[64 x 16] (registers) b[16 x 64] (shared memory, N-major).
#define LC_WG_RS(T) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n" \
  : LC_D32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
__device__ __forceinline__ void lc_wg_ss(float* d, uint64_t a, uint64_t b, bool bf16) {
  if (bf16) LC_WG_SS("bf16"); else LC_WG_SS("f16");
}
__device__ __forceinline__ void lc_wg_rs(float* d, const uint32_t* a, uint64_t b, bool bf16) {
  if (bf16) LC_WG_RS("bf16"); else LC_WG_RS("f16");
}
// A shared-memory matrix descriptor without swizzling: start address and the byte distances
// between neighbouring core matrices along K (leading) and along M or N (strided), for K-major
// and N-major operands alike (checked on an H200 against the mma.sync kernel's results).
__device__ __forceinline__ uint64_t lc_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint64_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return ((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32);
}
__device__ __forceinline__ void lc_cp_async16(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 16 : 0));
}
__device__ __forceinline__ uint32_t lc_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void lc_wait(uint64_t* bar, int parity) {
  asm volatile("{\n.reg .pred done;\nLC_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra LC_WAIT;\n}\n" :: "r"(lc_smem_addr(bar)), "r"(parity));
}
__device__ __forceinline__ uint32_t lc_pack(float lo, float hi, bool bf16) {
  uint16_t l, h;
  if (bf16) {
    __nv_bfloat16 a = __float2bfloat16(lo), b = __float2bfloat16(hi);
    l = *reinterpret_cast<uint16_t*>(&a); h = *reinterpret_cast<uint16_t*>(&b);
  } else {
    __half a = __float2half(lo), b = __float2half(hi);
    l = *reinterpret_cast<uint16_t*>(&a); h = *reinterpret_cast<uint16_t*>(&b);
  }
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}
