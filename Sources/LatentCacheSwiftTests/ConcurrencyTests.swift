// ConcurrencyTests.swift: the Swift layer from concurrent tasks. Appenders and readers on
// distinct caches each match their own model; reads concurrent with appends on one cache never
// throw (the sized reads retry when an append outgrows them) and always see a prefix of what was
// appended; concurrent failing calls each get their own message, even across awaits.
import LatentCacheSwift
import XCTest

final class ConcurrencyTests: XCTestCase {
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
}
