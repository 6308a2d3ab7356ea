//! Header of the Metal DSA top-k kernel (before MLX's signature).

// A score as an unsigned key in the same order (negative floats' bits reversed, positive ones'
// sign set), so that -inf (a position the query does not see) is below every finite score. Key
// 0 marks "no position" (past the row): the one score it would be (NaN with every bit set, which
// a caller's scores may hold) takes key 1, so every position of a row counts.
inline uint lc_order_key(float x) {
  // -0 is +0 (as float comparison has them): ties at zero stay ties.
  const uint u = as_type<uint>(x) == 0x80000000u ? 0u : as_type<uint>(x);
  const uint k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k == 0u ? 1u : k;
}
