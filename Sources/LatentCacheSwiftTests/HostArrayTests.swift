// HostArrayTests.swift: typed host arrays (float32, bfloat16, float16, int32) against bit
// patterns computed here, shape and dtype queries against what each array was made as, and MLX's
// memory accounting, limit and buffer cache.
import LatentCache
import LatentCacheSwift
import XCTest

final class HostArrayTests: XCTestCase {
  /// bfloat16 is float32's upper half: exact for values with 8 significant bits.
  private func bfloat16Bits(_ x: Float) -> UInt16 { UInt16(x.bitPattern >> 16) }

  func testShapesAndDtypes() throws {
    let array = try LatentCacheArray((0..<24).map(Float.init), shape: [2, 3, 4])
    XCTAssertEqual(try array.shape, [2, 3, 4])
    XCTAssertEqual(try array.ndim, 3)
    XCTAssertEqual(try array.count, 24)
    XCTAssertEqual(try array.dtype, .float32)
    let eight = try LatentCacheArray([Float](repeating: 1, count: 256), shape: [2, 2, 2, 2, 2, 2, 2, 2])
    XCTAssertEqual(try eight.shape, [Int](repeating: 2, count: 8))
    XCTAssertEqual(try LatentCacheArray([1, 2, 3] as [Int32], shape: [3]).dtype, .int32)
    XCTAssertEqual(try LatentCacheArray(bfloat16Bits: [0], shape: [1]).dtype, .bfloat16)
    XCTAssertEqual(try LatentCacheArray(float16Bits: [0], shape: [1, 1]).dtype, .float16)
    assertThrows(.shape, "nine extents") {
      _ = try LatentCacheArray([Float](repeating: 1, count: 512), shape: [Int](repeating: 2, count: 9))
    }
    assertThrows(.shape, "int32 product") { _ = try LatentCacheArray([1, 2] as [Int32], shape: [3]) }
  }

  func testTypedRoundTrips() throws {
    let values: [Float] = [1.5, -2, 0.25, 96, -0.0078125, 3]
    // bfloat16 in, float32 and bfloat16 out.
    let bf = try LatentCacheArray(bfloat16Bits: values.map(bfloat16Bits), shape: [2, 3])
    XCTAssertEqual(try bf.toHost(), values)
    XCTAssertEqual(try bf.toHostBFloat16Bits(), values.map(bfloat16Bits))
    // float16 bit patterns for the same values, by IEEE half's layout.
    let half: [UInt16] = [0x3E00, 0xC000, 0x3400, 0x5600, 0xA000, 0x4200]
    let f16 = try LatentCacheArray(float16Bits: half, shape: [6])
    XCTAssertEqual(try f16.toHost(), values)
    XCTAssertEqual(try LatentCacheArray(values, shape: [6]).toHostFloat16Bits(), half)
    // int32 in and out; float32 to int32 as MLX's astype (whole values here).
    let ints: [Int32] = [0, -7, 1 << 30, 42]
    XCTAssertEqual(try LatentCacheArray(ints, shape: [2, 2]).toHostInt32(), ints)
    XCTAssertEqual(try LatentCacheArray([3, -4, 100] as [Float], shape: [3]).toHostInt32(), [3, -4, 100])
    XCTAssertEqual(try LatentCacheArray(ints, shape: [4]).toHost(), ints.map(Float.init))
  }

  func testLibraryArraysReportTheirTypes() throws {
    var config = smallConfig()
    config.latentStorage = .bf16
    let cache = try Cache(config: config)
    try cache.append(batch: 1, tokens: 3, CacheModel(config).data(batch: 1, tokens: 3, seed: 0))
    let state = try cache.state()
    XCTAssertEqual(try state.latent.dtype, .bfloat16, "float storage modes return views in the stored dtype")
    XCTAssertEqual(try state.latent.shape, [1, 3, 16])
    XCTAssertEqual(try state.rope.dtype, .float32)
    XCTAssertEqual(try state.indexKeys?.shape, [1, 3, 8])
  }

  func testMemoryLimitAndCache() throws {
    let before = try LatentCacheMemory.info()
    XCTAssertGreaterThan(before.limit, 0)
    let cache = try Cache(config: smallConfig())
    try cache.reserve(64)
    try cache.append(batch: 2, tokens: 2, CacheModel(smallConfig()).data(batch: 2, tokens: 2, seed: 0))
    let held = try LatentCacheMemory.info()
    XCTAssertGreaterThan(held.active, 0)
    XCTAssertGreaterThanOrEqual(held.peak, held.active)
    // A limit below what is held: the next growth is refused with CAPACITY and changes nothing.
    let previous = try LatentCacheMemory.setLimit(held.active)
    defer { _ = try? LatentCacheMemory.setLimit(previous) }
    XCTAssertEqual(previous, before.limit)
    XCTAssertEqual(try LatentCacheMemory.info().limit, held.active)
    try assertUnchanged(cache, "beyond the memory limit") {
      assertThrows(.capacity, "reserve past the limit") { try cache.reserve(1 << 20) }
    }
    try LatentCacheMemory.setLimit(previous)
    try cache.reserve(1 << 12)
    try LatentCacheMemory.clearCache()
    XCTAssertEqual(try LatentCacheMemory.info().cache, 0, "the buffer cache is returned to the system")
  }
}
