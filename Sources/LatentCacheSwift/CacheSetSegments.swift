// CacheSetSegments.swift: segments, a row's positions [from, to) saved on their own and chained
// by digest, so an engine snapshots a conversation at the cost of each turn and restores (or
// extends) a set from the chain.
import LatentCache

/// What a segment says of itself (read from its header alone).
public struct SegmentInfo: Sendable, Equatable {
  /// The row positions `[from, to)` it holds.
  public var from: Int
  public var to: Int
  /// The digest of the chain before it (0 for a first segment) and up to and including it.
  public var previousDigest: UInt64
  public var digest: UInt64
  /// The key the engine saved it with (its own token hash, for example).
  public var key: [UInt8]
  public var layerCount: Int
}

/// The chain a set knows it holds: the first `positions` positions of row `row`.
public struct SegmentChain: Sendable, Equatable {
  public var row: Int
  public var positions: Int
  /// The `previousDigest` the next segment saved from the set carries.
  public var digest: UInt64

  public init(row: Int, positions: Int, digest: UInt64) {
    self.row = row
    self.positions = positions
    self.digest = digest
  }
}

/// Calls `body` with C pointers to every array's bytes (borrowed for the call).
private func withBufferPointers<R>(
  _ arrays: [[UInt8]], _ body: ([UnsafePointer<UInt8>?], [Int]) throws -> R
) throws -> R {
  func nest(_ i: Int, _ pointers: [UnsafePointer<UInt8>?]) throws -> R {
    if i == arrays.count { return try body(pointers, arrays.map(\.count)) }
    return try arrays[i].withUnsafeBufferPointer { try nest(i + 1, pointers + [$0.baseAddress]) }
  }
  return try nest(0, [])
}

/// Calls `body` with C strings of every path (borrowed for the call).
private func withCStrings<R>(_ strings: [String], _ body: ([UnsafePointer<CChar>?]) throws -> R) throws -> R {
  func nest(_ i: Int, _ pointers: [UnsafePointer<CChar>?]) throws -> R {
    if i == strings.count { return try body(pointers) }
    return try strings[i].withCString { try nest(i + 1, pointers + [$0]) }
  }
  return try nest(0, [])
}

/// A segment's header through `read` (a file's or bytes'): asked once for the key's length,
/// then again with room for it.
private func readInfo(
  _ read: (UnsafeMutablePointer<latent_cache_segment_info>, UnsafeMutablePointer<UInt8>?, Int) -> latent_cache_status
) throws -> SegmentInfo {
  var info = latent_cache_segment_info()
  try check(read(&info, nil, 0))
  var key = [UInt8](repeating: 0, count: info.key_len)
  try key.withUnsafeMutableBufferPointer { try check(read(&info, $0.baseAddress, $0.count)) }
  return SegmentInfo(
    from: info.from, to: info.to, previousDigest: info.previous_digest, digest: info.digest,
    key: Array(key.prefix(info.key_len)), layerCount: info.n_layers)
}

extension CacheSet {
  /// Saves positions `[from, to)` of row `row` of every layer to `path` as the next segment of
  /// the set's chain; returns the chain's digest after it.
  @discardableResult
  public func saveSegment(row: Int = 0, from: Int, to: Int, key: [UInt8] = [], path: String) throws -> UInt64 {
    var digest: UInt64 = 0
    try key.withUnsafeBufferPointer {
      try check(latent_cache_set_save_segment(handle, row, from, to, $0.baseAddress, $0.count, path, &digest))
    }
    return digest
  }

  /// `saveSegment` into bytes: the segment and the chain's digest after it.
  public func segment(row: Int = 0, from: Int, to: Int, key: [UInt8] = []) throws -> (bytes: [UInt8], digest: UInt64) {
    var data: UnsafeMutablePointer<UInt8>?
    var count = 0
    var digest: UInt64 = 0
    try key.withUnsafeBufferPointer {
      try check(
        latent_cache_set_save_segment_to_buffer(handle, row, from, to, $0.baseAddress, $0.count, &data, &count, &digest))
    }
    return (takeBytes(data, count), digest)
  }

  /// A one-row set restored from a whole chain of segment files, in order from position 0.
  public convenience init(segmentFiles paths: [String]) throws {
    var raw: OpaquePointer?
    try withCStrings(paths) { try check(latent_cache_set_load_segments($0, paths.count, &raw)) }
    self.init(adopting: raw!)
  }

  /// A one-row set restored from a whole chain of segments in bytes.
  public convenience init(segments: [[UInt8]]) throws {
    var raw: OpaquePointer?
    try withBufferPointers(segments) { data, lens in
      try check(latent_cache_set_load_segments_from_buffers(data, lens, segments.count, &raw))
    }
    self.init(adopting: raw!)
  }

  /// Appends the positions of the chain's segments the set does not hold yet; returns how
  /// many segments were appended (0 when the set already holds them all).
  @discardableResult
  public func extend(segmentFiles paths: [String]) throws -> Int {
    var appended = 0
    try withCStrings(paths) { try check(latent_cache_set_extend_segments(handle, $0, paths.count, &appended)) }
    return appended
  }

  /// `extend(segmentFiles:)` from segments in bytes.
  @discardableResult
  public func extend(segments: [[UInt8]]) throws -> Int {
    var appended = 0
    try withBufferPointers(segments) { data, lens in
      try check(latent_cache_set_extend_segments_from_buffers(handle, data, lens, segments.count, &appended))
    }
    return appended
  }

  /// The chain the set knows it holds (throws `invalidState` when it knows none).
  public func segmentChain() throws -> SegmentChain {
    var (row, positions, digest) = (0, 0, UInt64(0))
    try check(latent_cache_set_segment_chain(handle, &row, &positions, &digest))
    return SegmentChain(row: row, positions: positions, digest: digest)
  }

  /// The chain row `row` is known to hold: saved or restored there, or inherited from the row
  /// it was forked from or the prefix it was attached over (throws `invalidState` when it holds
  /// none, `outOfRange` for a row the set does not hold).
  public func segmentChain(row: Int) throws -> SegmentChain {
    var (positions, digest) = (0, UInt64(0))
    try check(latent_cache_set_row_segment_chain(handle, row, &positions, &digest))
    return SegmentChain(row: row, positions: positions, digest: digest)
  }

  /// The header of the segment file at `path`, without reading its positions.
  public static func segmentInfo(path: String) throws -> SegmentInfo {
    try readInfo { latent_cache_segment_read_info(path, $0, $1, $2) }
  }

  /// The header of a segment in bytes.
  public static func segmentInfo(bytes: [UInt8]) throws -> SegmentInfo {
    try bytes.withUnsafeBufferPointer { buffer in
      try readInfo { latent_cache_segment_read_info_from_buffer(buffer.baseAddress, buffer.count, $0, $1, $2) }
    }
  }
}
