//! Header of the Metal DSA top-k kernel (before MLX's signature).

// A score as an unsigned key in the same order (negative floats' bits reversed, positive ones'
// sign set), so that -inf (a position the query does not see) is below every finite score.
inline uint lc_order_key(float x) {
  const uint u = as_type<uint>(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
