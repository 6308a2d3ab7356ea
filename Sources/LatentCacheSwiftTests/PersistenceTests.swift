// PersistenceTests.swift: save/load round trips (file and bytes, one cache and a set, the
// library's format and the seed's mlx-bun format with its tokens and header), compared with the
// plain model of what was appended.
import Foundation
import LatentCache
import LatentCacheSwift
import XCTest
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

final class PersistenceTests: XCTestCase {
  /// A cache after a seeded run of appends, a trim and a rolled-back round, with its model.
  private func built(_ config: CacheConfig, seed: UInt64) throws -> (Cache, CacheModel) {
    var rng = SeededRandom(seed: seed)
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    for step in 0..<6 {
      let tokens = Int.random(in: 1...5, using: &rng)
      let data = model.data(batch: 3, tokens: tokens, seed: step)
      try cache.append(batch: 3, tokens: tokens, data)
      model.append(batch: 3, tokens: tokens, data)
    }
    try cache.trim(1)
    model.trim(1)
    try cache.beginSpeculativeRound()
    model.roundStart = model.counts
    let data = model.data(batch: 3, tokens: 3, seed: 99)
    try cache.append(batch: 3, tokens: 3, data)
    model.append(batch: 3, tokens: 3, data)
    try cache.rollBackSpeculativeRound(keepingPerRow: [3, 0, 1])
    model.rollBack(keep: [3, 0, 1])
    try assertMatches(cache, model, "built")
    return (cache, model)
  }

  func testCacheFileAndBytesRoundTrips() throws {
    for (i, config) in [smallConfig(), smallConfig(index: false, layout: .ragged)].enumerated() {
      let (cache, model) = try built(config, seed: UInt64(10 + i))
      let path = temporaryPath("cache")
      defer { unlink(path) }
      try cache.save(to: path)
      let loaded = try Cache(contentsOfFile: path)
      try assertMatches(loaded, model, "file \(i)")
      XCTAssertEqual(try loaded.config, config)
      let bytes = try cache.serialized()
      try assertMatches(try Cache(serialized: bytes), model, "bytes \(i)")
      // A loaded cache keeps working: append to both, still equal to the model.
      var next = model
      let data = next.data(batch: 3, tokens: 2, seed: 500)
      try loaded.append(batch: 3, tokens: 2, data)
      next.append(batch: 3, tokens: 2, data)
      try assertMatches(loaded, next, "appended after load \(i)")
    }
  }

  func testSetRoundTripsAndLayers() throws {
    let configs = [smallConfig(), smallConfig(index: false), smallConfig(layout: .ragged)]
    let set = try CacheSet(layers: configs)
    XCTAssertEqual(try set.layerCount, 3)
    var models = configs.map(CacheModel.init)
    for step in 0..<3 {
      for (l, layer) in try set.layers().enumerated() {
        let data = models[l].data(batch: 2, tokens: step + 1, seed: 10 * l + step)
        try layer.append(batch: 2, tokens: step + 1, data)
        models[l].append(batch: 2, tokens: step + 1, data)
      }
    }
    XCTAssertGreaterThan(try set.bytesInUse, 0)
    let path = temporaryPath("set")
    defer { unlink(path) }
    try set.save(to: path)
    for (what, loaded) in [
      ("file", try CacheSet(contentsOfFile: path)), ("bytes", try CacheSet(serialized: try set.serialized())),
    ] {
      XCTAssertEqual(try loaded.layerCount, 3)
      for (l, layer) in try loaded.layers().enumerated() {
        try assertMatches(layer, models[l], "\(what) layer \(l)")
        XCTAssertEqual(try layer.config, configs[l])
      }
    }
  }

  func testMlxbunRoundTripWithTokensAndHeader() throws {
    // The seed's format: float32 layers, rows of one length without padding.
    let configs = [smallConfig(), smallConfig(index: false)]
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    for (l, layer) in try set.layers().enumerated() {
      let data = models[l].data(batch: 1, tokens: 6, seed: l)
      try layer.append(batch: 1, tokens: 6, data)
      models[l].append(batch: 1, tokens: 6, data)
    }
    let info = MlxbunInfo(
      tokens: [11, 22, 33, 44, 55, 66], modelID: "glm-5.2-test", configFingerprint: "fp", tokenizerHash: "th",
      namespace: "")
    let path = temporaryPath("mlxbun")
    defer { unlink(path) }
    try set.saveMlxbun(to: path, info: info)
    XCTAssertEqual(try CacheSet.mlxbunTokens(path: path), info.tokens)
    let header = try CacheSet.mlxbunHeader(path: path)
    XCTAssertTrue(header.contains("glm-5.2-test") && header.contains("\"fp\""), header)
    let loaded = try CacheSet(mlxbunFile: path)
    for (l, layer) in try loaded.layers().enumerated() { try assertMatches(layer, models[l], "mlxbun layer \(l)") }
    // The seed's block layout: a manifest, its blocks in a folder beside it; loaded alike.
    let folder = temporaryPath("mlxbun-blocks")
    try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: folder) }
    try set.saveMlxbunBlocks(to: folder + "/m.mlxkv", info: info, blockBytes: 64)
    XCTAssertEqual(try CacheSet.mlxbunTokens(path: folder + "/m.mlxkv"), info.tokens)
    let blocks = try FileManager.default.contentsOfDirectory(atPath: folder + "/blocks")
    XCTAssertGreaterThan(blocks.count, 2, "tensors cut into 64-byte blocks")
    let fromBlocks = try CacheSet(mlxbunFile: folder + "/m.mlxkv")
    for (l, layer) in try fromBlocks.layers().enumerated() {
      try assertMatches(layer, models[l], "mlxbun blocks layer \(l)")
    }
    // Without info: no tokens.
    let bare = temporaryPath("mlxbun-bare")
    defer { unlink(bare) }
    try set.saveMlxbun(to: bare)
    XCTAssertEqual(try CacheSet.mlxbunTokens(path: bare), [])
    // Many tokens: the Swift layer's first guess at the size is too small, and it retries.
    let long = MlxbunInfo(tokens: (0..<10_000).map { UInt32($0 * 7) })
    try set.saveMlxbun(to: bare, info: long)
    XCTAssertEqual(try CacheSet.mlxbunTokens(path: bare), long.tokens)
  }

  func testMlxbunRefusals() throws {
    let set = try CacheSet(layers: [smallConfig()])
    let path = temporaryPath("mlxbun-refused")
    assertThrows(.invalidArgument, "an empty layer") { try set.saveMlxbun(to: path) }
    XCTAssertEqual(access(path, F_OK), -1, "a refused save left a file")
    assertThrows(.invalidArgument, "not such a file") { _ = try CacheSet.mlxbunTokens(path: "/nonexistent") }
    assertThrows(.invalidArgument, "not such a file") { _ = try CacheSet(mlxbunFile: "/nonexistent") }
  }
}
