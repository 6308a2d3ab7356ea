// LatentCache.swift: a thin Swift layer over latent-cache's C API: a cache handle freed with its
// owner, calls that throw `LatentCacheError` (the library's status and message) instead of
// returning statuses, and host-buffer appends and reads. Engines on MLX use the C API's
// mlx_array calls directly (`import LatentCache`).
import LatentCache

/// A rejected call: the library's status and its message. The cache is exactly as before it.
public struct LatentCacheError: Error, CustomStringConvertible {
  public let status: latent_cache_status
  public let message: String

  /// The status's name without its prefix ("SHAPE", "OUT_OF_RANGE", ...).
  public var statusName: String { String(cString: latent_cache_status_name(status.rawValue)) }
  public var description: String { "\(statusName): \(message)" }
}

/// Throws the calling thread's last error when `status` is not OK. The library keeps messages
/// per thread and this runs on the thread of the failed call, so the message is that call's.
func check(_ status: latent_cache_status) throws {
  if status == LATENT_CACHE_STATUS_OK { return }
  let size = latent_cache_last_error(nil, 0) + 1
  var message = [CChar](repeating: 0, count: size)
  _ = latent_cache_last_error(&message, size)
  throw LatentCacheError(status: status, message: String(cString: message))
}

/// A state family, for reads.
public enum Family: UInt32 {
  case latent = 0
  case rope = 1
  case indexKeys = 2
}

/// One layer's cache. Safe to use from any thread or task: the library locks the handle in
/// every call (hence `@unchecked Sendable`).
public final class Cache: @unchecked Sendable {
  private let handle: OpaquePointer

  /// The library's version ("MAJOR.MINOR.PATCH").
  public static var version: String { String(cString: latent_cache_version()) }

  /// GLM-5.2's sparse-attention layer geometry by default (512 / 64 / 128, float32); start from
  /// `latent_cache_config_default()` and change fields for other layers.
  public init(config: latent_cache_config = latent_cache_config_default()) throws {
    var config = config
    var raw: OpaquePointer?
    try check(latent_cache_new(&config, &raw))
    handle = raw!
  }

  deinit { latent_cache_free(handle) }

  /// Appends `tokens` positions to each of `batch` rows from row-major floats
  /// (`[batch, tokens, width]` per family; `indexKeys` empty on a layer without index keys).
  public func append(batch: Int, tokens: Int, latent: [Float], rope: [Float], indexKeys: [Float] = []) throws {
    try latent.withUnsafeBufferPointer { latent in
      try rope.withUnsafeBufferPointer { rope in
        try indexKeys.withUnsafeBufferPointer { keys in
          try check(
            latent_cache_append_host(
              handle, batch, tokens, latent.baseAddress, latent.count, rope.baseAddress, rope.count,
              keys.isEmpty ? nil : keys.baseAddress, keys.count))
        }
      }
    }
  }

  /// One row's stored positions of a family, as floats (`[positions, width]`, row-major).
  public func readRow(_ family: Family, row: Int) throws -> [Float] {
    let positions = try rowOffsets()
    let width = try self.width(family)
    let count = row < positions.count ? positions[row] * width : 0
    var out = [Float](repeating: 0, count: count)
    var written = 0
    try out.withUnsafeMutableBufferPointer { buffer in
      try check(latent_cache_read_row_host(handle, family.rawValue, row, buffer.baseAddress, buffer.count, &written))
    }
    return Array(out.prefix(written))
  }

  /// A family's width per position.
  public func width(_ family: Family) throws -> Int {
    var out = 0
    switch family {
    case .latent: try check(latent_cache_kv_lora_rank(handle, &out))
    case .rope: try check(latent_cache_rope_head_dim(handle, &out))
    case .indexKeys: try check(latent_cache_index_head_dim(handle, &out))
    }
    return out
  }

  /// The stored window's length (positions per row, padding included).
  public func offset() throws -> Int {
    var out = 0
    try check(latent_cache_offset(handle, &out))
    return out
  }

  /// Each row's count of valid positions.
  public func rowOffsets() throws -> [Int] {
    var batch = 0
    try check(latent_cache_batch_size(handle, &batch))
    var out = [Int](repeating: 0, count: batch)
    var written = 0
    try out.withUnsafeMutableBufferPointer { buffer in
      try check(latent_cache_row_offsets(handle, buffer.baseAddress, buffer.count, &written))
    }
    return out
  }

  /// Drops the last `n` positions of every row.
  public func trim(_ n: Int, bypass: Bool = false) throws { try check(latent_cache_trim(handle, n, bypass)) }

  /// Makes room for `tokens` positions per row up front, so appends never reallocate.
  public func reserve(_ tokens: Int) throws { try check(latent_cache_reserve(handle, tokens)) }

  /// Speculative rounds: begin, then commit or roll back keeping `keep[b]` of row b's drafts.
  public func specRoundBegin() throws { try check(latent_cache_spec_round_begin(handle)) }
  public func specRoundCommit() throws { try check(latent_cache_spec_round_commit(handle)) }
  public func specRoundRollback(keep: [Int]) throws {
    try keep.withUnsafeBufferPointer { keep in
      try check(latent_cache_spec_round_rollback_rows(handle, keep.baseAddress, keep.count))
    }
  }
}
