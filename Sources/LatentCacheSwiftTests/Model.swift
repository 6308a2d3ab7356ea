// Model.swift: the plain-Swift reference the tests compare the library with: each row's valid
// positions per family as arrays of Float, with the operations' documented meaning (append,
// padded append, trim, rounds with per-row rollback, filter, extract, merge). No library call.
import LatentCache
import LatentCacheSwift
import XCTest
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

/// A deterministic generator (SplitMix64), so every random sequence replays from its seed.
struct SeededRandom: RandomNumberGenerator {
  var state: UInt64
  init(seed: UInt64) { state = seed }
  mutating func next() -> UInt64 {
    state &+= 0x9E37_79B9_7F4A_7C15
    var z = state
    z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
    z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
    return z ^ (z >> 31)
  }
}

/// What a cache holds, as plain arrays: `rows[b][f]` is row b's valid positions of family f
/// (latent, rope, index keys), row-major.
struct CacheModel: Equatable {
  let widths: [Int]
  var rows: [[[Float]]] = []
  /// Each row's position count when the open round began (nil: no round).
  var roundStart: [Int]?

  /// Each family's storage mode: bfloat16 families hold their values rounded as the library
  /// documents (to nearest even), float32 ones exactly.
  let storages: [Storage]

  init(_ config: CacheConfig) {
    widths = Family.allCases.map { config.width($0) }
    storages = [config.latentStorage, config.ropeStorage, config.indexStorage]
  }

  /// float32 to bfloat16 and back, rounding to nearest even (finite values).
  static func bfloat16(_ x: Float) -> Float {
    let bits = x.bitPattern
    return Float(bitPattern: (bits &+ 0x7FFF &+ ((bits >> 16) & 1)) & 0xFFFF_0000)
  }

  var batch: Int { rows.count }
  func count(_ b: Int) -> Int { rows[b][0].count / widths[0] }
  var counts: [Int] { rows.indices.map(count) }

  /// Host buffers `[batch, tokens, width]` per family, values unique per call (`seed`).
  func data(batch: Int, tokens: Int, seed: Int) -> [[Float]] {
    widths.enumerated().map { f, w in
      (0..<(batch * tokens * w)).map { Float(seed % 100_000) + Float(f) / 4 + Float($0 % 4093) / 8192 }
    }
  }

  /// An append of `data` (from `data(...)`); row b's first `leftPadding[b]` positions are padding.
  mutating func append(batch: Int, tokens: Int, _ data: [[Float]], leftPadding: [Int]? = nil) {
    if rows.isEmpty { rows = Array(repeating: widths.map { _ in [] }, count: batch) }
    for b in 0..<batch {
      for (f, w) in widths.enumerated() where w > 0 {
        let row = data[f][(b * tokens * w)..<((b + 1) * tokens * w)].dropFirst((leftPadding?[b] ?? 0) * w)
        switch storages[f] {
        case .f32: rows[b][f] += row
        case .bf16: rows[b][f] += row.map(CacheModel.bfloat16)
        default: preconditionFailure("the model holds float32 and bfloat16 families only")
        }
      }
    }
  }

  mutating func drop(row b: Int, last n: Int) {
    for (f, w) in widths.enumerated() { rows[b][f].removeLast(n * w) }
  }

  mutating func trim(_ n: Int) { for b in rows.indices { drop(row: b, last: n) } }

  mutating func rollBack(keep: [Int]) {
    for b in rows.indices { drop(row: b, last: count(b) - roundStart![b] - keep[b]) }
    roundStart = nil
  }

  mutating func filter(_ keep: [Int]) { rows = keep.map { rows[$0] } }

  func extract(_ b: Int) -> CacheModel {
    var m = self
    m.rows = [rows[b]]
    m.roundStart = nil
    return m
  }

  /// A merge of `sources` into an empty cache: every row of every source, in order.
  static func merge(_ sources: [CacheModel]) -> CacheModel {
    var m = sources[0]
    m.rows = sources.flatMap(\.rows)
    m.roundStart = nil
    return m
  }
}

/// Asserts `cache` holds exactly what `model` says: row counts, every row of every family.
func assertMatches(
  _ cache: Cache, _ model: CacheModel, _ what: String, file: StaticString = #filePath, line: UInt = #line
)
  throws
{
  XCTAssertEqual(try cache.rowOffsets, model.counts, "\(what): row offsets", file: file, line: line)
  XCTAssertEqual(try cache.inSpeculativeRound, model.roundStart != nil, "\(what): round", file: file, line: line)
  for b in 0..<model.batch {
    for (f, family) in Family.allCases.enumerated() where model.widths[f] > 0 {
      XCTAssertEqual(
        try cache.readRow(family, row: b), model.rows[b][f], "\(what): row \(b) \(family)", file: file, line: line)
    }
  }
}

/// Everything a cache's reads say, for "a rejected call changes nothing" checks.
struct Snapshot: Equatable {
  var offset = 0, batch = 0, byteLength = 0, maxAppend = 0, minimumReusable = 0
  var rowOffsets: [Int] = [], leftPadding: [Int] = [], rowEnds: [Int] = [], converted: [Int] = []
  var inRound = false
  var config = CacheConfig()
  var signature = ""
  var windows: [[Float]] = []
  var rows: [[Float]] = []

  init(_ cache: Cache) throws {
    offset = try cache.offset
    batch = try cache.batchSize
    byteLength = try cache.byteLength
    maxAppend = try cache.maxAppendTokens
    minimumReusable = try cache.minimumReusableOffset
    rowOffsets = try cache.rowOffsets
    leftPadding = try cache.leftPadding
    rowEnds = try cache.rowEnds
    converted = try cache.convertedPositions
    inRound = try cache.inSpeculativeRound
    config = try cache.config
    signature = try cache.signature
    let families = Family.allCases.filter { config.width($0) > 0 }
    windows = try families.map { try cache.read($0) }
    rows = try families.flatMap { f in try (0..<batch).map { try cache.readRow(f, row: $0) } }
  }
}

/// Asserts `body` throws a `LatentCacheError` with `status` and a message, and returns it.
@discardableResult
func assertThrows(
  _ status: Status, _ what: String, file: StaticString = #filePath, line: UInt = #line, _ body: () throws -> Void
) -> LatentCacheError? {
  do {
    try body()
    XCTFail("\(what): no error (wanted \(status))", file: file, line: line)
  } catch let error as LatentCacheError {
    XCTAssertEqual(error.status, status, "\(what): \(error)", file: file, line: line)
    XCTAssertFalse(error.message.isEmpty, "\(what): empty message", file: file, line: line)
    return error
  } catch {
    XCTFail("\(what): not a LatentCacheError: \(error)", file: file, line: line)
  }
  return nil
}

/// A small layer geometry, so random sequences run fast.
func smallConfig(index: Bool = true, layout: LatentCacheLayout = .rightJustified, maxTokens: Int = 0) -> CacheConfig {
  var c = CacheConfig()
  c.kvLoraRank = 16
  c.ropeHeadDim = 4
  c.indexHeadDim = index ? 8 : 0
  c.layout = layout
  c.maxTokens = maxTokens
  return c
}

extension Cache {
  /// A host append of `data` (from `CacheModel.data`).
  func append(batch: Int, tokens: Int, _ data: [[Float]]) throws {
    try append(batch: batch, tokens: tokens, latent: data[0], rope: data[1], indexKeys: data[2].isEmpty ? nil : data[2])
  }
}
