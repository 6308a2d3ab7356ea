// Cache.swift: one layer's cache (latent_cache*) as an owning class: made, loaded or extracted,
// freed in deinit unless a set lent it. The other Cache+*.swift files add its calls.
import LatentCache

/// One layer's attention cache. Owns its handle and frees it in deinit, except a layer a
/// `CacheSet` lent (`CacheSet.layer(_:)`), which keeps its set alive instead.
public final class Cache: @unchecked Sendable {
  // @unchecked: the only state is the immutable handle (and the lending set); the C contract
  // lets any thread call any function on a handle (each call locks it), so tasks may share it.
  /// The C handle, for direct C calls: valid while this object lives (`withHandle` keeps it so).
  public let handle: OpaquePointer


  /// Calls `body` with `handle`, this object kept alive until `body` returns: the way to make C
  /// calls with the handle. A handle read from an object that nothing uses afterwards may be
  /// freed under the call in an optimized build (ARC may end an object's life at its last use).
  public func withHandle<R>(_ body: (OpaquePointer) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }  /// The set this layer belongs to (kept alive by it), or nil for a cache of its own.
  private let lender: CacheSet?

  /// An empty cache of `config`'s geometry (GLM-5.2's sparse-attention layer by default).
  public convenience init(config: CacheConfig = CacheConfig()) throws {
    try self.init(cConfig: config.cValue)
  }

  /// An empty cache from the C struct (start from `latent_cache_config_default()`).
  public init(cConfig: latent_cache_config) throws {
    var c = cConfig
    var raw: OpaquePointer?
    try check(latent_cache_new(&c, &raw))
    handle = raw!
    lender = nil
  }

  /// Takes ownership of a handle an engine made through the C API.
  public init(adopting handle: OpaquePointer) {
    self.handle = handle
    lender = nil
  }

  /// A layer lent by `set`.
  init(lentBy set: CacheSet, handle: OpaquePointer) {
    self.handle = handle
    lender = set
  }

  deinit {
    if lender == nil { latent_cache_free(handle) }
  }

  /// Makes a cache from a C call that writes a new handle.
  static func make(_ call: (UnsafeMutablePointer<OpaquePointer?>) -> latent_cache_status) throws -> Cache {
    var raw: OpaquePointer?
    let status = call(&raw)
    try check(status)
    return Cache(adopting: raw!)
  }

  /// The config the cache was made with (or loaded as).
  public var config: CacheConfig {
    get throws {
      var out = latent_cache_config_default()
      try check(latent_cache_get_config(handle, &out))
      return CacheConfig(out)
    }
  }

  /// Appends `tokens` positions to each of `batch` rows from row-major floats: `latent`
  /// `[batch, tokens, kvLoraRank]`, `rope` `[batch, tokens, ropeHeadDim]`, `indexKeys`
  /// `[batch, tokens, indexHeadDim]` (nil on a layer without index keys).
  public func append(batch: Int, tokens: Int, latent: [Float], rope: [Float], indexKeys: [Float]? = nil) throws {
    try latent.withUnsafeBufferPointer { latent in
      try rope.withUnsafeBufferPointer { rope in
        try withOptionalBuffer(indexKeys) { keys in
          try check(
            latent_cache_append_host(
              handle, batch, tokens, latent.baseAddress, latent.count, rope.baseAddress, rope.count,
              keys, indexKeys?.count ?? 0))
        }
      }
    }
  }

  /// The first append of a padded batch: row b's first `leftPadding[b]` positions are padding.
  public func appendPadded(
    batch: Int, tokens: Int, leftPadding: [Int], latent: [Float], rope: [Float], indexKeys: [Float]? = nil
  ) throws {
    try leftPadding.withUnsafeBufferPointer { pad in
      try latent.withUnsafeBufferPointer { latent in
        try rope.withUnsafeBufferPointer { rope in
          try withOptionalBuffer(indexKeys) { keys in
            try check(
              latent_cache_append_host_padded(
                handle, batch, tokens, pad.baseAddress, pad.count, latent.baseAddress, latent.count,
                rope.baseAddress, rope.count, keys, indexKeys?.count ?? 0))
          }
        }
      }
    }
  }
}
