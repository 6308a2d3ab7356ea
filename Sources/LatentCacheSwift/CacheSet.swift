// CacheSet.swift: a model's caches as one handle (latent_cache_set*): layers lent as `Cache`
// objects, set-wide edits that change every layer or none, row operations.
import LatentCache

/// A model's layer caches. Owns its handle and frees it (and every layer) in deinit.
public final class CacheSet: @unchecked Sendable {
  // @unchecked: the only state is the immutable handle; the C contract lets any thread call
  // any function on it (each call locks what it touches).
  /// The C handle, for direct C calls: valid while this object lives (`withHandle` keeps it so).
  public let handle: OpaquePointer


  /// Calls `body` with `handle`, this object kept alive until `body` returns: the way to make C
  /// calls with the handle. A handle read from an object that nothing uses afterwards may be
  /// freed under the call in an optimized build (ARC may end an object's life at its last use).
  public func withHandle<R>(_ body: (OpaquePointer) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }
  /// A set of empty caches, layer i with `layers[i]`.
  public convenience init(layers: [CacheConfig]) throws {
    let configs = layers.map(\.cValue)
    var raw: OpaquePointer?
    try configs.withUnsafeBufferPointer { try check(latent_cache_set_new($0.baseAddress, $0.count, &raw)) }
    self.init(adopting: raw!)
  }

  /// Takes ownership of a set handle an engine made through the C API.
  public init(adopting handle: OpaquePointer) { self.handle = handle }

  deinit { latent_cache_set_free(handle) }

  static func make(_ call: (UnsafeMutablePointer<OpaquePointer?>) -> latent_cache_status) throws -> CacheSet {
    var raw: OpaquePointer?
    let status = call(&raw)
    try check(status)
    return CacheSet(adopting: raw!)
  }

  public var layerCount: Int {
    get throws {
      var out = 0
      try check(latent_cache_set_layer_count(handle, &out))
      return out
    }
  }

  /// Layer `i`, lent: it keeps this set alive, and is never freed on its own.
  public func layer(_ i: Int) throws -> Cache {
    var raw: OpaquePointer?
    try check(latent_cache_set_layer(handle, i, &raw))
    return Cache(lentBy: self, handle: raw!)
  }

  /// Every layer, lent.
  public func layers() throws -> [Cache] { try (0..<layerCount).map { try layer($0) } }

  /// Bytes every layer's buffers hold now (capacity included).
  public var bytesInUse: Int {
    get throws {
      var out = 0
      try check(latent_cache_set_bytes_in_use(handle, &out))
      return out
    }
  }

  public func trim(_ n: Int, bypass: Bool = false) throws { try check(latent_cache_set_trim(handle, n, bypass)) }
  public func reset() throws { try check(latent_cache_set_reset(handle)) }
  public func reserve(_ tokens: Int) throws { try check(latent_cache_set_reserve(handle, tokens)) }
  public func reserveRows(_ rows: Int) throws { try check(latent_cache_set_reserve_rows(handle, rows)) }
  public func shrinkRows() throws { try check(latent_cache_set_shrink_rows(handle)) }
  public func beginSpeculativeRound() throws { try check(latent_cache_set_spec_round_begin(handle)) }
  public func commitSpeculativeRound() throws { try check(latent_cache_set_spec_round_commit(handle)) }
  /// Cuts every layer back to the positions all layers hold (after a forward refused at a middle
  /// layer); returns the most positions a layer dropped.
  @discardableResult
  public func recover() throws -> Int {
    var dropped = 0
    try check(latent_cache_set_recover(handle, &dropped))
    return dropped
  }
  public func rollBackSpeculativeRound(keeping: Int) throws {
    try check(latent_cache_set_spec_round_rollback(handle, keeping))
  }
  public func rollBackSpeculativeRound(keepingPerRow keep: [Int]) throws {
    try keep.withUnsafeBufferPointer {
      try check(latent_cache_set_spec_round_rollback_rows(handle, $0.baseAddress, $0.count))
    }
  }

  public func preparePrefill(rows: Int, lengths: [Int]? = nil, leftPadding: [Int]? = nil, rightPadding: [Int]? = nil)
    throws
  {
    try withOptionalBuffer(lengths) { lengths in
      try withOptionalBuffer(leftPadding) { left in
        try withOptionalBuffer(rightPadding) { right in
          try check(latent_cache_set_prefill_prepare(handle, lengths, left, right, rows))
        }
      }
    }
  }
  public func finalizePrefill() throws { try check(latent_cache_set_prefill_finalize(handle)) }
  public func beginPrefill() throws { try check(latent_cache_set_prefill_begin(handle)) }
  public func commitPrefill(rows: [Int]) throws {
    try rows.withUnsafeBufferPointer { try check(latent_cache_set_prefill_commit(handle, $0.baseAddress, $0.count)) }
  }
  public func endPrefill() throws { try check(latent_cache_set_prefill_end(handle)) }

  public func filterRows(keeping rows: [Int]) throws {
    try rows.withUnsafeBufferPointer { try check(latent_cache_set_filter_rows(handle, $0.baseAddress, $0.count)) }
  }

  /// Every row of every source set after this set's rows, layer by layer (an empty set is
  /// filled; joining rows take free slots).
  public func mergeRows(from sources: [CacheSet]) throws {
    let handles: [OpaquePointer?] = sources.map { $0.handle }
    try withExtendedLifetime(sources) {
      try handles.withUnsafeBufferPointer { try check(latent_cache_set_merge_rows(handle, $0.baseAddress, $0.count)) }
    }
  }

  /// A new set holding row `row` of every layer.
  public func extractRow(_ row: Int) throws -> CacheSet {
    try CacheSet.make { latent_cache_set_extract_row(handle, row, $0) }
  }
}
