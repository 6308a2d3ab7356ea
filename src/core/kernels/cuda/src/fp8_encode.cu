//! Body of the FP8 encoding kernel: one warp a block of 128 values.

  const long long block = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const long long blocks = static_cast<long long>(x_shape[0]) * x_shape[1] * (x_shape[2] / 128);
  if (block >= blocks) return;  // whole warps: a warp's 32 lanes share one block
  const long long base = block * 128 + lane * 4;
  float v[4];
  #pragma unroll
  for (int k = 0; k < 4; k++) v[k] = static_cast<float>(x[base + k]);
  float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, off));
  const float s = fmaxf(m, 1e-10f) / 448.0f;
  unsigned int packed = 0;
  #pragma unroll
  for (int k = 0; k < 4; k++) packed |= static_cast<unsigned int>(__nv_fp8_e4m3(v[k] / s).__x) << (8 * k);
  reinterpret_cast<unsigned int*>(codes)[block * 32 + lane] = packed;
  if (lane == 0) scale[block] = s;
