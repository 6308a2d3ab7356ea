// SharedPrefixTests.swift: shared prefixes as a Swift engine uses them: a stored prompt
// attached below new requests, a prompt forked into continuations, for a cache and a set; every
// row reads as the prefix then its own positions (the model), and writes below the prefix are
// refused with nothing changed.
import LatentCache
import LatentCacheSwift
import XCTest

final class SharedPrefixTests: XCTestCase {
  func testAttachAndForkReadAsWholeRows() throws {
    let config = smallConfig()
    let source = try Cache(config: config)
    var prompt = CacheModel(config)
    let data = prompt.data(batch: 1, tokens: 6, seed: 1)
    try source.append(batch: 1, tokens: 6, data)
    prompt.append(batch: 1, tokens: 6, data)
    let prefix = try source.sharePrefix(row: 0, positions: 6)
    let info = try prefix.info()
    XCTAssertEqual([info.layers, info.positions], [1, 6])
    XCTAssertGreaterThan(info.bytes, 0)

    let request = try Cache(config: config)
    try request.attachPrefix(prefix, rows: 2)
    XCTAssertEqual(try request.sharedPositions, 6)
    var model = CacheModel.merge([prompt, prompt])
    let own = model.data(batch: 2, tokens: 3, seed: 2)
    try request.append(batch: 2, tokens: 3, own)
    model.append(batch: 2, tokens: 3, own)
    try assertMatches(request, model, "attached")
    let before = try Snapshot(request)
    assertThrows(.outOfRange, "trim into the prefix") { try request.trim(4) }
    XCTAssertEqual(try Snapshot(request), before)
    assertThrows(.invalidState, "attach to a cache with rows") { try request.attachPrefix(prefix, rows: 1) }

    // A draft tree: row 1 forks into three branches over the prefix and its own positions.
    try request.forkRow(1, into: 3)
    XCTAssertEqual(try request.sharedPositions, 9)
    var branches = CacheModel.merge([model.extract(1), model.extract(1), model.extract(1)])
    let more = branches.data(batch: 3, tokens: 2, seed: 3)
    try request.append(batch: 3, tokens: 2, more)
    branches.append(batch: 3, tokens: 2, more)
    try assertMatches(request, branches, "forked")
  }

  func testSetWidePrefixes() throws {
    let configs = [smallConfig(), smallConfig(index: false)]
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    try appendAll(set, &models, batch: 1, tokens: 5, seed: 10)
    let prefix = try set.sharePrefix(row: 0, positions: 5)
    XCTAssertEqual(try prefix.info().layers, 2)
    let other = try CacheSet(layers: configs)
    try other.attachPrefix(prefix, rows: 2)
    try assertLayers(other, models.map { CacheModel.merge([$0, $0]) }, "set attached")
    assertThrows(.invalidArgument, "a set's prefix on one cache") { try Cache(config: configs[0]).attachPrefix(prefix, rows: 1) }
    try set.forkRow(0, into: 4)
    try assertLayers(set, models.map { CacheModel.merge([$0, $0, $0, $0]) }, "set forked")
    XCTAssertEqual(try set.layer(1).sharedPositions, 5)
  }

  /// One stored prompt attached below requests in concurrent tasks (the prefix is Sendable and
  /// shared, never copied); each request appends, reads and attends through its own cache while
  /// the others do, and each matches its model; the prompt's cache is freed first.
  func testRequestsOverOnePrefixInConcurrentTasks() async throws {
    let config = smallConfig()
    var prompt = CacheModel(config)
    let prefix: SharedPrefix
    do {
      let source = try Cache(config: config)
      let data = prompt.data(batch: 1, tokens: 12, seed: 40)
      try source.append(batch: 1, tokens: 12, data)
      prompt.append(batch: 1, tokens: 12, data)
      prefix = try source.sharePrefix(row: 0, positions: 12)
    }
    let base = prompt
    try await withThrowingTaskGroup(of: Void.self) { group in
      for task in 0..<6 {
        group.addTask {
          let request = try Cache(config: config)
          try request.attachPrefix(prefix, rows: 1)
          var model = base
          for step in 0..<20 {
            let data = model.data(batch: 1, tokens: 1, seed: 1000 * task + step)
            try request.append(batch: 1, tokens: 1, data)
            model.append(batch: 1, tokens: 1, data)
            await Task.yield()  // let the task resume on another thread
            XCTAssertEqual(try request.readRow(.latent, row: 0), model.rows[0][0], "task \(task) step \(step)")
          }
          XCTAssertEqual(try request.sharedPositions, 12)
          try assertMatches(request, model, "task \(task)")
        }
      }
      try await group.waitForAll()
    }
  }
}
