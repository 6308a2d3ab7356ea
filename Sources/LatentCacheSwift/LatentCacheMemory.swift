// LatentCacheMemory.swift: MLX's allocator as the library reports and sets it: what arrays hold, the
// process's memory limit every reserve and growing append is checked against, and returning
// freed buffers to the system. Process-wide, like MLX's allocator.
import LatentCache

/// What MLX's allocator holds, in bytes (every cache, set, donor and array of the process).
public struct MemoryInfo: Sendable, Equatable {
  /// Held by live arrays.
  public let active: Int
  /// Freed by arrays and kept by MLX for reuse.
  public let cache: Int
  /// The most `active` has been since the process started.
  public let peak: Int
  /// MLX's memory limit.
  public let limit: Int
}

public enum LatentCacheMemory {
  /// What MLX's allocator holds now.
  public static func info() throws -> MemoryInfo {
    var out = latent_cache_memory(active: 0, cache: 0, peak: 0, limit: 0)
    try check(latent_cache_memory_info(&out))
    return MemoryInfo(active: out.active, cache: out.cache, peak: out.peak, limit: out.limit)
  }

  /// Sets MLX's memory limit for the whole process; returns the limit before the call.
  @discardableResult
  public static func setLimit(_ bytes: Int) throws -> Int {
    var previous = 0
    try check(latent_cache_set_memory_limit(bytes, &previous))
    return previous
  }

  /// Returns the memory MLX keeps from freed arrays to the system (live arrays untouched).
  public static func clearCache() throws { try check(latent_cache_clear_memory_cache()) }
}
