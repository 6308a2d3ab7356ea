// CacheArrays.swift: a cache's MLX-array calls: appends of arrays (the engine's decode path),
// the stored state as views, packed state and stored index keys.

/// Every stored family as arrays `[B, T, width]` (views in the stored dtype for float modes);
/// `indexKeys` is nil on a layer without index keys. Release them before the next append to
/// the same cache, or that append copies the stored history.
public struct CacheState: Sendable {
  public let latent: MLXArray
  public let rope: MLXArray
  public let indexKeys: MLXArray?
}

extension Cache {
  /// Appends the positions in `latent` `[B, N, kvLoraRank]`, `rope` `[B, N, ropeHeadDim]` and,
  /// on a DSA layer, `indexKeys` (float32, bfloat16 or float16). Not evaluated: evaluate once
  /// per step. `leftPadding`: the first append of a padded batch.
  public func append(latent: MLXArray, rope: MLXArray, indexKeys: MLXArray? = nil, leftPadding: [Int]? = nil) throws {
    _ = try appendArrays(latent, rope, indexKeys, leftPadding, wantState: false)
  }

  /// As `append(latent:rope:indexKeys:leftPadding:)`, returning everything stored after it.
  public func appendReturningState(
    latent: MLXArray, rope: MLXArray, indexKeys: MLXArray? = nil, leftPadding: [Int]? = nil
  ) throws -> CacheState {
    try appendArrays(latent, rope, indexKeys, leftPadding, wantState: true)!
  }

  private func appendArrays(
    _ latent: MLXArray, _ rope: MLXArray, _ indexKeys: MLXArray?, _ leftPadding: [Int]?, wantState: Bool
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
      latent: MLXArray(adopting: outs.0)!, rope: MLXArray(adopting: outs.1)!, indexKeys: MLXArray(adopting: outs.2))
  }

  /// The values of every stored family (`[0, 0, width]` before the first append).
  public func state() throws -> CacheState {
    var l = mlx_array(ctx: nil)
    var r = mlx_array(ctx: nil)
    var k = mlx_array(ctx: nil)
    try check(latent_cache_state(handle, &l, &r, &k))
    return CacheState(latent: MLXArray(adopting: l)!, rope: MLXArray(adopting: r)!, indexKeys: MLXArray(adopting: k))
  }

  /// The index keys stored before the coming append, `[B, T, indexHeadDim]`.
  public func storedIndexKeys() throws -> MLXArray {
    var out = mlx_array(ctx: nil)
    try check(latent_cache_stored_index_keys(handle, &out))
    return MLXArray(adopting: out)!
  }

  /// One family's stored parts (codes, scales, biases for the quantized modes), no copy.
  public func packedState(_ family: Family) throws -> PackedState {
    var out = latent_cache_packed(
      storage: 0, bits: 0, group_size: 0, values: mlx_array(ctx: nil), scales: mlx_array(ctx: nil),
      biases: mlx_array(ctx: nil))
    try check(latent_cache_packed_state(handle, family.cValue, &out))
    return PackedState(out)
  }
}

/// One family's stored parts as `latent_cache_packed_state` gives them; released (with
/// latent_cache_packed_release) in deinit. The arrays are borrowed views: read them while this
/// object lives, and drop it before the next append to the cache.
public final class PackedState: @unchecked Sendable {
  // @unchecked: `raw` changes only in deinit; the views may be read and freed on any thread.
  private var raw: latent_cache_packed

  init(_ raw: latent_cache_packed) { self.raw = raw }
  deinit { latent_cache_packed_release(&raw) }

  /// The family's mode.
  public var storage: Storage { Storage(cValue: raw.storage) ?? .f32 }
  /// Bits per code: 32 or 16 for the float modes, 8 for Q8 and FP8, 4 for Q4.
  public var bits: Int { Int(raw.bits) }
  /// Values sharing one scale: 64 (Q8, Q4), 128 (FP8), 0 (float modes).
  public var groupSize: Int { Int(raw.group_size) }
  /// The values (float modes) or codes (quantized modes); borrowed.
  public var values: mlx_array { raw.values }
  /// Scales (quantized modes), else nil; borrowed.
  public var scales: mlx_array? { raw.scales.ctx == nil ? nil : raw.scales }
  /// Biases (Q8, Q4), else nil; borrowed.
  public var biases: mlx_array? { raw.biases.ctx == nil ? nil : raw.biases }
}
