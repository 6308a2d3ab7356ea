// ComposedTests.swift: composed storage (a Q8 latent with its newest positions kept in
// bfloat16): each row's precision boundary against the header's rule,
// floor((length - hot_window) / 64) * 64, the minimum reusable offset derived from it, trims
// below it refused without bypass, and a save/load that keeps every read identical.
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif
import LatentCache
import LatentCacheSwift
import XCTest

final class ComposedTests: XCTestCase {
  private let hotWindow = 64

  private func composed() throws -> (Cache, [Int]) {
    var config = CacheConfig()
    config.kvLoraRank = 64
    config.ropeHeadDim = 64
    config.indexHeadDim = 0
    config.latentStorage = .q8
    config.ropeStorage = .bf16
    config.hotStorage = .bf16
    config.hotWindow = hotWindow
    let cache = try Cache(config: config)
    // Rows of 200 and 130 positions (the second left-padded by 70).
    let lengths = [200, 130]
    var rng = SeededRandom(seed: 7)
    let values = (0..<(2 * 200 * 64)).map { _ in Float.random(in: -1...1, using: &rng) }
    try cache.appendPadded(batch: 2, tokens: 200, leftPadding: [0, 70], latent: values, rope: values)
    return (cache, lengths)
  }

  /// The header's rule for a row's compact positions.
  private func boundary(_ length: Int) -> Int { length < hotWindow ? 0 : (length - hotWindow) / 64 * 64 }

  func testBoundariesAndMinimumReusableOffset() throws {
    let (cache, lengths) = try composed()
    XCTAssertEqual(try cache.rowOffsets, lengths)
    XCTAssertEqual(try cache.convertedPositions, lengths.map(boundary))
    // A trim may drop n positions while every row keeps a length whose fresh prefill holds at
    // least its compact positions: length - n >= boundary + hot_window.
    let converted = lengths.map(boundary)
    let maxDrop = zip(lengths, converted).filter { $0.1 > 0 }.map { $0.0 - ($0.1 + hotWindow) }.min()!
    let offset = try cache.offset
    XCTAssertEqual(try cache.minimumReusableOffset, offset - maxDrop)
    try assertUnchanged(cache, "below the minimum reusable offset") {
      assertThrows(.invalidState, "trim \(maxDrop + 1) without bypass") { try cache.trim(maxDrop + 1) }
    }
    try cache.trim(maxDrop)
    XCTAssertEqual(try cache.rowOffsets, lengths.map { $0 - maxDrop })
    // With bypass a row's boundary stops at its new end.
    try cache.trim(100, bypass: true)
    XCTAssertEqual(try cache.rowOffsets, lengths.map { $0 - maxDrop - 100 })
    for (c, l) in zip(try cache.convertedPositions, try cache.rowOffsets) { XCTAssertLessThanOrEqual(c, l) }
  }

  func testSaveAndLoadKeepEveryRead() throws {
    let (cache, _) = try composed()
    let path = temporaryPath("composed")
    defer { unlink(path) }
    try cache.save(to: path)
    XCTAssertEqual(try Snapshot(Cache(contentsOfFile: path)), try Snapshot(cache))
    XCTAssertEqual(try Snapshot(Cache(serialized: cache.serialized())), try Snapshot(cache))
  }
}
