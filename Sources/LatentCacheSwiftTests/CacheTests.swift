// CacheTests.swift: XCTest cases for the Swift layer, run with `swift test` against an installed
// library (docs/packaging.md): round trips, errors as exceptions that change nothing, versions.
import LatentCache
import LatentCacheSwift
import XCTest

final class CacheTests: XCTestCase {
  func testVersionMatchesHeader() {
    XCTAssertEqual(Cache.version, LATENT_CACHE_VERSION)
  }

  func testAppendThenReadBackExactly() throws {
    var config = latent_cache_config_default()
    config.index_head_dim = 0  // a layer without index keys
    let cache = try Cache(config: config)
    let latent = (0..<(2 * 3 * 512)).map { Float($0) * 0.25 }
    let rope = (0..<(2 * 3 * 64)).map { -Float($0) }
    try cache.append(batch: 2, tokens: 3, latent: latent, rope: rope)
    XCTAssertEqual(try cache.offset(), 3)
    XCTAssertEqual(try cache.rowOffsets(), [3, 3])
    XCTAssertEqual(try cache.readRow(.latent, row: 1), Array(latent[(3 * 512)...]))
    XCTAssertEqual(try cache.readRow(.rope, row: 0), Array(rope[..<(3 * 64)]))
  }

  func testRejectedCallThrowsAndChangesNothing() throws {
    let cache = try Cache()
    try cache.append(
      batch: 1, tokens: 1, latent: [Float](repeating: 1, count: 512), rope: [Float](repeating: 2, count: 64),
      indexKeys: [Float](repeating: 3, count: 128))
    // The wrong length for one position: SHAPE, and the cache still holds one position.
    XCTAssertThrowsError(
      try cache.append(
        batch: 1, tokens: 1, latent: [Float](repeating: 1, count: 511), rope: [Float](repeating: 2, count: 64),
        indexKeys: [Float](repeating: 3, count: 128))
    ) { error in
      let error = error as! LatentCacheError
      XCTAssertEqual(error.status, LATENT_CACHE_STATUS_SHAPE)
      XCTAssertEqual(error.statusName, "SHAPE")
      XCTAssertFalse(error.message.isEmpty)
    }
    XCTAssertEqual(try cache.offset(), 1)
  }

  func testSpeculativeRoundKeepsAcceptedDrafts() throws {
    let cache = try Cache()
    let one = { (value: Float, tokens: Int) throws in
      try cache.append(
        batch: 1, tokens: tokens, latent: [Float](repeating: value, count: tokens * 512),
        rope: [Float](repeating: value, count: tokens * 64), indexKeys: [Float](repeating: value, count: tokens * 128))
    }
    try one(1, 2)
    try cache.specRoundBegin()
    try one(9, 4)
    try cache.specRoundRollback(keep: [1])
    XCTAssertEqual(try cache.offset(), 3)
    XCTAssertEqual(try cache.readRow(.rope, row: 0), [Float](repeating: 1, count: 128) + [Float](repeating: 9, count: 64))
  }
}
