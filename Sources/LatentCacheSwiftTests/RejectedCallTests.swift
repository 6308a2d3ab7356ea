// RejectedCallTests.swift: bad calls throw the documented Status, carry a message that is this
// thread's last error, and leave the cache exactly as it was (every read compared before and
// after).
import LatentCache
import LatentCacheSwift
import XCTest
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

final class RejectedCallTests: XCTestCase {
  /// A cache of two rows holding a few positions (rows of different lengths: padded first append).
  private func filled(_ config: CacheConfig = smallConfig()) throws -> (Cache, CacheModel) {
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    let data = model.data(batch: 2, tokens: 5, seed: 7)
    try cache.appendPadded(
      batch: 2, tokens: 5, leftPadding: [0, 2], latent: data[0], rope: data[1],
      indexKeys: data[2].isEmpty ? nil : data[2])
    model.append(batch: 2, tokens: 5, data, leftPadding: [0, 2])
    try assertMatches(cache, model, "padded first append")
    return (cache, model)
  }

  func testAppendsRefused() throws {
    let (cache, model) = try filled()
    let good = model.data(batch: 2, tokens: 1, seed: 1)
    try assertUnchanged(cache, "appends") {
      assertThrows(.shape, "latent one float short") {
        try cache.append(batch: 2, tokens: 1, latent: Array(good[0].dropLast()), rope: good[1], indexKeys: good[2])
      }
      assertThrows(.shape, "batch mismatch") {
        let three = model.data(batch: 3, tokens: 1, seed: 1)
        try cache.append(batch: 3, tokens: 1, three)
      }
      assertThrows(.shape, "zero tokens") { try cache.append(batch: 2, tokens: 0, latent: [], rope: [], indexKeys: []) }
      assertThrows(.invalidArgument, "index keys missing on a DSA layer") {
        try cache.append(batch: 2, tokens: 1, latent: good[0], rope: good[1], indexKeys: nil)
      }
      assertThrows(.invalidState, "padded append on a cache holding rows") {
        try cache.appendPadded(
          batch: 2, tokens: 1, leftPadding: [0, 0], latent: good[0], rope: good[1], indexKeys: good[2])
      }
    }
    let plain = try Cache(config: smallConfig(index: false))
    let keys = [Float](repeating: 1, count: 8)
    assertThrows(.invalidArgument, "index keys on a layer without them") {
      try plain.append(
        batch: 1, tokens: 1, latent: [Float](repeating: 0, count: 16), rope: [0, 0, 0, 0], indexKeys: keys)
    }
    XCTAssertEqual(try plain.batchSize, 0)
  }

  func testCapacityRefused() throws {
    let (cache, model) = try filled(smallConfig(maxTokens: 6))
    try assertUnchanged(cache, "capacity") {
      assertThrows(.capacity, "beyond max tokens") {
        try cache.append(batch: 2, tokens: 2, model.data(batch: 2, tokens: 2, seed: 2))
      }
      assertThrows(.capacity, "reserve beyond max tokens") { try cache.reserve(7) }
    }
    XCTAssertEqual(try cache.maxAppendTokens, 1)
  }

  func testReadsAndEditsRefused() throws {
    let (cache, _) = try filled()
    try assertUnchanged(cache, "reads and edits") {
      assertThrows(.outOfRange, "row 2 of 2") { _ = try cache.readRow(.latent, row: 2) }
      assertThrows(.outOfRange, "trim beyond the shortest row") { try cache.trim(4) }
      assertThrows(.invalidState, "commit without a round") { try cache.commitSpeculativeRound() }
      assertThrows(.invalidState, "rollback without a round") { try cache.rollBackSpeculativeRound(keeping: 0) }
      assertThrows(.invalidArgument, "filter with a row twice") { try cache.filterRows(keeping: [1, 1]) }
      assertThrows(.invalidArgument, "filter keeping nothing") { try cache.filterRows(keeping: []) }
      assertThrows(.outOfRange, "filter a row beyond") { try cache.filterRows(keeping: [0, 2]) }
      assertThrows(.outOfRange, "extract a row beyond") { _ = try cache.extractRow(5) }
      assertThrows(.invalidArgument, "a join of another geometry") {
        try cache.mergeRows(from: [try self.filled(smallConfig(index: false)).0])
      }
      assertThrows(.invalidState, "prefill commit without begin") { try cache.commitPrefill(rows: [0]) }
      assertThrows(.invalidState, "prefill end without begin") { try cache.endPrefill() }
      assertThrows(.invalidArgument, "prefill vectors of another length") {
        try cache.preparePrefill(rows: 3, rightPadding: [0, 0, 0])
      }
    }
    let plain = try filled(smallConfig(index: false)).0
    try assertUnchanged(plain, "index keys of a layer without them") {
      assertThrows(.invalidArgument, "read index keys") { _ = try plain.readRow(.indexKeys, row: 0) }
      assertThrows(.invalidArgument, "stored index keys") { _ = try plain.storedIndexKeys() }
    }
  }

  func testRoundMisuseRefused() throws {
    let (cache, model) = try filled()
    try cache.beginSpeculativeRound()
    try cache.append(batch: 2, tokens: 2, model.data(batch: 2, tokens: 2, seed: 3))
    let path = temporaryPath("round")
    try assertUnchanged(cache, "inside a round") {
      assertThrows(.invalidState, "second begin") { try cache.beginSpeculativeRound() }
      assertThrows(.invalidState, "trim without bypass") { try cache.trim(1) }
      assertThrows(.invalidArgument, "keep of another length") {
        try cache.rollBackSpeculativeRound(keepingPerRow: [0])
      }
      assertThrows(.outOfRange, "keep beyond what a row appended") {
        try cache.rollBackSpeculativeRound(keepingPerRow: [0, 3])
      }
      assertThrows(.outOfRange, "keep beyond, every row") { try cache.rollBackSpeculativeRound(keeping: 3) }
      assertThrows(.invalidState, "filter") { try cache.filterRows(keeping: [0]) }
      assertThrows(.invalidState, "save") { try cache.save(to: path) }
      assertThrows(.invalidState, "save to bytes") { _ = try cache.serialized() }
    }
    XCTAssertEqual(access(path, F_OK), -1, "a refused save left a file")
  }

  func testConstructorsAndLoadsRefused() throws {
    var bad = smallConfig()
    bad.kvLoraRank = 0
    assertThrows(.invalidArgument, "zero kv_lora_rank") { _ = try Cache(config: bad) }
    var c = latent_cache_config_default()
    c.latent_storage = 99
    assertThrows(.invalidArgument, "unknown storage mode") { _ = try Cache(cConfig: c) }
    assertThrows(.invalidArgument, "bytes that are no state") { _ = try Cache(serialized: [1, 2, 3, 4]) }
    assertThrows(.invalidArgument, "a file that does not exist") {
      _ = try Cache(contentsOfFile: "/nonexistent/x.safetensors")
    }
    assertThrows(.invalidArgument, "no layers") { _ = try CacheSet(layers: []) }
    assertThrows(.invalidArgument, "a set from bytes that are no state") { _ = try CacheSet(serialized: [0]) }
    assertThrows(.invalidArgument, "a config projected") { _ = try bad.projectedBytes(batch: 1, tokens: 1) }
  }

  /// The error's message is this thread's last error, read right after the failing call.
  func testMessageIsTheFailingCallsOwn() throws {
    let (cache, _) = try filled()
    let error = assertThrows(.outOfRange, "trim 4321") { try cache.trim(4321) }
    XCTAssertTrue(error?.message.contains("4321") ?? false, "message: \(error?.message ?? "")")
    XCTAssertEqual(error?.message, LatentCacheError.lastMessage())
    // Successful calls leave it as it was.
    _ = try cache.offset
    XCTAssertEqual(error?.message, LatentCacheError.lastMessage())
    XCTAssertEqual(error?.description, "OUT_OF_RANGE: \(error?.message ?? "")")
  }

  func testStatusNamesAndValues() {
    let all: [Status] = [
      .ok, .nullArgument, .invalidArgument, .shape, .dtype, .outOfRange, .invalidState, .capacity, .bufferTooSmall,
      .backend, .panic,
    ]
    XCTAssertEqual(
      all.map(\.name),
      [
        "OK", "NULL_ARGUMENT", "INVALID_ARGUMENT", "SHAPE", "DTYPE", "OUT_OF_RANGE", "INVALID_STATE", "CAPACITY",
        "BUFFER_TOO_SMALL", "BACKEND", "PANIC",
      ])
    for status in all { XCTAssertEqual(Status(status.cValue), status) }
    XCTAssertEqual(Status(latent_cache_status(rawValue: 200)), .unknown(200))
    XCTAssertEqual(Status.unknown(200).name, "UNKNOWN")
    XCTAssertEqual(LatentCacheError(status: .shape, message: "m"), LatentCacheError(status: .shape, message: "m"))
  }
}

/// A fresh path under the temporary folder.
func temporaryPath(_ name: String) -> String {
  let dir = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
  return "\(dir)/latent-cache-swift-\(getpid())-\(name)-\(UInt64.random(in: 0...UInt64.max))"
}
