// ConfigTests.swift: configs and process-wide settings: GLM-5.2's presets (checked against the
// header's rule for which layers carry index keys), projected bytes against a made cache's own
// accounting, config round trips, signatures, the evaluation lock and thread settings.
import LatentCache
import LatentCacheSwift
import XCTest
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

final class ConfigTests: XCTestCase {
  func testGlm52Presets() throws {
    let configs = try CacheConfig.glm52()
    XCTAssertEqual(configs.count, 79)
    for (l, c) in configs.prefix(78).enumerated() {
      // The header's rule: layers 0, 1, 2, then every fourth from 6 to 74 run the indexer.
      let dsa = l < 3 || (l >= 6 && l <= 74 && (l - 6) % 4 == 0)
      XCTAssertEqual(c.indexHeadDim, dsa ? 128 : 0, "layer \(l)")
      XCTAssertEqual([c.kvLoraRank, c.ropeHeadDim], [512, 64])
      XCTAssertEqual(c.role, .target)
    }
    XCTAssertEqual(configs.filter { $0.indexHeadDim > 0 }.count, 21)
    XCTAssertEqual(configs[78].role, .mtp)
    XCTAssertEqual(configs[78].indexHeadDim, 0)
    XCTAssertEqual(try Cache(config: configs[78]).signature, "kv:mla:mtp")
    // Each layer attends with its own selection where it has index keys, else with the nearest
    // indexer layer's before it.
    let sources = try CacheConfig.glm52SelectionSources()
    XCTAssertEqual(sources.count, 78)
    for l in 0..<78 {
      let nearest = (0...l).last { configs[$0].indexHeadDim > 0 }
      XCTAssertEqual(sources[l], nearest, "layer \(l)")
    }
  }

  func testProjectedBytesAndRoundTrip() throws {
    var ragged = smallConfig(layout: .ragged, maxTokens: 100)
    ragged.indexStorage = .bf16
    var quantized = CacheConfig()
    quantized.latentStorage = .q4
    quantized.ropeStorage = .bf16
    quantized.indexStorage = .fp8
    for config in [CacheConfig(), smallConfig(index: false), ragged, quantized] {
      let cache = try Cache(config: config)
      XCTAssertEqual(try cache.config, config)
      let perToken = try cache.bytesPerToken
      XCTAssertEqual(try config.projectedBytes(batch: 3, tokens: 10), 3 * 10 * perToken)
      let widths = Family.allCases.map { config.width($0) }
      XCTAssertEqual(try Family.allCases.map { try cache.width($0) }, widths)
      XCTAssertTrue(try cache.isTrimmable)
      XCTAssertEqual(try cache.maxAppendTokens, config.maxTokens == 0 ? Int.max : config.maxTokens)
    }
    XCTAssertEqual(try Cache(config: ragged).signature, "kv:ragged:kv:mla-storage:f32-f32-bf16:kv:mla:target:dsa")
    XCTAssertEqual(try Cache().signature, "kv:mla:target:dsa")
    assertThrows(.capacity, "a product beyond size_t") {
      _ = try CacheConfig().projectedBytes(batch: Int.max, tokens: 2)
    }
  }

  func testEvaluationLockWrapsEvaluations() throws {
    let counter = LockCounter()
    try Evaluation.setLock(lock: { counter.lock() }, unlock: { counter.unlock() })
    let cache = try Cache(config: smallConfig())
    try cache.append(batch: 1, tokens: 1, CacheModel(smallConfig()).data(batch: 1, tokens: 1, seed: 0))
    _ = try cache.readRow(.latent, row: 0)
    try Evaluation.resetLock()
    let (locks, unlocks) = counter.counts
    XCTAssertGreaterThan(locks, 0, "host appends and reads evaluate under the given lock")
    XCTAssertEqual(locks, unlocks)
    _ = try cache.readRow(.latent, row: 0)
    XCTAssertEqual(counter.counts.0, locks, "after the reset the library's own lock is used")
    assertThrows(.invalidArgument, "a lock without an unlock") {
      try Evaluation.setLock(lock: { _ in }, unlock: nil, context: nil)
    }
  }

  func testEvaluationOnTheCallingThread() throws {
    Evaluation.setEvaluationThread(false)
    defer { Evaluation.setEvaluationThread(true) }
    let config = smallConfig()
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    let data = model.data(batch: 2, tokens: 3, seed: 0)
    try cache.append(batch: 2, tokens: 3, data)
    model.append(batch: 2, tokens: 3, data)
    try assertMatches(cache, model, "evaluated on the calling thread")
  }
}

/// Counts lock and unlock calls (from the library's evaluation thread) under a mutex.
final class LockCounter: @unchecked Sendable {
  // @unchecked: `locks` and `unlocks` are only touched under `mutex`.
  private var mutex = pthread_mutex_t()
  private var locks = 0
  private var unlocks = 0
  init() { pthread_mutex_init(&mutex, nil) }
  func lock() {
    pthread_mutex_lock(&mutex)
    locks += 1
    pthread_mutex_unlock(&mutex)
  }
  func unlock() {
    pthread_mutex_lock(&mutex)
    unlocks += 1
    pthread_mutex_unlock(&mutex)
  }
  var counts: (Int, Int) {
    pthread_mutex_lock(&mutex)
    defer { pthread_mutex_unlock(&mutex) }
    return (locks, unlocks)
  }
}

final class DeviceTests: XCTestCase {
  func testDeviceIsFixedOnceChosen() throws {
    let device = try Evaluation.device
    XCTAssertTrue(device == .cpu || device == .gpu, "\(device)")
    try Evaluation.setDevice(device)  // the device in use is accepted
    let other: LatentCacheDevice = device == .cpu ? .gpu : .cpu
    assertThrows(.invalidState, "the other device after first use") { try Evaluation.setDevice(other) }
    XCTAssertEqual(try Evaluation.device, device)
    // The C call directly, with a value no Swift case names.
    assertThrows(.invalidArgument, "no such device") { try LatentCacheError.check(latent_cache_set_device(99)) }
  }
}
