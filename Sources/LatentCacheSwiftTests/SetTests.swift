// SetTests.swift: set-wide calls change every layer or none: rounds, trims, filter, merge,
// extract, reset, reserve and both prefill protocols on a set, compared with one model per layer;
// layers driven apart make the next set-wide call fail and change nothing, until `recover`.
import LatentCache
import LatentCacheSwift
import XCTest

final class SetTests: XCTestCase {
  private let configs = [smallConfig(), smallConfig(index: false), smallConfig(index: false)]

  func testSetWideEdits() throws {
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    try set.reserve(32)
    try appendAll(set, &models, batch: 3, tokens: 4, seed: 0)
    try set.beginSpeculativeRound()
    for l in models.indices { models[l].roundStart = models[l].counts }
    try appendAll(set, &models, batch: 3, tokens: 3, seed: 10)
    try set.rollBackSpeculativeRound(keepingPerRow: [1, 3, 0])
    for l in models.indices { models[l].rollBack(keep: [1, 3, 0]) }
    try assertLayers(set, models, "per-row rollback")
    try set.beginSpeculativeRound()
    for l in models.indices { models[l].roundStart = models[l].counts }
    try appendAll(set, &models, batch: 3, tokens: 2, seed: 20)
    try set.rollBackSpeculativeRound(keeping: 1)
    for l in models.indices { models[l].rollBack(keep: [1, 1, 1]) }
    try set.beginSpeculativeRound()
    try appendAll(set, &models, batch: 3, tokens: 1, seed: 30)
    try set.commitSpeculativeRound()
    try set.trim(2)
    for l in models.indices { models[l].trim(2) }
    try assertLayers(set, models, "rounds and trim")
    try set.filterRows(keeping: [2, 0])
    for l in models.indices { models[l].filter([2, 0]) }
    try assertLayers(set, models, "filter")
    let single = try set.extractRow(1)
    try assertLayers(single, models.map { $0.extract(1) }, "extract")
    let merged = try CacheSet(layers: configs)
    try merged.mergeRows(from: [single, set])
    try assertLayers(merged, models.map { CacheModel.merge([$0.extract(1), $0]) }, "merge")
    // A request joins the running set in a reserved slot, every layer alike.
    try set.reserveRows(3)
    try set.mergeRows(from: [single])
    models = models.map { CacheModel.merge([$0, $0.extract(1)]) }
    try assertLayers(set, models, "join")
    try set.shrinkRows()
    try assertLayers(set, models, "shrink rows")
    try set.reset()
    XCTAssertEqual(try set.layer(0).batchSize, 0)
  }

  func testLayersThatDisagreeRefuseSetCalls() throws {
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    try appendAll(set, &models, batch: 2, tokens: 3, seed: 0)
    try set.layer(1).trim(1)
    models[1].trim(1)
    let before = try set.layers().map(Snapshot.init)
    assertThrows(.invalidState, "set trim") { try set.trim(1) }
    assertThrows(.invalidState, "set round") { try set.beginSpeculativeRound() }
    assertThrows(.invalidState, "set filter") { try set.filterRows(keeping: [0]) }
    XCTAssertEqual(try set.layers().map(Snapshot.init), before)
    // A lent layer is never freed on its own: dropping every Cache object keeps the set whole.
    try assertLayers(set, models, "after refusals")
    // The way back: every layer cut to what all layers hold (layer 1's 2 positions a row).
    XCTAssertEqual(try set.recover(), 1)
    for l in models.indices where l != 1 { models[l].trim(1) }
    try assertLayers(set, models, "recovered")
    try set.trim(1)
    for l in models.indices { models[l].trim(1) }
    try assertLayers(set, models, "a set-wide trim after recover")
  }

  func testPaddedPrefillOnSet() throws {
    let set = try CacheSet(layers: configs)
    var models = configs.map(CacheModel.init)
    // Prompts of 5 and 3 tokens: row 1 padded at its end by 2, dropped at finalize.
    try set.preparePrefill(rows: 2, lengths: [5, 3], rightPadding: [0, 2])
    try appendAll(set, &models, batch: 2, tokens: 5, seed: 0)
    try set.finalizePrefill()
    for l in models.indices { models[l].drop(row: 1, last: 2) }
    try assertLayers(set, models, "right padding dropped")
    // The seed's chunked-prefill maintenance protocol.
    try set.beginPrefill()
    try appendAll(set, &models, batch: 2, tokens: 2, seed: 40)
    try set.commitPrefill(rows: [0, 1])
    try set.endPrefill()
    try assertLayers(set, models, "maintenance")
    assertThrows(.invalidState, "end without begin") { try set.endPrefill() }
  }

  func testPrefillProtocolsOnCache() throws {
    let config = smallConfig()
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    try cache.preparePrefill(rows: 2, leftPadding: [1, 0], rightPadding: [0, 1])
    let data = model.data(batch: 2, tokens: 4, seed: 1)
    try cache.append(batch: 2, tokens: 4, data)
    model.append(batch: 2, tokens: 4, data, leftPadding: [1, 0])
    try cache.finalizePrefill()
    model.drop(row: 1, last: 1)
    try assertMatches(cache, model, "left and right padding")
    XCTAssertEqual(try cache.leftPadding.count, 2)
    try cache.beginPrefill()
    assertThrows(.invalidState, "begin twice") { try cache.beginPrefill() }
    assertThrows(.outOfRange, "commit a row beyond") { try cache.commitPrefill(rows: [2]) }
    try cache.commitPrefill(rows: [1])
    try cache.endPrefill()
    try assertMatches(cache, model, "maintenance")
  }
}

/// Asserts a set's layers (lent caches) each match their model.
func assertLayers(_ set: CacheSet, _ models: [CacheModel], _ what: String) throws {
  for (l, layer) in try set.layers().enumerated() { try assertMatches(layer, models[l], "\(what): layer \(l)") }
}

/// Appends `tokens` positions to every row of every layer (seeded per layer), each model following.
func appendAll(_ set: CacheSet, _ models: inout [CacheModel], batch: Int, tokens: Int, seed: Int) throws {
  for (l, layer) in try set.layers().enumerated() {
    let data = models[l].data(batch: batch, tokens: tokens, seed: seed + l)
    try layer.append(batch: batch, tokens: tokens, data)
    models[l].append(batch: batch, tokens: tokens, data)
  }
}
