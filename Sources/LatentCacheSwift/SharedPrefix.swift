// SharedPrefix.swift: positions stored once and read below the rows of other caches without
// copies (latent_cache_prefix*): a prompt under n continuations (`forkRow`), a stored
// conversation under a new request (`sharePrefix`, then `attachPrefix`), for a cache or a set.
import LatentCache

/// A shared prefix (one per layer for a set's); freed in deinit. Caches attached to it keep
/// what they read alive after it is freed.
public final class SharedPrefix: @unchecked Sendable {
  // @unchecked: the handle is immutable and the C contract lets any thread use it.
  /// The C handle, for direct C calls: valid while this object lives (`withHandle` keeps it so).
  public let handle: OpaquePointer


  /// Calls `body` with `handle`, this object kept alive until `body` returns: the way to make C
  /// calls with the handle. A handle read from an object that nothing uses afterwards may be
  /// freed under the call in an optimized build (ARC may end an object's life at its last use).
  public func withHandle<R>(_ body: (OpaquePointer) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }
  /// Takes ownership of a prefix handle.
  public init(adopting handle: OpaquePointer) { self.handle = handle }
  deinit { latent_cache_prefix_free(handle) }

  static func make(_ call: (UnsafeMutablePointer<OpaquePointer?>) -> latent_cache_status) throws -> SharedPrefix {
    var raw: OpaquePointer?
    try check(call(&raw))
    return SharedPrefix(adopting: raw!)
  }

  /// Layers held (1 for a cache's prefix), positions, and the bytes its arrays hold (once).
  public func info() throws -> (layers: Int, positions: Int, bytes: Int) {
    var (layers, positions, bytes) = (0, 0, 0)
    try check(latent_cache_prefix_info(handle, &layers, &positions, &bytes))
    return (layers, positions, bytes)
  }
}

extension Cache {
  /// Row `row`'s first `positions` positions as a prefix other caches attach (copied once
  /// above this cache's own shared prefix; this cache is not changed).
  public func sharePrefix(row: Int, positions: Int) throws -> SharedPrefix {
    try SharedPrefix.make { latent_cache_share_prefix(handle, row, positions, $0) }
  }

  /// Makes this empty cache `rows` rows over `prefix`, holding nothing of their own yet.
  public func attachPrefix(_ prefix: SharedPrefix, rows: Int) throws {
    try withExtendedLifetime(prefix) { try check(latent_cache_attach_prefix(handle, prefix.handle, rows)) }
  }

  /// Row `row` becomes the shared prefix of `n` new rows, which replace every row.
  public func forkRow(_ row: Int, into n: Int) throws { try check(latent_cache_fork_row(handle, row, n)) }

  /// Positions of the shared prefix below every row (0 without one).
  public var sharedPositions: Int {
    get throws {
      var out = 0
      try check(latent_cache_shared_positions(handle, &out))
      return out
    }
  }
}

extension CacheSet {
  /// Set-wide `Cache.sharePrefix`: one prefix per layer, in one object.
  public func sharePrefix(row: Int, positions: Int) throws -> SharedPrefix {
    try SharedPrefix.make { latent_cache_set_share_prefix(handle, row, positions, $0) }
  }

  /// Set-wide `Cache.attachPrefix` (a set's prefix, layer by layer).
  public func attachPrefix(_ prefix: SharedPrefix, rows: Int) throws {
    try withExtendedLifetime(prefix) { try check(latent_cache_set_attach_prefix(handle, prefix.handle, rows)) }
  }

  /// Set-wide `Cache.forkRow`.
  public func forkRow(_ row: Int, into n: Int) throws { try check(latent_cache_set_fork_row(handle, row, n)) }
}
