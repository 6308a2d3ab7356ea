// LatentCacheArray.swift: an owned mlx_array (from the library or made from host data), freed in
// deinit with latent_cache_array_free. The library's arrays live on a stream any thread may
// evaluate and free, so the class is Sendable. An engine's own arrays (mlx-swift's, with the
// library built with MLX=host) are borrowed in, and the library's handed out, by their handles.
import LatentCache

/// An MLX array owned by this object (unless made with `init(borrowing:)`). `handle` is the
/// mlx_array for direct C calls (borrowed: do not free it; valid while this object lives, which
/// `withHandle` ensures).
public final class LatentCacheArray: @unchecked Sendable {
  // @unchecked: `handle` never changes after init, and the C contract lets any thread evaluate,
  // read and free the library's arrays (also while another thread appends to their cache).
  // `owns` changes only in `relinquish()`, whose caller transfers the object's ownership.
  public let handle: mlx_array
  private var owns = true

  /// Takes ownership of `array`; nil when it is the empty handle (`ctx == NULL`), which the
  /// library returns for families a layer does not have.
  public init?(adopting array: mlx_array) {
    guard array.ctx != nil else { return nil }
    handle = array
  }

  /// Wraps an array owned elsewhere (an engine's own, for example mlx-swift's `ctx`) without
  /// taking ownership: never freed here, so its owner must outlive this object.
  public init?(borrowing array: mlx_array) {
    guard array.ctx != nil else { return nil }
    handle = array
    owns = false
  }

  /// Hands the array to another owner (mlx-swift's `MLXArray(_ ctx:)` takes a +1 context): this
  /// object no longer frees it. Call it once, when nothing else uses this object.
  public func relinquish() -> mlx_array {
    owns = false
    return handle
  }

  // Bridging by the raw context pointer (`mlx_array`'s one field, an `mlx::core::array *` in
  // every mlx-c version), for an app whose own mlx-c module (mlx-swift's Cmlx) declares its own
  // `mlx_array`: no C module has to be shared.
  //   borrow an mlx-swift array:  LatentCacheArray(borrowingContext: mlxArray.ctx.ctx)
  //     (not owned: keep the MLXArray alive while this object is used)
  //   hand one of ours over:      MLXArray(mlx_array(ctx: ours.relinquishContext()))
  //     (mlx-swift then owns and frees it; `ours` no longer does; `mlx_array` there is Cmlx's:
  //     that file imports Cmlx, not LatentCache)

  /// Wraps an array owned elsewhere by its context pointer, without taking ownership; nil for a
  /// NULL pointer.
  public convenience init?(borrowingContext ctx: UnsafeMutableRawPointer?) {
    self.init(borrowing: mlx_array(ctx: ctx))
  }

  /// Takes ownership of an array by its context pointer (a +1 context, freed in deinit); nil for
  /// a NULL pointer.
  public convenience init?(adoptingContext ctx: UnsafeMutableRawPointer?) {
    self.init(adopting: mlx_array(ctx: ctx))
  }

  /// The array's context pointer, borrowed: valid while this object lives.
  public var context: UnsafeMutableRawPointer { handle.ctx }

  /// `relinquish()` as the context pointer, for another mlx-c module's `mlx_array(ctx:)`.
  public func relinquishContext() -> UnsafeMutableRawPointer { relinquish().ctx }

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
        try check(
          latent_cache_array_from_host_shape(data.baseAddress, data.count, shape.baseAddress, shape.count, &out))
      }
    }
    handle = out
  }

  deinit { if owns { latent_cache_array_free(handle) } }


  /// Calls `body` with `handle`, this object kept alive until `body` returns: the way to make C
  /// calls with the handle. A handle read from an object that nothing uses afterwards may be
  /// freed under the call in an optimized build (ARC may end an object's life at its last use).
  public func withHandle<R>(_ body: (mlx_array) throws -> R) rethrows -> R {
    try withExtendedLifetime(self) { try body(handle) }
  }
  /// An array of `dtype` (`.float32`, `.bfloat16`, `.float16` or `.int32`) holding a copy of
  /// `data`, whose elements are of that type (16-bit floats as their bit patterns).
  init<T>(typed data: [T], dtype: LatentCacheDType, shape: [Int]) throws {
    var out = mlx_array(ctx: nil)
    try data.withUnsafeBytes { data in
      try shape.withUnsafeBufferPointer { shape in
        try check(
          latent_cache_array_from_host_typed(
            data.baseAddress, data.count / MemoryLayout<T>.stride, dtype.cValue, shape.baseAddress, shape.count, &out))
      }
    }
    handle = out
  }

  /// An int32 array (indices, for example).
  public convenience init(_ data: [Int32], shape: [Int]) throws {
    try self.init(typed: data, dtype: .int32, shape: shape)
  }

  /// A bfloat16 array from bit patterns (the upper 16 bits of a float32 that bfloat16 holds).
  public convenience init(bfloat16Bits data: [UInt16], shape: [Int]) throws {
    try self.init(typed: data, dtype: .bfloat16, shape: shape)
  }

  /// A float16 array from IEEE half-precision bit patterns.
  public convenience init(float16Bits data: [UInt16], shape: [Int]) throws {
    try self.init(typed: data, dtype: .float16, shape: shape)
  }

  /// The element type (no evaluation).
  public var dtype: LatentCacheDType {
    get throws {
      var out: UInt32 = 0
      try check(latent_cache_array_dtype(handle, &out))
      // Every value the library returns is a case; a newer library's would be a status.
      guard let type = LatentCacheDType(cValue: out) else {
        throw LatentCacheError(
          status: .invalidArgument, message: "element type \(out) is not known to this Swift layer")
      }
      return type
    }
  }

  /// The rank (no evaluation).
  public var ndim: Int {
    get throws {
      var out = 0
      try check(latent_cache_array_ndim(handle, &out))
      return out
    }
  }

  /// The extents (no evaluation).
  public var shape: [Int] {
    get throws { try readSized(filler: 0, estimate: { try ndim }) { latent_cache_array_shape(handle, $0, $1, $2) } }
  }

  /// The element count (the product of the extents).
  public var count: Int { get throws { try shape.reduce(1, *) } }

  /// Evaluates the array (under the library's evaluation lock) and copies it out as float32,
  /// row-major.
  public func toHost() throws -> [Float] { try LatentCacheArray.toHost(handle) }

  /// Evaluates and copies out converted to int32 (as MLX's astype).
  public func toHostInt32() throws -> [Int32] { try toHost(as: .int32, filler: Int32(0)) }

  /// Evaluates and copies out converted to bfloat16, as bit patterns.
  public func toHostBFloat16Bits() throws -> [UInt16] { try toHost(as: .bfloat16, filler: UInt16(0)) }

  /// Evaluates and copies out converted to float16, as bit patterns.
  public func toHostFloat16Bits() throws -> [UInt16] { try toHost(as: .float16, filler: UInt16(0)) }

  private func toHost<T>(as dtype: LatentCacheDType, filler: T) throws -> [T] {
    try readSized(filler: filler, estimate: { try count }) { out, len, written in
      latent_cache_array_to_host_typed(handle, dtype.cValue, out, len, written)
    }
  }

  /// Evaluates the array under the library's evaluation lock.
  public func eval() throws { try LatentCacheArray.eval([self]) }

  /// Evaluates `arrays` in one MLX evaluation under the library's evaluation lock; nil entries
  /// (absent families) are skipped.
  public static func eval(_ arrays: [LatentCacheArray?]) throws {
    try eval(handles: arrays.map { $0?.handle ?? mlx_array(ctx: nil) })
  }

  /// `eval` for an engine's own arrays (borrowed).
  public static func eval(handles: [mlx_array]) throws {
    try handles.withUnsafeBufferPointer { try check(latent_cache_eval($0.baseAddress, $0.count)) }
  }

  /// Hands `arrays` to MLX and returns once their work is queued (`latent_cache_eval_async`);
  /// `eval` of them later waits. A pipelined decode loop builds step n + 1, hands it over, then
  /// waits for step n; appends into a layer step n still reads wait for those reads, so they
  /// write in place.
  public static func evalAsync(_ arrays: [LatentCacheArray?]) throws {
    let handles = arrays.map { $0?.handle ?? mlx_array(ctx: nil) }
    try handles.withUnsafeBufferPointer { try check(latent_cache_eval_async($0.baseAddress, $0.count)) }
  }

  /// `toHost` for any array (borrowed): an engine's own, for example.
  public static func toHost(_ array: mlx_array) throws -> [Float] {
    // An array's shape never changes, so its element count sizes the buffer exactly.
    try readSized(filler: Float(0), estimate: { try elementCount(array) }) {
      latent_cache_array_to_host(array, $0, $1, $2)
    }
  }

  /// The element count of a borrowed array.
  static func elementCount(_ array: mlx_array) throws -> Int {
    try readSized(filler: 0, estimate: { 8 }) { latent_cache_array_shape(array, $0, $1, $2) }.reduce(1, *)
  }
}
