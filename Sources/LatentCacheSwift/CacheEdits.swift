// CacheEdits.swift: a cache's edits besides appends: trim, reset, reserve, speculative rounds
// (with per-row rollback), both prefill protocols, and the row operations (merge, extract,
// filter). Every rejected call leaves the cache as it was.
import LatentCache

extension Cache {
  /// Drops the last `n` positions of every row; inside a round, or below the minimum reusable
  /// offset of composed storage, only with `bypass`.
  public func trim(_ n: Int, bypass: Bool = false) throws { try check(latent_cache_trim(handle, n, bypass)) }

  /// Empties the cache (rows, positions, rounds, prefills, buffers); keeps the geometry.
  public func reset() throws { try check(latent_cache_reset(handle)) }

  /// Makes room for `tokens` positions per row now, so appends up to that never reallocate.
  public func reserve(_ tokens: Int) throws { try check(latent_cache_reserve(handle, tokens)) }

  /// Opens a speculative round: records every row's position count.
  public func beginSpeculativeRound() throws { try check(latent_cache_spec_round_begin(handle)) }

  /// Closes the round, keeping everything appended in it.
  public func commitSpeculativeRound() throws { try check(latent_cache_spec_round_commit(handle)) }

  /// Closes the round; every row keeps the first `keeping` positions it appended in it.
  public func rollBackSpeculativeRound(keeping: Int) throws {
    try check(latent_cache_spec_round_rollback(handle, keeping))
  }

  /// Closes the round; row b keeps the first `keepingPerRow[b]` positions it appended in it.
  public func rollBackSpeculativeRound(keepingPerRow keep: [Int]) throws {
    try keep.withUnsafeBufferPointer {
      try check(latent_cache_spec_round_rollback_rows(handle, $0.baseAddress, $0.count))
    }
  }

  /// Opens a padded batched prefill over `rows` rows; each vector is nil or `rows` entries.
  public func preparePrefill(rows: Int, lengths: [Int]? = nil, leftPadding: [Int]? = nil, rightPadding: [Int]? = nil)
    throws
  {
    try withOptionalBuffer(lengths) { lengths in
      try withOptionalBuffer(leftPadding) { left in
        try withOptionalBuffer(rightPadding) { right in
          try check(latent_cache_prefill_prepare(handle, lengths, left, right, rows))
        }
      }
    }
  }

  /// Closes the padded prefill: every row drops its right padding.
  public func finalizePrefill() throws { try check(latent_cache_prefill_finalize(handle)) }

  /// Opens prefill maintenance for a chunked prefill (the seed's `beginPrefill`).
  public func beginPrefill() throws { try check(latent_cache_prefill_begin(handle)) }

  /// Marks `rows` as at their prompts' ends (the seed's `commitPrefill`).
  public func commitPrefill(rows: [Int]) throws {
    try rows.withUnsafeBufferPointer { try check(latent_cache_prefill_commit(handle, $0.baseAddress, $0.count)) }
  }

  /// Closes prefill maintenance (the seed's `endPrefill`).
  public func endPrefill() throws { try check(latent_cache_prefill_end(handle)) }

  /// Makes room for `rows` rows now, so requests joining the batch (`mergeRows`) take free
  /// slots and copy nothing else.
  public func reserveRows(_ rows: Int) throws { try check(latent_cache_reserve_rows(handle, rows)) }

  /// Releases the slots no row holds (rows copied once into buffers of exactly their count).
  public func shrinkRows() throws { try check(latent_cache_shrink_rows(handle)) }

  /// Every row of every source after this cache's rows, in order (sources unchanged). An empty
  /// cache is filled; rows joining a running batch take free slots (rows that left, or
  /// `reserveRows`), so a join costs the joining rows' positions.
  public func mergeRows(from sources: [Cache]) throws {
    let handles: [OpaquePointer?] = sources.map { $0.handle }
    try withExtendedLifetime(sources) {
      try handles.withUnsafeBufferPointer { try check(latent_cache_merge_rows(handle, $0.baseAddress, $0.count)) }
    }
  }

  /// A new single-row cache holding row `row`'s valid positions.
  public func extractRow(_ row: Int) throws -> Cache {
    try Cache.make { latent_cache_extract_row(handle, row, $0) }
  }

  /// Keeps the rows listed in `rows`, in that order. A leaving row keeps its slot for the next
  /// join; only kept rows that change places are copied.
  public func filterRows(keeping rows: [Int]) throws {
    try rows.withUnsafeBufferPointer { try check(latent_cache_filter_rows(handle, $0.baseAddress, $0.count)) }
  }

  /// A snapshot of every stored family and the row layout, for attention (`Donor`).
  public func captureDonor() throws -> Donor {
    var raw: OpaquePointer?
    try check(latent_cache_capture_donor_rows(handle, &raw))
    return Donor(adopting: raw!)
  }
}
