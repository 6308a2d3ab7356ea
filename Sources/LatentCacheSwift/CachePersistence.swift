// CachePersistence.swift: one cache saved to and loaded from a file or bytes (safetensors,
// the library's own format; caches at rest only: no open round or prefill).
import LatentCache

extension Cache {
  /// Loads a one-layer state saved by `save(to:)`.
  public convenience init(contentsOfFile path: String) throws {
    var raw: OpaquePointer?
    try check(latent_cache_load(path, &raw))
    self.init(adopting: raw!)
  }

  /// Loads a one-layer state from the bytes `serialized()` returned.
  public convenience init(serialized bytes: [UInt8]) throws {
    var raw: OpaquePointer?
    try bytes.withUnsafeBufferPointer { try check(latent_cache_load_from_buffer($0.baseAddress, $0.count, &raw)) }
    self.init(adopting: raw!)
  }

  /// Saves the cache to `path` (a temporary file renamed over it: never a partial file).
  public func save(to path: String) throws { try check(latent_cache_save(handle, path)) }

  /// The bytes a file would hold.
  public func serialized() throws -> [UInt8] {
    var data: UnsafeMutablePointer<UInt8>?
    var count = 0
    try check(latent_cache_save_to_buffer(handle, &data, &count))
    return takeBytes(data, count)
  }
}
