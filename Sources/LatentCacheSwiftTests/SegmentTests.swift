// SegmentTests.swift: a conversation snapshotted turn by turn as segments (bytes), each the size
// of its turn's positions plus a bounded header; any turn restored from its chain equals the
// model; a set extends from the chain's continuation; a broken chain is refused and changes
// nothing. Chains that branch: a forked prompt's continuations each save only their own
// positions, linked to the prompt's segment, and restore from it plus their own.
import LatentCache
import LatentCacheSwift
import XCTest

final class SegmentTests: XCTestCase {
  private let configs = [smallConfig(), smallConfig(index: false)]

  func testTurnsSnapshotAtTheirOwnCostAndRestoreFromTheChain() throws {
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    let turns = [7, 3, 12, 1, 5]
    let bytesPerPosition = try set.layers().reduce(0) { $0 + (try $1.bytesPerToken) }
    var segments: [[UInt8]] = []
    var modelsAfter: [[CacheModel]] = []
    var position = 0
    for (t, tokens) in turns.enumerated() {
      for (l, layer) in try set.layers().enumerated() {
        let data = models[l].data(batch: 1, tokens: tokens, seed: 100 * t + l)
        try layer.append(batch: 1, tokens: tokens, data)
        models[l].append(batch: 1, tokens: tokens, data)
      }
      let key = Array("turn \(t)".utf8)
      let (bytes, digest) = try set.segment(from: position, to: position + tokens, key: key)
      // The turn's positions plus a header that does not grow with the context.
      XCTAssertGreaterThanOrEqual(bytes.count, tokens * bytesPerPosition, "turn \(t)")
      XCTAssertLessThanOrEqual(bytes.count, tokens * bytesPerPosition + 16_384, "turn \(t)")
      let info = try CacheSet.segmentInfo(bytes: bytes)
      XCTAssertEqual([info.from, info.to, info.layerCount], [position, position + tokens, configs.count])
      XCTAssertEqual(info.key, key)
      XCTAssertEqual(info.digest, digest)
      XCTAssertEqual(info.previousDigest, t == 0 ? 0 : try CacheSet.segmentInfo(bytes: segments[t - 1]).digest)
      XCTAssertEqual(try set.segmentChain(), SegmentChain(row: 0, positions: position + tokens, digest: digest))
      segments.append(bytes)
      modelsAfter.append(models)
      position += tokens
    }
    for k in turns.indices {
      let restored = try CacheSet(segments: Array(segments[...k]))
      try assertLayers(restored, modelsAfter[k], "turn \(k) restored")
    }
    // Extending a set that holds the first two turns with the rest of the chain.
    let partial = try CacheSet(segments: Array(segments[..<2]))
    XCTAssertEqual(try partial.extend(segments: Array(segments[2...])), turns.count - 2, "segments appended")
    try assertLayers(partial, models, "extended")
    // A gap (turn 1 left out) is refused and creates nothing; a refused extension changes nothing.
    assertThrows(.invalidArgument, "a gap") { _ = try CacheSet(segments: [segments[0], segments[2]]) }
    let first = try CacheSet(segments: [segments[0]])
    let before = try first.layers().map(Snapshot.init)
    assertThrows(.invalidArgument, "a broken link") { try first.extend(segments: [segments[2]]) }
    XCTAssertEqual(try first.layers().map(Snapshot.init), before)
  }

  func testForkedContinuationsSaveTheirOwnPositionsAfterThePrompt() throws {
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    try appendAll(set, &models, batch: 1, tokens: 9, seed: 7)
    let (prompt, digest) = try set.segment(from: 0, to: 9)
    try set.forkRow(0, into: 3)
    for r in 0..<3 {
      XCTAssertEqual(try set.segmentChain(row: r), SegmentChain(row: r, positions: 9, digest: digest), "row \(r)")
    }
    for l in models.indices { models[l].rows = Array(repeating: models[l].rows[0], count: 3) }
    try appendAll(set, &models, batch: 3, tokens: 4, seed: 70)
    let bytesPerPosition = try set.layers().reduce(0) { $0 + (try $1.bytesPerToken) }
    for r in [2, 0, 1] {
      let (tail, _) = try set.segment(row: r, from: 9, to: 13)
      XCTAssertLessThanOrEqual(tail.count, 4 * bytesPerPosition + 16_384, "row \(r)'s tail holds its own positions")
      let restored = try CacheSet(segments: [prompt, tail])
      try assertLayers(restored, models.map { $0.extract(r) }, "continuation \(r) restored")
    }
    assertThrows(.outOfRange, "a row the set does not hold") { _ = try set.segmentChain(row: 3) }
  }
}
