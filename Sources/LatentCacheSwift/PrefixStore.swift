// PrefixStore.swift: the prefix store (latent_cache_store_*): the longest stored prefix of a
// token sequence restored into an empty set or lent below its rows, from RAM and an SSD folder
// within byte budgets, shared safely between threads and processes.
import LatentCache

/// A prefix store; freed in deinit (after the blocks already handed to its writer are written).
/// Every method may be called from any thread or task; calls on one store run one at a time.
public final class PrefixStore: @unchecked Sendable {
  // @unchecked: the handle is immutable and the C contract lets any thread use it.
  /// The C handle, valid while this object lives (`withHandle` keeps it so).
  public let handle: OpaquePointer

  /// A store keeping blocks of `blockTokens` tokens in at most `ramBytes` bytes of RAM and, with
  /// a `folder`, in at most `ssdBytes` bytes of files there (indexed from what is already there).
  public init(folder: String? = nil, blockTokens: Int = 256, ramBytes: UInt64, ssdBytes: UInt64 = 0) throws {
    var raw: OpaquePointer?
    try check(latent_cache_store_open(folder, blockTokens, ramBytes, ssdBytes, &raw))
    handle = raw!
  }
  deinit { latent_cache_store_free(handle) }

  public func withHandle<R>(_ body: (OpaquePointer) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }

  /// Stores row `row` of `set`, whose first positions are `tokens`; returns the blocks newly stored.
  @discardableResult
  public func put(_ set: CacheSet, row: Int = 0, namespace: [UInt8] = [], tokens: [UInt32]) throws -> Int {
    var stored = 0
    try call(set, namespace, tokens) { s, ns, t in latent_cache_store_put(handle, s, row, ns.baseAddress, ns.count, t.baseAddress, t.count, &stored) }
    return stored
  }

  /// Positions of the longest stored prefix of `tokens` for `set`'s layers (no file is read).
  public func lookup(_ set: CacheSet, namespace: [UInt8] = [], tokens: [UInt32]) throws -> Int {
    var out = 0
    try call(set, namespace, tokens) { s, ns, t in latent_cache_store_lookup(handle, s, ns.baseAddress, ns.count, t.baseAddress, t.count, &out) }
    return out
  }

  /// Restores the longest stored prefix into `set` (empty) as one row; returns its positions.
  public func restore(into set: CacheSet, namespace: [UInt8] = [], tokens: [UInt32]) throws -> Int {
    var out = 0
    try call(set, namespace, tokens) { s, ns, t in latent_cache_store_restore(handle, s, ns.baseAddress, ns.count, t.baseAddress, t.count, &out) }
    return out
  }

  /// Puts `rows` empty rows of `set` (empty) over the longest stored prefix, lent without a
  /// copy; returns its positions.
  public func attach(_ set: CacheSet, rows: Int, namespace: [UInt8] = [], tokens: [UInt32]) throws -> Int {
    var out = 0
    try call(set, namespace, tokens) { s, ns, t in
      latent_cache_store_attach(handle, s, ns.baseAddress, ns.count, t.baseAddress, t.count, rows, &out)
    }
    return out
  }

  /// Waits until every block put so far is durable in the folder.
  public func sync() throws { try withHandle { try check(latent_cache_store_sync($0)) } }

  /// Indexes the folder again (files other processes removed; their new blocks are found by
  /// lookups without it); returns the blocks it holds.
  public func refresh() throws -> Int {
    var out = 0
    try withHandle { try check(latent_cache_store_refresh($0, &out)) }
    return out
  }

  /// The store's numbers (see `latent_cache_store_stats` in the C header).
  public struct Stats: Sendable, Equatable {
    public var ramBlocks = 0, ramBytes = 0, ssdBlocks = 0, ssdBytes = 0, hits = 0, misses = 0
    public var ramEvictions = 0, ssdEvictions = 0, restores = 0, attaches = 0, blocksPut = 0
    public var blocksNotStored = 0, blocksWritten = 0, writeFailures = 0, damaged = 0
  }

  public func stats() throws -> Stats {
    var c = latent_cache_store_stats()
    try withHandle { try check(latent_cache_store_info($0, &c)) }
    return Stats(
      ramBlocks: Int(c.ram_blocks), ramBytes: Int(c.ram_bytes), ssdBlocks: Int(c.ssd_blocks), ssdBytes: Int(c.ssd_bytes),
      hits: Int(c.hits), misses: Int(c.misses), ramEvictions: Int(c.ram_evictions), ssdEvictions: Int(c.ssd_evictions),
      restores: Int(c.restores), attaches: Int(c.attaches), blocksPut: Int(c.blocks_put),
      blocksNotStored: Int(c.blocks_not_stored), blocksWritten: Int(c.blocks_written),
      writeFailures: Int(c.write_failures), damaged: Int(c.damaged))
  }

  /// Runs `body` with the set's handle and the namespace's and tokens' storage, all kept alive.
  private func call(
    _ set: CacheSet, _ namespace: [UInt8], _ tokens: [UInt32],
    _ body: (OpaquePointer, UnsafeBufferPointer<UInt8>, UnsafeBufferPointer<UInt32>) -> latent_cache_status
  ) throws {
    try withExtendedLifetime((self, set)) {
      try namespace.withUnsafeBufferPointer { ns in
        try tokens.withUnsafeBufferPointer { t in try check(body(set.handle, ns, t)) }
      }
    }
  }
}
