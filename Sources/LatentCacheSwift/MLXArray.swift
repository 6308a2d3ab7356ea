// MLXArray.swift: an owned mlx_array (from the library or made from host data), freed in
// deinit with latent_cache_array_free. The library's arrays live on a stream any thread may
// evaluate and free, so the class is Sendable.

/// An MLX array owned by this object. `handle` is the mlx_array for direct C calls (borrowed:
/// do not free it).
public final class MLXArray: @unchecked Sendable {
  // @unchecked: `handle` never changes after init, and the C contract lets any thread evaluate,
  // read and free the library's arrays (also while another thread appends to their cache).
  public let handle: mlx_array

  /// Takes ownership of `array`; nil when it is the empty handle (`ctx == NULL`), which the
  /// library returns for families a layer does not have.
  public init?(adopting array: mlx_array) {
    guard array.ctx != nil else { return nil }
    handle = array
  }

  /// A float32 array `[batch, tokens, width]` holding a copy of `data`.
  public init(_ data: [Float], batch: Int, tokens: Int, width: Int) throws {
    var out = mlx_array(ctx: nil)
    try data.withUnsafeBufferPointer { data in
      try check(latent_cache_array_from_host(data.baseAddress, data.count, batch, tokens, width, &out))
    }
    handle = out
  }

  /// A float32 array of any rank (at most 8 extents) holding a copy of `data`.
  public init(_ data: [Float], shape: [Int]) throws {
    var out = mlx_array(ctx: nil)
    try data.withUnsafeBufferPointer { data in
      try shape.withUnsafeBufferPointer { shape in
        try check(latent_cache_array_from_host_shape(data.baseAddress, data.count, shape.baseAddress, shape.count, &out))
      }
    }
    handle = out
  }

  deinit { latent_cache_array_free(handle) }

  /// Evaluates the array (under the library's evaluation lock) and copies it out as float32,
  /// row-major.
  public func toHost() throws -> [Float] { try MLXArray.toHost(handle) }

  /// Evaluates the array under the library's evaluation lock.
  public func eval() throws { try MLXArray.eval([self]) }

  /// Evaluates `arrays` in one MLX evaluation under the library's evaluation lock; nil entries
  /// (absent families) are skipped.
  public static func eval(_ arrays: [MLXArray?]) throws {
    try eval(handles: arrays.map { $0?.handle ?? mlx_array(ctx: nil) })
  }

  /// `eval` for an engine's own arrays (borrowed).
  public static func eval(handles: [mlx_array]) throws {
    try handles.withUnsafeBufferPointer { try check(latent_cache_eval($0.baseAddress, $0.count)) }
  }

  /// `toHost` for any array (borrowed): an engine's own, or a view inside a `PackedState`.
  public static func toHost(_ array: mlx_array) throws -> [Float] {
    // The element count is unknown here, so the buffer grows until it holds the array (each
    // retry finds it already evaluated).
    try readSized(filler: Float(0), estimate: { 1024 }) { latent_cache_array_to_host(array, $0, $1, $2) }
  }
}
