// ConcurrencyTests.swift: the Swift layer from concurrent tasks. Appenders and readers on
// distinct caches each match their own model; reads concurrent with appends on one cache never
// throw (the sized reads retry when an append outgrows them) and always see a prefix of what was
// appended; concurrent failing calls each get their own message, even across awaits; requests
// prefilled in their own tasks join and leave a running batch that an actor owns.
import LatentCache
import LatentCacheSwift
import XCTest

final class ConcurrencyTests: XCTestCase {
  /// The `inBackground` forms give what the synchronous calls give, from many tasks at once
  /// (more than the cooperative pool has threads), and a rejected call's status and message.
  func testInBackgroundFormsAwaitTheSameResults() async throws {
    let cache = try Cache(config: smallConfig())
    let latent = (0..<(2 * 5 * 16)).map { Float($0) / 7 }
    let rope = (0..<(2 * 5 * 4)).map { -Float($0) / 3 }
    let keys = (0..<(2 * 5 * 8)).map { Float($0) / 5 }
    try await cache.inBackground.append(batch: 2, tokens: 5, latent: latent, rope: rope, indexKeys: keys)
    let want = try cache.readRow(.latent, row: 1)
    let array = try LatentCacheArray(latent, shape: [2, 5, 16])
    try await withThrowingTaskGroup(of: Void.self) { group in
      for _ in 0..<32 {
        group.addTask {
          let row = try await cache.inBackground.readRow(.latent, row: 1)
          let values = try await array.inBackground.toHost()
          XCTAssertEqual(row, want)
          XCTAssertEqual(values, latent)
        }
      }
      try await group.waitForAll()
    }
    try await LatentCacheArray.evalInBackground([array, nil])
    let all = try await cache.inBackground.read(.latent)
    let bytes = try await cache.inBackground.serialized()
    XCTAssertEqual(all.count, 2 * 5 * 16)
    XCTAssertEqual(bytes, try cache.serialized())
    do {
      _ = try await cache.inBackground.readRow(.latent, row: 2)
      XCTFail("reading row 2 of 2 succeeded")
    } catch let error as LatentCacheError {
      XCTAssertEqual(error.status, .outOfRange)
      XCTAssertFalse(error.message.isEmpty, "the message of a call made on another thread")
    }
  }

  func testTasksOnDistinctCaches() async throws {
    try await withThrowingTaskGroup(of: Void.self) { group in
      for task in 0..<6 {
        group.addTask {
          var rng = SeededRandom(seed: UInt64(100 + task))
          let config = smallConfig(index: task % 2 == 0, layout: task % 3 == 0 ? .ragged : .rightJustified)
          let cache = try Cache(config: config)
          var model = CacheModel(config)
          for step in 0..<40 {
            let tokens = Int.random(in: 1...3, using: &rng)
            let data = model.data(batch: 2, tokens: tokens, seed: task * 1000 + step)
            try cache.append(batch: 2, tokens: tokens, data)
            model.append(batch: 2, tokens: tokens, data)
            await Task.yield()  // let the task resume on another thread
            if step % 7 == 6 {
              try cache.trim(1)
              model.trim(1)
            }
            XCTAssertEqual(try cache.readRow(.latent, row: 1), model.rows[1][0], "task \(task) step \(step)")
          }
          try assertMatches(cache, model, "task \(task)")
        }
      }
      try await group.waitForAll()
    }
  }

  func testReadsConcurrentWithAppendsOnOneCache() async throws {
    let config = smallConfig()
    let cache = try Cache(config: config)
    // Position t of row 0 holds `t` in every latent channel, so any read is checkable alone.
    let w = config.kvLoraRank
    let steps = 300
    try await withThrowingTaskGroup(of: Int.self) { group in
      group.addTask {
        for t in 0..<steps {
          try cache.append(
            batch: 1, tokens: 1, latent: [Float](repeating: Float(t), count: w), rope: [Float](repeating: 0, count: 4),
            indexKeys: [Float](repeating: 0, count: 8))
          if t % 16 == 0 { await Task.yield() }
        }
        return steps
      }
      for reader in 0..<3 {
        group.addTask {
          var reads = 0
          var last = 0
          // Cancelled when the appender failed: stop rather than wait for positions never coming.
          while last < steps && !Task.isCancelled {
            // Every read kind sized by the Swift layer; none may throw while appends run.
            let row = try cache.batchSize > 0 ? cache.readRow(.latent, row: 0) : []
            let positions = row.count / w
            XCTAssertEqual(row, (0..<positions).flatMap { [Float](repeating: Float($0), count: w) }, "reader \(reader)")
            XCTAssertGreaterThanOrEqual(positions, last, "reader \(reader): a read went back in time")
            last = positions
            _ = try cache.read(.rope)
            _ = try cache.rowOffsets
            _ = try cache.signature
            reads += 1
            await Task.yield()
          }
          return reads
        }
      }
      for try await _ in group {}
    }
    XCTAssertEqual(try cache.rowOffsets, [steps])
  }

  func testEachFailingCallGetsItsOwnMessage() async throws {
    let cache = try Cache(config: smallConfig())
    try cache.append(batch: 1, tokens: 1, CacheModel(smallConfig()).data(batch: 1, tokens: 1, seed: 0))
    try await withThrowingTaskGroup(of: Void.self) { group in
      for task in 0..<8 {
        group.addTask {
          for round in 0..<50 {
            let n = 10_000 + task * 1000 + round
            let other = try Cache(config: smallConfig())
            await Task.yield()
            do {
              // Alternate failures of two kinds, so a message from another call would show.
              if round % 2 == 0 {
                try cache.trim(n)
              } else {
                _ = try other.readRow(.latent, row: n)
              }
              XCTFail("call \(n) succeeded")
            } catch let error as LatentCacheError {
              XCTAssertEqual(error.status, .outOfRange)
              XCTAssertTrue(error.message.contains("\(n)"), "call \(n) got another call's message: \(error.message)")
            }
            await Task.yield()
          }
        }
      }
      try await group.waitForAll()
    }
  }

  func testRequestsJoinAndLeaveARunningBatchFromTasks() async throws {
    let config = smallConfig()
    let scheduler = try Scheduler(config: config)
    try await withThrowingTaskGroup(of: Void.self) { group in
      for id in 0..<6 {
        group.addTask {
          // Each request prefills alone, on whatever thread its task runs.
          let request = try Cache(config: config)
          var model = CacheModel(config)
          let tokens = 2 + id
          let data = model.data(batch: 1, tokens: tokens, seed: 500 + id)
          try request.append(batch: 1, tokens: tokens, data)
          model.append(batch: 1, tokens: tokens, data)
          await Task.yield()
          try await scheduler.join(request, model, id: id)
          for step in 0..<3 {
            try await scheduler.step(seed: 10_000 + id * 100 + step)
            await Task.yield()
          }
          try await scheduler.leave(id)
        }
      }
      try await group.waitForAll()
    }
    let remaining = try await scheduler.check()
    XCTAssertEqual(remaining, 0, "every request left")
  }
}

/// An engine's scheduler: one actor owns the running batch, sized for 8 rows. Requests join it
/// (into free slots), decode steps append to every row, and a leaving request's row takes the
/// last row in its place (one row moves; the last leaving moves nothing).
actor Scheduler {
  let config: CacheConfig
  let batch: Cache
  var model: CacheModel
  var ids: [Int] = []

  init(config: CacheConfig) throws {
    self.config = config
    batch = try Cache(config: config)
    model = CacheModel(config)
    try batch.reserveRows(8)
  }

  func join(_ request: Cache, _ requestModel: CacheModel, id: Int) throws {
    try batch.mergeRows(from: [request])
    model = ids.isEmpty ? requestModel : CacheModel.merge([model, requestModel])
    ids.append(id)
    try assertMatches(batch, model, "request \(id) joined")
  }

  func step(seed: Int) throws {
    guard !ids.isEmpty else { return }
    let data = model.data(batch: ids.count, tokens: 1, seed: seed)
    try batch.append(batch: ids.count, tokens: 1, data)
    model.append(batch: ids.count, tokens: 1, data)
  }

  func leave(_ id: Int) throws {
    let row = ids.firstIndex(of: id)!
    let last = ids.count - 1
    if last == 0 {
      try batch.reset()
      try batch.reserveRows(8)
      model = CacheModel(config)
      ids = []
      return
    }
    var keep = Array(0..<last)
    if row < last { keep[row] = last }
    try batch.filterRows(keeping: keep)
    model.filter(keep)
    ids = keep.map { ids[$0] }
    if ids.count == 2 {
      // The batch winds down: its free slots' memory goes back (joins then rebuild).
      try batch.shrinkRows()
    }
    try assertMatches(batch, model, "request \(id) left")
  }

  func check() throws -> Int {
    try assertMatches(batch, model, "the batch at the end")
    return ids.count
  }
}
