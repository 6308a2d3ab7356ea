//! Body of the Metal split-K decode's combine kernel.

  constexpr int THREADS = 256;
  threadgroup float w[MAX_SPLITS];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int h = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int S = ml_shape[1];
  const int64_t base = static_cast<int64_t>(b) * S * H + h;
  float m = LC_NONE;
  for (int s = 0; s < S; s++) m = max(m, ml[(base + static_cast<int64_t>(s) * H) * 2]);
  for (int s = tid; s < S; s += THREADS) {
    const float ms = ml[(base + static_cast<int64_t>(s) * H) * 2];
    w[s] = ms <= LC_NONE ? 0.f : exp2(ms - m);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float den = 0.f;
  for (int s = 0; s < S; s++) den += w[s] * ml[(base + static_cast<int64_t>(s) * H) * 2 + 1];
  const float inv = 1.f / den;
  for (int c = tid; c < R; c += THREADS) {
    float acc = 0.f;
    for (int s = 0; s < S; s++) acc = fma(w[s], o_part[(base + static_cast<int64_t>(s) * H) * R + c], acc);
    out[(static_cast<int64_t>(b) * H + h) * R + c] = acc * inv;
  }
