//! The wgmma partial pass's body, part 3 (two passes): the split's unnormalized output and each
//! row's running max and sum, for `combine`.
  #pragma unroll
  for (int j = 0; j < NC / 8; j++) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      const int h = h0 + r0 + 8 * k, c = wg * NC + 8 * j + 2 * t;
      if (h < H) {
        *reinterpret_cast<float2*>(o_part + ((static_cast<int64_t>(b) * S + split) * H + h) * R + c) =
            make_float2(o[4 * j + 2 * k], o[4 * j + 2 * k + 1]);
      }
    }
  }
  if (wg == 0 && t == 0) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      const int h = h0 + r0 + 8 * k;
      if (h < H) {
        const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + h) * 2;
        ml[at] = m[k];
        ml[at + 1] = l[k];
      }
    }
  }
