// CacheQueries.swift: a cache's reads of its layout and size (offset, rows, widths, bytes,
// limits, flags, signature), as throwing properties. Row vectors are sized and read so a
// concurrent append or merge cannot surface as an error (Buffers.swift).
import LatentCache

extension Cache {
  /// The stored window's length T (the longest row's position count).
  public var offset: Int { get throws { try scalar { latent_cache_offset(handle, $0) } } }
  /// The number of rows (0 before the first append and after a reset).
  public var batchSize: Int { get throws { try scalar { latent_cache_batch_size(handle, $0) } } }
  /// Each row's count of valid positions.
  public var rowOffsets: [Int] { get throws { try rowVector { latent_cache_row_offsets(handle, $0, $1, $2) } } }
  /// Where each row's valid positions start in the window.
  public var leftPadding: [Int] { get throws { try rowVector { latent_cache_left_pad(handle, $0, $1, $2) } } }
  /// Where each row's valid positions end in the window.
  public var rowEnds: [Int] { get throws { try rowVector { latent_cache_row_ends(handle, $0, $1, $2) } } }
  /// Each row's count of positions read in the compact mode (empty unless storage is composed).
  public var convertedPositions: [Int] {
    get throws { try rowVector { latent_cache_converted_positions(handle, $0, $1, $2) } }
  }
  /// Bytes of valid state held (row offsets times bytes per token).
  public var byteLength: Int { get throws { try scalar { latent_cache_byte_length(handle, $0) } } }
  public var kvLoraRank: Int { get throws { try scalar { latent_cache_kv_lora_rank(handle, $0) } } }
  public var ropeHeadDim: Int { get throws { try scalar { latent_cache_rope_head_dim(handle, $0) } } }
  /// 0 on a layer without index keys.
  public var indexHeadDim: Int { get throws { try scalar { latent_cache_index_head_dim(handle, $0) } } }
  /// Bytes one more position costs one row.
  public var bytesPerToken: Int { get throws { try scalar { latent_cache_bytes_per_token(handle, $0) } } }
  /// Positions an append may still add; `Int.max` when unbounded (the C API's SIZE_MAX).
  public var maxAppendTokens: Int {
    get throws {
      var out = 0
      try check(latent_cache_max_append_tokens(handle, &out))
      // size_t's SIZE_MAX arrives as -1 in Swift's Int.
      return out < 0 ? Int.max : out
    }
  }
  /// The smallest offset a trim may reach and leave a reusable state.
  public var minimumReusableOffset: Int {
    get throws { try scalar { latent_cache_minimum_reusable_offset(handle, $0) } }
  }
  /// Whether trim can drop positions (always true).
  public var isTrimmable: Bool { get throws { try flag { latent_cache_is_trimmable(handle, $0) } } }
  /// Whether a speculative round is open.
  public var inSpeculativeRound: Bool { get throws { try flag { latent_cache_in_spec_round(handle, $0) } } }

  /// The storage kind in the seed's grammar ("kv:mla:target:dsa", ...).
  public var signature: String {
    get throws { try readSizedString(estimate: 96) { latent_cache_signature(handle, $0, $1, $2) } }
  }

  /// A family's width per position.
  public func width(_ family: Family) throws -> Int {
    switch family {
    case .latent: try kvLoraRank
    case .rope: try ropeHeadDim
    case .indexKeys: try indexHeadDim
    }
  }

  private func scalar(_ call: (UnsafeMutablePointer<Int>) -> latent_cache_status) throws -> Int {
    var out = 0
    try check(call(&out))
    return out
  }

  private func flag(_ call: (UnsafeMutablePointer<Bool>) -> latent_cache_status) throws -> Bool {
    var out = false
    try check(call(&out))
    return out
  }

  private func rowVector(
    _ call: (UnsafeMutablePointer<Int>?, Int, UnsafeMutablePointer<Int>) -> latent_cache_status
  ) throws -> [Int] {
    try readSized(filler: 0, estimate: { try batchSize }, call)
  }
}
