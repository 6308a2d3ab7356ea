// CacheReads.swift: a cache's host reads (one row, or the whole window) into Swift arrays.
// The size asked for first can be stale by the read (another task appended): the read then
// asks again and retries (Buffers.swift), so a concurrent append never throws
// BUFFER_TOO_SMALL at a caller that passed no buffer.
import LatentCache

extension Cache {
  /// Row `row`'s valid positions of `family`, `[rowOffsets[row], width]` row-major, as float32.
  public func readRow(_ family: Family, row: Int) throws -> [Float] {
    try readSized(
      filler: Float(0),
      estimate: {
        // An estimate only: a row out of range gets 0 room, and the read itself says why.
        let rows = try rowOffsets
        return row >= 0 && row < rows.count ? rows[row] * (try width(family)) : 0
      }
    ) { latent_cache_read_row_host(handle, family.cValue, row, $0, $1, $2) }
  }

  /// `family`'s whole stored window `[batchSize, offset, width]` row-major, as float32.
  /// Positions outside a row's `[leftPadding, rowEnds)` hold unspecified values.
  public func read(_ family: Family) throws -> [Float] {
    try readSized(filler: Float(0), estimate: { try batchSize * offset * width(family) }) {
      latent_cache_read_host(handle, family.cValue, $0, $1, $2)
    }
  }
}
