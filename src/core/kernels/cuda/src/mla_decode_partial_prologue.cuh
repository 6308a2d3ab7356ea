//! Both partial passes' body, shared middle: threads, split, pointers, strides.
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x, S = gridDim.x, b = blockIdx.y, h0 = blockIdx.z * M;
  // GATHER: the window is a row's selected positions, `sel [B, 1, k]` int32 naming stored
  // positions (DSA's top-k), read through it where a tile is copied in (no gathered copy);
  // otherwise the stored positions themselves (`sel` unread).
  const int* selp = reinterpret_cast<const int*>(sel);
  const int T = GATHER ? sel_shape[2] : latent_shape[1];
  // A selected position outside the stored buffers is read clamped into them: the indices are
  // the caller's, and no index reads outside what the cache holds.
  const int stored = min(latent_shape[1], rope_shape[1]);
  auto at = [&](int pos) -> int64_t {
    return GATHER ? min(max(selp[b * sel_strides[0] + pos * sel_strides[2]], 0), stored - 1) : pos;
  };
  // Split s takes positions [s * chunk, (s + 1) * chunk): whole tiles, S of them covering T.
  const int chunk = ((T + S - 1) / S + N - 1) / N * N;
  const int* rp = reinterpret_cast<const int*>(ranges);
  // RANGES bounds a row's window positions; with GATHER it bounds the stored positions its
  // selection may name instead (a prefill chunk's queries, one a row, each seeing the positions
  // up to its own): the window is the whole selection, and a position selected outside the
  // bounds is masked (`seen`), as the ops' path masks it.
  const int lo = RANGES && !GATHER ? rp[2 * b] : 0, hi = RANGES && !GATHER ? rp[2 * b + 1] : T;
  const int seen_lo = GATHER && RANGES ? rp[2 * b] : 0, seen_hi = GATHER && RANGES ? rp[2 * b + 1] : 0;
  auto seen = [&](int pos) -> bool {
    if (!(GATHER && RANGES)) return true;
    const int64_t s = at(pos);
    return s >= seen_lo && s < seen_hi;
  };
  const int begin = max(lo, split * chunk), end = min(hi, (split + 1) * chunk);
  const float sc = __int_as_float(SCALE) * 1.4426950408889634f;

  const uint16_t* qlat = reinterpret_cast<const uint16_t*>(q_latent);
  const uint16_t* qrop = reinterpret_cast<const uint16_t*>(q_rope);
  const int64_t q0 = q_latent_strides[0], q1 = q_latent_strides[1], q2 = q_latent_strides[2], q3 = q_latent_strides[3];
  const int64_t p0 = q_rope_strides[0], p1 = q_rope_strides[1], p2 = q_rope_strides[2], p3 = q_rope_strides[3];
  const uint16_t* lat = reinterpret_cast<const uint16_t*>(latent);
  const uint16_t* rop = reinterpret_cast<const uint16_t*>(rope);
  const int64_t l0 = latent_strides[0], l1 = latent_strides[1], l2 = latent_strides[2];
  const int64_t r0s = rope_strides[0], r1s = rope_strides[1], r2s = rope_strides[2];
  // 16-byte copies where rows are contiguous and aligned (the stored buffers and engines' queries
  // are); element copies otherwise.
  auto aligned = [](const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15) == 0; };
  const bool qvec = q3 == 1 && p3 == 1 && q0 % 8 == 0 && q1 % 8 == 0 && q2 % 8 == 0 && p0 % 8 == 0 &&
                    p1 % 8 == 0 && p2 % 8 == 0 && aligned(qlat) && aligned(qrop);
  const bool vec = l2 == 1 && r2s == 1 && l0 % 8 == 0 && l1 % 8 == 0 && r0s % 8 == 0 && r1s % 8 == 0 && aligned(lat) && aligned(rop);
