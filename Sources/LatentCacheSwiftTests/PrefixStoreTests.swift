// PrefixStoreTests.swift: the prefix store as a Swift engine uses it: a conversation put, found,
// restored into an empty set and attached below two rows (compared with the model), restored
// again by a second store over the same folder (a restart), and a refusal changing nothing;
// puts and lookups from concurrent tasks.
import Foundation
import LatentCache
import LatentCacheSwift
import XCTest

final class PrefixStoreTests: XCTestCase {
  private let configs = [smallConfig(), smallConfig(index: false)]

  func testPutRestoreAttachAndRestart() throws {
    let folder = NSTemporaryDirectory() + "latent-cache-swift-store-\(getpid())"
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let tokens: [UInt32] = (0..<20).map { UInt32($0 * 3 + 1) }
    let source = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    try appendAll(source, &models, batch: 1, tokens: 20, seed: 4)
    let store = try PrefixStore(folder: folder, blockTokens: 8, ramBytes: 1 << 24, ssdBytes: 1 << 24)
    XCTAssertEqual(try store.put(source, namespace: Array("glm".utf8), tokens: tokens), 2)
    XCTAssertEqual(try store.lookup(source, namespace: Array("glm".utf8), tokens: tokens), 16)
    XCTAssertEqual(try store.lookup(source, namespace: Array("other".utf8), tokens: tokens), 0)

    // The model of the first two blocks (16 positions) of the row.
    let cut = models.map { m -> CacheModel in
      var out = m
      out.rows = m.rows.map { row in row.enumerated().map { f, v in Array(v.prefix(16 * m.widths[f])) } }
      return out
    }
    let restored = try CacheSet(layers: configs)
    XCTAssertEqual(try store.restore(into: restored, namespace: Array("glm".utf8), tokens: tokens), 16)
    try assertLayers(restored, cut, "restored")
    assertThrows(.invalidState, "restore into a set holding rows") {
      _ = try store.restore(into: restored, namespace: Array("glm".utf8), tokens: tokens)
    }
    try assertLayers(restored, cut, "after a refused restore")
    let lent = try CacheSet(layers: configs)
    XCTAssertEqual(try store.attach(lent, rows: 2, namespace: Array("glm".utf8), tokens: tokens), 16)
    try assertLayers(lent, cut.map { CacheModel.merge([$0, $0]) }, "attached")
    try store.sync()
    XCTAssertEqual(try store.stats().blocksWritten, 2)

    let again = try PrefixStore(folder: folder, blockTokens: 8, ramBytes: 1 << 24, ssdBytes: 1 << 24)
    let fresh = try CacheSet(layers: configs)
    XCTAssertEqual(try again.restore(into: fresh, namespace: Array("glm".utf8), tokens: tokens), 16)
    try assertLayers(fresh, cut, "restored after a restart")
  }

  func testConcurrentTasksPutAndLookUp() async throws {
    let store = try PrefixStore(blockTokens: 4, ramBytes: 1 << 24)
    let configs = self.configs
    try await withThrowingTaskGroup(of: Int.self) { group in
      for task in 0..<4 {
        group.addTask {
          let set = try CacheSet(layers: configs)
          var models = configs.map(CacheModel.init)
          try appendAll(set, &models, batch: 1, tokens: 12, seed: task)
          let tokens: [UInt32] = (0..<12).map { UInt32(task * 100 + $0) }
          try store.put(set, tokens: tokens)
          return try store.lookup(set, tokens: tokens)
        }
      }
      for try await found in group { XCTAssertEqual(found, 12) }
    }
  }
}
