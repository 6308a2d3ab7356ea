// CacheArrays.swift: a cache's MLX-array calls: appends of arrays (the engine's decode path),
// the stored state as views, packed state and stored index keys.
import LatentCache

/// Every stored family as arrays `[B, T, width]` (views in the stored dtype for float modes);
/// `indexKeys` is nil on a layer without index keys. Release them before the next append to
/// the same cache, or that append copies the stored history.
public struct CacheState: Sendable {
  public let latent: LatentCacheArray
  public let rope: LatentCacheArray
  public let indexKeys: LatentCacheArray?
}

extension Cache {
  /// Appends the positions in `latent` `[B, N, kvLoraRank]`, `rope` `[B, N, ropeHeadDim]` and,
  /// on a DSA layer, `indexKeys` (float32, bfloat16 or float16). Not evaluated: evaluate once
  /// per step. `leftPadding`: the first append of a padded batch.
  public func append(latent: LatentCacheArray, rope: LatentCacheArray, indexKeys: LatentCacheArray? = nil, leftPadding: [Int]? = nil) throws {
    _ = try appendArrays(latent, rope, indexKeys, leftPadding, wantState: false)
  }

  /// As `append(latent:rope:indexKeys:leftPadding:)`, returning everything stored after it.
  public func appendReturningState(
    latent: LatentCacheArray, rope: LatentCacheArray, indexKeys: LatentCacheArray? = nil, leftPadding: [Int]? = nil
  ) throws -> CacheState {
    try appendArrays(latent, rope, indexKeys, leftPadding, wantState: true)!
  }

  private func appendArrays(
    _ latent: LatentCacheArray, _ rope: LatentCacheArray, _ indexKeys: LatentCacheArray?, _ leftPadding: [Int]?, wantState: Bool
  ) throws -> CacheState? {
    let keys = indexKeys?.handle ?? mlx_array(ctx: nil)
    var outs = (mlx_array(ctx: nil), mlx_array(ctx: nil), mlx_array(ctx: nil))
    // NULL outputs build no value at all (what an engine reading packed state wants).
    let status = withUnsafeMutablePointer(to: &outs.0) { l in
      withUnsafeMutablePointer(to: &outs.1) { r in
        withUnsafeMutablePointer(to: &outs.2) { k in
          let (l, r, k) = wantState ? (l, r, k) : (nil, nil, nil)
          guard let leftPadding else {
            return latent_cache_append_latent(handle, latent.handle, rope.handle, keys, l, r, k)
          }
          return leftPadding.withUnsafeBufferPointer {
            latent_cache_append_latent_padded(
              handle, $0.baseAddress, $0.count, latent.handle, rope.handle, keys, l, r, k)
          }
        }
      }
    }
    try check(status)
    guard wantState else { return nil }
    return CacheState(
      latent: LatentCacheArray(adopting: outs.0)!, rope: LatentCacheArray(adopting: outs.1)!, indexKeys: LatentCacheArray(adopting: outs.2))
  }

  /// The values of every stored family (`[0, 0, width]` before the first append).
  public func state() throws -> CacheState {
    var l = mlx_array(ctx: nil)
    var r = mlx_array(ctx: nil)
    var k = mlx_array(ctx: nil)
    try check(latent_cache_state(handle, &l, &r, &k))
    return CacheState(latent: LatentCacheArray(adopting: l)!, rope: LatentCacheArray(adopting: r)!, indexKeys: LatentCacheArray(adopting: k))
  }

  /// The index keys stored before the coming append, `[B, T, indexHeadDim]`.
  public func storedIndexKeys() throws -> LatentCacheArray {
    var out = mlx_array(ctx: nil)
    try check(latent_cache_stored_index_keys(handle, &out))
    return LatentCacheArray(adopting: out)!
  }

  /// One family's stored parts (codes, scales, biases for the quantized modes), no copy.
  public func packedState(_ family: Family) throws -> PackedState {
    var out = latent_cache_packed(
      storage: 0, bits: 0, group_size: 0, values: mlx_array(ctx: nil), scales: mlx_array(ctx: nil),
      biases: mlx_array(ctx: nil))
    try check(latent_cache_packed_state(handle, family.cValue, &out))
    return try PackedState(out)
  }
}

/// One family's stored parts as `latent_cache_packed_state` gives them. Each array is owned on
/// its own (a view of the cache's buffers): it stays valid however long it is held, even after
/// this object is gone, but hold none past the next append to the cache, or that append copies
/// the stored history instead of writing in place.
public final class PackedState: Sendable {
  /// The family's mode.
  public let storage: Storage
  /// Bits per code: 32 or 16 for the float modes, 8 for Q8 and FP8, 4 for Q4.
  public let bits: Int
  /// Values sharing one scale: 64 (Q8, Q4), 128 (FP8), 0 (float modes).
  public let groupSize: Int
  /// The values (float modes, `[B, T, width]`) or codes (quantized modes).
  public let values: LatentCacheArray
  /// Scales (quantized modes), else nil.
  public let scales: LatentCacheArray?
  /// Biases (Q8, Q4), else nil.
  public let biases: LatentCacheArray?

  /// Takes the arrays of `raw` over, each into an owner of its own (the struct then holds none,
  /// so nothing is left for `latent_cache_packed_release` to free).
  init(_ raw: latent_cache_packed) throws {
    guard let values = LatentCacheArray(adopting: raw.values) else {
      throw LatentCacheError(status: .backend, message: "the library returned no stored values")
    }
    storage = Storage(cValue: raw.storage) ?? .f32
    bits = Int(raw.bits)
    groupSize = Int(raw.group_size)
    self.values = values
    scales = LatentCacheArray(adopting: raw.scales)
    biases = LatentCacheArray(adopting: raw.biases)
  }
}
