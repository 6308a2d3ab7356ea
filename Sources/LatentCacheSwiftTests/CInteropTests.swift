// CInteropTests.swift: the Swift layer and direct C calls mix: the linked library is the one the
// header describes, wrappers expose handles the C API takes, and handles made through C are
// adopted by the wrappers (and freed once).
import LatentCache
import LatentCacheSwift
import XCTest

final class CInteropTests: XCTestCase {
  func testLinkedLibraryMatchesHeader() {
    XCTAssertEqual(LatentCacheLibrary.version, LATENT_CACHE_VERSION)
  }

  func testHandlesMixWithDirectCalls() throws {
    let config = smallConfig()
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    let data = model.data(batch: 2, tokens: 3, seed: 1)
    try cache.append(batch: 2, tokens: 3, data)
    model.append(batch: 2, tokens: 3, data)
    // A C call on the wrapper's handle sees what the Swift calls did.
    var offset = 0
    try cache.withHandle { try LatentCacheError.check(latent_cache_offset($0, &offset)) }
    XCTAssertEqual(offset, 3)
    // A cache made through C, adopted by the wrapper.
    var raw: OpaquePointer?
    var c = config.cValue
    try LatentCacheError.check(latent_cache_new(&c, &raw))
    let adopted = Cache(adopting: try XCTUnwrap(raw))
    try adopted.mergeRows(from: [cache])
    try assertMatches(adopted, model, "merged into a cache made through C")
    // An array made through C, adopted; the wrapper frees it.
    var array = mlx_array(ctx: nil)
    let values: [Float] = [1, 2, 3, 4]
    try LatentCacheError.check(latent_cache_array_from_host(values, 4, 1, 2, 2, &array))
    XCTAssertEqual(try XCTUnwrap(LatentCacheArray(adopting: array)).toHost(), values)
  }

  func testResetAndReserveKeepTheGeometry() throws {
    let config = smallConfig(layout: .ragged)
    let cache = try Cache(config: config)
    try cache.reserve(128)
    try cache.append(batch: 3, tokens: 2, CacheModel(config).data(batch: 3, tokens: 2, seed: 0))
    try cache.reset()
    XCTAssertEqual(try cache.batchSize, 0)
    XCTAssertEqual(try cache.offset, 0)
    XCTAssertEqual(try cache.byteLength, 0)
    XCTAssertEqual(try cache.config, config)
    // A reset cache takes a new batch size.
    var model = CacheModel(config)
    let data = model.data(batch: 1, tokens: 4, seed: 9)
    try cache.append(batch: 1, tokens: 4, data)
    model.append(batch: 1, tokens: 4, data)
    try assertMatches(cache, model, "after reset")
    XCTAssertEqual(try cache.byteLength, 4 * (try cache.bytesPerToken))
  }
}

final class ArrayOwnershipTests: XCTestCase {
  func testBorrowedAndRelinquishedArrays() throws {
    let values: [Float] = [5, 6, 7]
    let owner = try LatentCacheArray(values, shape: [3])
    // A borrowed wrapper reads the owner's array and frees nothing when it goes.
    do {
      let borrowed = try XCTUnwrap(LatentCacheArray(borrowing: owner.handle))
      XCTAssertEqual(try borrowed.toHost(), values)
    }
    XCTAssertEqual(try owner.toHost(), values, "the owner's array outlives a borrowed wrapper")
    // Relinquished: the new owner (here a wrapper adopting it) frees it, once.
    let handed = try LatentCacheArray(values, shape: [1, 3]).relinquish()
    let adopted = try XCTUnwrap(LatentCacheArray(adopting: handed))
    XCTAssertEqual(try adopted.shape, [1, 3])
    XCTAssertNil(LatentCacheArray(borrowing: mlx_array(ctx: nil)))
  }
}
