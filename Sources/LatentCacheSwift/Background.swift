// Background.swift: the calls that evaluate, in forms a Swift task awaits. An evaluation blocks
// the calling thread until MLX is done (the library hands the work to its evaluation thread and
// waits for it), so a task that calls one directly holds a thread of Swift's cooperative pool
// (a few threads for the whole process) for that long. `inBackground` runs the same call on a
// thread outside the pool and resumes the task when it returns: the call, its result, its error
// and the error's message are the synchronous form's (the message is read on the thread that made
// the call, as `check` requires).
import Dispatch
import LatentCache

/// Runs blocking library calls outside Swift's cooperative pool.
enum Blocking {
  /// GCD's threads, not the pool's: any number of tasks may wait here while the pool runs on.
  /// (Such a thread may end whenever GCD likes: the library's evaluations run on its own thread.)
  private static let queue = DispatchQueue(label: "latent-cache.blocking", attributes: .concurrent)

  static func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
      queue.async { continuation.resume(with: Result(catching: body)) }
    }
  }
}

/// A cache's calls that evaluate, awaited without holding a thread of the cooperative pool
/// (`cache.inBackground`; see the file's note).
public struct CacheInBackground: Sendable {
  let cache: Cache

  /// `Cache.readRow(_:row:)`, awaited.
  public func readRow(_ family: Family, row: Int) async throws -> [Float] {
    try await Blocking.run { [cache] in try cache.readRow(family, row: row) }
  }

  /// `Cache.read(_:)`, awaited.
  public func read(_ family: Family) async throws -> [Float] {
    try await Blocking.run { [cache] in try cache.read(family) }
  }

  /// `Cache.append(batch:tokens:latent:rope:indexKeys:)` (evaluated before it returns), awaited.
  public func append(batch: Int, tokens: Int, latent: [Float], rope: [Float], indexKeys: [Float]? = nil) async throws {
    try await Blocking.run { [cache] in
      try cache.append(batch: batch, tokens: tokens, latent: latent, rope: rope, indexKeys: indexKeys)
    }
  }

  /// `Cache.save(to:)`, awaited.
  public func save(to path: String) async throws {
    try await Blocking.run { [cache] in try cache.save(to: path) }
  }

  /// `Cache.serialized()`, awaited.
  public func serialized() async throws -> [UInt8] {
    try await Blocking.run { [cache] in try cache.serialized() }
  }
}

extension Cache {
  /// This cache's calls that evaluate, as `async` forms.
  public var inBackground: CacheInBackground { CacheInBackground(cache: self) }
}

/// A set's calls that evaluate, awaited without holding a thread of the cooperative pool.
public struct CacheSetInBackground: Sendable {
  let set: CacheSet

  /// `CacheSet.save(to:)`, awaited.
  public func save(to path: String) async throws {
    try await Blocking.run { [set] in try set.save(to: path) }
  }

  /// `CacheSet.serialized()`, awaited.
  public func serialized() async throws -> [UInt8] {
    try await Blocking.run { [set] in try set.serialized() }
  }
}

extension CacheSet {
  /// This set's calls that evaluate, as `async` forms.
  public var inBackground: CacheSetInBackground { CacheSetInBackground(set: self) }
}

/// An array's calls that evaluate, awaited without holding a thread of the cooperative pool.
public struct ArrayInBackground: Sendable {
  let array: LatentCacheArray

  /// `LatentCacheArray.eval()`, awaited.
  public func eval() async throws {
    try await Blocking.run { [array] in try array.eval() }
  }

  /// `LatentCacheArray.toHost()`, awaited.
  public func toHost() async throws -> [Float] {
    try await Blocking.run { [array] in try array.toHost() }
  }
}

extension LatentCacheArray {
  /// This array's calls that evaluate, as `async` forms.
  public var inBackground: ArrayInBackground { ArrayInBackground(array: self) }

  /// `eval(_:)` of several arrays (one MLX evaluation), awaited.
  public static func evalInBackground(_ arrays: [LatentCacheArray?]) async throws {
    try await Blocking.run { try eval(arrays) }
  }
}
