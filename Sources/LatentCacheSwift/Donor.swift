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
  /// The C handle, for direct C calls: valid while this object lives (`withHandle` keeps it so).
  public let handle: OpaquePointer

  /// Takes ownership of a donor handle.
  public init(adopting handle: OpaquePointer) { self.handle = handle }
  deinit { latent_cache_donor_free(handle) }


  /// Calls `body` with `handle`, this object kept alive until `body` returns: the way to make C
  /// calls with the handle. A handle read from an object that nothing uses afterwards may be
  /// freed under the call in an optimized build (ARC may end an object's life at its last use).
  public func withHandle<R>(_ body: (OpaquePointer) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }
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

  /// GLM-5's absorbed MLA attention over the snapshot's rows:
  /// `softmax(scale * (qLatent . latent^T + qRope . rope^T) + mask) . latent`, lazily.
  ///
  /// - `qLatent` `[B, H, Lq, kvLoraRank]`, `qRope` `[B, H, Lq, ropeHeadDim]` (float32, bfloat16
  ///   or float16, one dtype); `B` the donor's batch, `H` any number of heads, `Lq` queries.
  /// - What a query sees: every row's padding and the positions past its end are masked out
  ///   (score -inf). `.none`: every valid position of its row. `.causal`: bottom-right aligned,
  ///   as MLX's SDPA: query `i` of `Lq` is the row's position `len - Lq + i` and sees the
  ///   positions up to it; a query before the row's first position (a row shorter than `Lq`)
  ///   sees none and gives zeros. `.array`: every valid position plus `mask`, additive,
  ///   broadcastable to `[B, H, Lq, T]` (`T` the window, `rows().offset`); a query whose mask row
  ///   is all -inf gives zeros. `mask` is required with `.array` and refused otherwise.
  /// - Returns `[B, H, Lq, kvLoraRank]` float32. Every row must hold a position.
  public func attend(qLatent: LatentCacheArray, qRope: LatentCacheArray, scale: Float, mode: MaskMode, mask: LatentCacheArray? = nil) throws
    -> LatentCacheArray
  {
    try output {
      latent_cache_donor_attend(
        handle, qLatent.handle, qRope.handle, scale, mode.cValue, mask?.handle ?? mlx_array(ctx: nil), $0)
    }!
  }

  /// DSA index scores `[B, Lq, T]` float32: `sum_h weights[b,q,h] * ReLU(qIndex[b,h,q] . k[b,t])`
  /// against the stored index keys, -inf where a query does not see a position (padding, past
  /// the row's end, and with `.causal` the later positions, as `attend` says). `qIndex` is
  /// `[B, Hi, Lq, indexHeadDim]`, `weights` `[B, Lq, Hi]` (scaled as the model scales them);
  /// `.none` or `.causal` only. A layer without index keys refuses it.
  public func indexScores(qIndex: LatentCacheArray, weights: LatentCacheArray, mode: MaskMode) throws -> LatentCacheArray {
    try output { latent_cache_donor_index_scores(handle, qIndex.handle, weights.handle, mode.cValue, $0) }!
  }

  /// The `k` positions of highest score per query (`scores` `[B, Lq, T]` from `indexScores`):
  /// `[B, Lq, k]` int32 window positions in no particular order; nil when the window holds no
  /// more than `k` positions (`T <= k`: attend densely then, as DeepSeek's indexer does). Ties at
  /// the k-th score may go to any of the tied positions, and a query that sees fewer than `k`
  /// positions gets some it does not see (`attendSelected` masks them).
  public func select(scores: LatentCacheArray, k: Int) throws -> LatentCacheArray? {
    try output { latent_cache_donor_select(handle, scores.handle, k, $0) }
  }

  /// `select(scores: indexScores(...), k:)` in one call (the same positions, or nil); where the
  /// library's kernels run, one MLX operation fewer per indexer layer.
  public func indexSelect(qIndex: LatentCacheArray, weights: LatentCacheArray, mode: MaskMode, k: Int) throws -> LatentCacheArray? {
    try output { latent_cache_donor_index_select(handle, qIndex.handle, weights.handle, mode.cValue, k, $0) }
  }

  /// Attention over the positions in `indices` alone (`[B, Lq, k]` int32 window positions, from
  /// `select`): `attend`'s formula over each query's `k` positions, those it does not see (see
  /// `attend`) masked out; a query that sees none of them gives zeros. Queries as `attend`'s;
  /// `.none` or `.causal`. Returns `[B, H, Lq, kvLoraRank]` float32, lazily; reads `k` positions
  /// per query, not the whole window.
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
