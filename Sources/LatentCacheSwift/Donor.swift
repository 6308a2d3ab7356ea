// Donor.swift: a snapshot of a cache's rows (latent_cache_donor*) and the attention computed
// over it: GLM-5's absorbed MLA attention, DSA index scores, top-k selection, and attention
// over the selected positions. Results are lazy MLX arrays the caller owns.
import LatentCache

/// The row layout a donor captured.
public struct DonorRows: Sendable, Equatable {
  public let batch: Int
  public let offset: Int
  public let leftPadding: [Int]
  public let rowEnds: [Int]

  public init(batch: Int, offset: Int, leftPadding: [Int], rowEnds: [Int]) {
    self.batch = batch
    self.offset = offset
    self.leftPadding = leftPadding
    self.rowEnds = rowEnds
  }
}

/// A snapshot of a cache (`Cache.captureDonor()`), unchanged by later appends; freed in deinit.
public final class Donor: @unchecked Sendable {
  // @unchecked: the handle is immutable and the C contract lets any thread use it.
  /// The C handle, for direct C calls. Valid while this object lives.
  public let handle: OpaquePointer

  /// Takes ownership of a donor handle.
  public init(adopting handle: OpaquePointer) { self.handle = handle }
  deinit { latent_cache_donor_free(handle) }

  /// The snapshot's batch, offset and row bounds.
  public func rows() throws -> DonorRows {
    var batch = 0
    var offset = 0
    try check(latent_cache_donor_rows(handle, &batch, &offset, nil, nil, 0))
    // A donor never changes, so the batch read above sizes the vectors exactly.
    var left = [Int](repeating: 0, count: batch)
    var ends = [Int](repeating: 0, count: batch)
    try left.withUnsafeMutableBufferPointer { left in
      try ends.withUnsafeMutableBufferPointer { ends in
        try check(latent_cache_donor_rows(handle, &batch, &offset, left.baseAddress, ends.baseAddress, batch))
      }
    }
    return DonorRows(batch: batch, offset: offset, leftPadding: left, rowEnds: ends)
  }

  /// `softmax(scale * (qLatent . latent^T + qRope . rope^T) + mask) . latent`, `[B, H, Lq,
  /// kvLoraRank]` float32; `mask` only with `.array` (additive, broadcastable to `[B, H, Lq, T]`).
  public func attend(qLatent: LatentCacheArray, qRope: LatentCacheArray, scale: Float, mode: MaskMode, mask: LatentCacheArray? = nil) throws
    -> LatentCacheArray
  {
    try output {
      latent_cache_donor_attend(
        handle, qLatent.handle, qRope.handle, scale, mode.cValue, mask?.handle ?? mlx_array(ctx: nil), $0)
    }!
  }

  /// DSA index scores `[B, Lq, T]`: `sum_h weights[b,q,h] * ReLU(qIndex[b,h,q] . k[b,t])`,
  /// -inf where a query does not see a position.
  public func indexScores(qIndex: LatentCacheArray, weights: LatentCacheArray, mode: MaskMode) throws -> LatentCacheArray {
    try output { latent_cache_donor_index_scores(handle, qIndex.handle, weights.handle, mode.cValue, $0) }!
  }

  /// The `k` positions of highest score per query (`[B, Lq, k]` int32), or nil when the
  /// window holds no more than `k` positions (attend densely then).
  public func select(scores: LatentCacheArray, k: Int) throws -> LatentCacheArray? {
    try output { latent_cache_donor_select(handle, scores.handle, k, $0) }
  }

  /// `select(scores: indexScores(...), k:)` in one call (the same positions, or nil); where the
  /// library's kernels run, one MLX operation fewer per indexer layer.
  public func indexSelect(qIndex: LatentCacheArray, weights: LatentCacheArray, mode: MaskMode, k: Int) throws -> LatentCacheArray? {
    try output { latent_cache_donor_index_select(handle, qIndex.handle, weights.handle, mode.cValue, k, $0) }
  }

  /// Attention over the positions in `indices` alone (`[B, H, Lq, kvLoraRank]` float32).
  public func attendSelected(qLatent: LatentCacheArray, qRope: LatentCacheArray, scale: Float, mode: MaskMode, indices: LatentCacheArray) throws
    -> LatentCacheArray
  {
    try output {
      latent_cache_donor_attend_selected(handle, qLatent.handle, qRope.handle, scale, mode.cValue, indices.handle, $0)
    }!
  }

  private func output(_ call: (UnsafeMutablePointer<mlx_array>) -> latent_cache_status) throws -> LatentCacheArray? {
    var out = mlx_array(ctx: nil)
    try check(call(&out))
    return LatentCacheArray(adopting: out)
  }
}
