// Distributed.swift: several processes on MLX's distributed layer (latent_cache_group_*): a
// group, a set's row handed to another process, arrays sent between pipeline stages, and
// GLM-5.2's stage splits.
import LatentCache

/// A group of processes on MLX's distributed layer; freed in deinit. (Named apart from
/// mlx-swift's own distributed types.)
public final class LatentCacheGroup: @unchecked Sendable {
  // @unchecked: the handle is immutable and the C contract lets any thread use it.
  public let handle: OpaquePointer

  /// Joins the group `backend` describes ("ring": `MLX_RANK`, `MLX_HOSTFILE`; "mpi", "jaccl",
  /// "nccl", "any"); without `strict`, an unconfigured backend gives a group of this process alone.
  public init(backend: String = "any", strict: Bool = false) throws {
    var raw: OpaquePointer?
    try check(latent_cache_group_init(backend, strict, &raw))
    handle = raw!
  }
  deinit { latent_cache_group_free(handle) }

  /// This process's rank and the group's size.
  public func info() throws -> (rank: Int, size: Int) {
    var (rank, size) = (0, 0)
    try withExtendedLifetime(self) { try check(latent_cache_group_info(handle, &rank, &size)) }
    return (rank, size)
  }

  /// Sends `array` to rank `dst` and waits until it is sent.
  public func send(_ array: LatentCacheArray, to dst: Int) throws {
    try withExtendedLifetime(self) { try array.withHandle { try check(latent_cache_group_send(handle, $0, dst)) } }
  }

  /// Receives from rank `src` the next array it sends, of `like`'s shape and dtype.
  public func receive(like: LatentCacheArray, from src: Int) throws -> LatentCacheArray {
    var out = mlx_array(ctx: nil)
    try withExtendedLifetime(self) { try like.withHandle { try check(latent_cache_group_recv(handle, $0, src, &out)) } }
    return LatentCacheArray(adopting: out)!
  }
}

extension CacheSet {
  /// Hands row `row` to rank `dst` of `group` (which calls `receiveRow`); returns its positions.
  @discardableResult
  public func sendRow(_ row: Int = 0, to dst: Int, via group: LatentCacheGroup) throws -> Int {
    var n = 0
    try withExtendedLifetime((self, group)) { try check(latent_cache_set_send_row(handle, row, group.handle, dst, &n)) }
    return n
  }

  /// Receives into this (empty) set the row rank `src` of `group` sends; returns its positions.
  @discardableResult
  public func receiveRow(from src: Int, via group: LatentCacheGroup) throws -> Int {
    var n = 0
    try withExtendedLifetime((self, group)) { try check(latent_cache_set_recv_row(handle, group.handle, src, &n)) }
    return n
  }
}

extension CacheConfig {
  /// The target layers at which a GLM-5.2 pipeline stage may begin with every selection local.
  public static func glm52LocalStarts() throws -> [Int] {
    try readSized(filler: 0, estimate: { 21 }) { latent_cache_glm52_local_starts($0, $1, $2) }
  }

  /// The first target layer of each of `stages` stages, as even as local starts allow.
  public static func glm52StageStarts(_ stages: Int) throws -> [Int] {
    try readSized(filler: 0, estimate: { max(stages, 1) }) { latent_cache_glm52_stage_starts(stages, $0, $1, $2) }
  }

  /// For a stage beginning at `start`: the earlier layer whose selection it needs, or nil.
  public static func glm52Crossing(_ start: Int) throws -> Int? {
    var (crosses, source) = (false, 0)
    try check(latent_cache_glm52_crossing(start, &crosses, &source))
    return crosses ? source : nil
  }
}
