// RandomSequenceTests.swift: seeded random sequences of appends, trims, speculative rounds with
// per-row rollback and row operations (filter, extract, merge) on a cache and on the plain
// model side by side, compared after every step; in both layouts, with and without index keys.
// Calls the model says must fail are checked to fail with their status and change nothing.
import LatentCache
import LatentCacheSwift
import XCTest

final class RandomSequenceTests: XCTestCase {
  func testRightJustifiedWithIndexKeys() throws { try run(seed: 1, config: smallConfig()) }
  func testRaggedWithIndexKeys() throws { try run(seed: 2, config: smallConfig(layout: .ragged)) }
  func testRightJustifiedWithoutIndexKeys() throws { try run(seed: 3, config: smallConfig(index: false)) }
  func testRaggedWithoutIndexKeys() throws { try run(seed: 4, config: smallConfig(index: false, layout: .ragged)) }

  func testBfloat16LatentAndIndexKeys() throws {
    var config = smallConfig(layout: .ragged)
    config.latentStorage = .bf16
    config.indexStorage = .bf16
    try run(seed: 5, config: config)
  }

  private func run(seed: UInt64, config: CacheConfig, steps: Int = 160) throws {
    var rng = SeededRandom(seed: seed)
    var cache = try Cache(config: config)
    var model = CacheModel(config)
    for step in 0..<steps {
      let what = "seed \(seed) step \(step)"
      let inRound = model.roundStart != nil
      let batch = model.batch == 0 ? Int.random(in: 1...3, using: &rng) : model.batch
      switch Int.random(in: 0..<10, using: &rng) {
      case 0...3:
        let tokens = Int.random(in: 1...4, using: &rng)
        let data = model.data(batch: batch, tokens: tokens, seed: step)
        try cache.append(batch: batch, tokens: tokens, data)
        model.append(batch: batch, tokens: tokens, data)
      case 4:
        guard model.batch > 0 else { continue }
        let shortest = model.counts.min()!
        let n = Int.random(in: 0...(shortest + 1), using: &rng)
        if n > shortest {
          try assertUnchanged(cache, what) {
            assertThrows(.outOfRange, "\(what): trim \(n)") { try cache.trim(n, bypass: true) }
          }
        } else if inRound {
          try assertUnchanged(cache, what) {
            assertThrows(.invalidState, "\(what): trim in a round") { try cache.trim(n) }
          }
          // With bypass, only what the round appended (a rollback must still find what the
          // rows held when it began); rows that joined inside the round are not checked here.
          guard let start = model.roundStart, start.count == model.batch else { continue }
          let appended = model.rows.indices.map { model.count($0) - start[$0] }.min()!
          if n > appended {
            try assertUnchanged(cache, what) {
              assertThrows(.invalidState, "\(what): trim \(n) past the round's start") {
                try cache.trim(n, bypass: true)
              }
            }
          } else {
            try cache.trim(n, bypass: true)
            model.trim(n)
          }
        } else {
          try cache.trim(n)
          model.trim(n)
        }
      case 5:
        if inRound {
          try assertUnchanged(cache, what) {
            assertThrows(.invalidState, "\(what): second begin") { try cache.beginSpeculativeRound() }
          }
        } else {
          try cache.beginSpeculativeRound()
          model.roundStart = model.counts.isEmpty ? [] : model.counts
        }
      case 6:
        guard inRound, let start = model.roundStart, start.count == model.batch, model.batch > 0 else { continue }
        let appended = model.rows.indices.map { model.count($0) - start[$0] }
        var keep = appended.map { Int.random(in: 0...$0, using: &rng) }
        if Int.random(in: 0..<5, using: &rng) == 0 {
          keep[0] = appended[0] + 1
          try assertUnchanged(cache, what) {
            assertThrows(.outOfRange, "\(what): keep beyond") {
              try cache.rollBackSpeculativeRound(keepingPerRow: keep)
            }
          }
        } else {
          try cache.rollBackSpeculativeRound(keepingPerRow: keep)
          model.rollBack(keep: keep)
        }
      case 7:
        guard inRound else { continue }
        try cache.commitSpeculativeRound()
        model.roundStart = nil
      case 8:
        guard model.batch > 0 else { continue }
        let keep = Array((0..<model.batch).shuffled(using: &rng).prefix(Int.random(in: 1...model.batch, using: &rng)))
        if inRound {
          try assertUnchanged(cache, what) {
            assertThrows(.invalidState, "\(what): filter in a round") { try cache.filterRows(keeping: keep) }
          }
        } else {
          try cache.filterRows(keeping: keep)
          model.filter(keep)
        }
      default:
        // Extract a row, then merge it back behind the others into a fresh cache, or into this one.
        guard model.batch > 0, !inRound else { continue }
        let row = Int.random(in: 0..<model.batch, using: &rng)
        let single = try cache.extractRow(row)
        try assertMatches(single, model.extract(row), "\(what): extracted row \(row)")
        let merged = try Cache(config: config)
        try merged.mergeRows(from: [cache, single])
        let mergedModel = CacheModel.merge([model, model.extract(row)])
        try assertMatches(merged, mergedModel, "\(what): merged")
        if model.batch < 4 && Bool.random(using: &rng) {
          cache = merged
          model = mergedModel
        } else if model.batch < 4 {
          // The row joins the running cache instead, in a reserved slot.
          try cache.reserveRows(model.batch + 1)
          try cache.mergeRows(from: [single])
          model = mergedModel
        }
      }
      try assertMatches(cache, model, what)
    }
  }
}

/// Runs `body` (which expects a rejected call) and asserts the cache's full state is unchanged.
func assertUnchanged(
  _ cache: Cache, _ what: String, file: StaticString = #filePath, line: UInt = #line, _ body: () -> Void
)
  throws
{
  let before = try Snapshot(cache)
  body()
  XCTAssertEqual(try Snapshot(cache), before, "\(what): a rejected call changed the cache", file: file, line: line)
}
