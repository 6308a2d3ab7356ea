// AttentionTests.swift: MLX arrays and donors against plain-Swift references computed in Double:
// host round trips, array appends and state views, packed state, absorbed MLA attention (no
// mask, causal, additive mask), DSA index scores, top-k selection and attention over it.
import LatentCache
import LatentCacheSwift
import XCTest

final class AttentionTests: XCTestCase {
  private var rng = SeededRandom(seed: 42)
  private func randoms(_ n: Int) -> [Float] { (0..<n).map { _ in Float.random(in: -1...1, using: &rng) } }

  func testArraysRoundTripAndRefuseBadShapes() throws {
    let data = randoms(3 * 700)
    let array = try LatentCacheArray(data, shape: [3, 700])
    try array.eval()
    XCTAssertEqual(try array.toHost(), data)  // over 1024 floats: the read grows its buffer
    XCTAssertEqual(try LatentCacheArray(data, batch: 3, tokens: 7, width: 100).toHost(), data)
    assertThrows(.shape, "shape product") { _ = try LatentCacheArray(data, shape: [3, 701]) }
    assertThrows(.shape, "batch product") { _ = try LatentCacheArray(data, batch: 1, tokens: 1, width: 5) }
    XCTAssertNil(LatentCacheArray(adopting: mlx_array(ctx: nil)))
  }

  func testArrayAppendsMatchTheModel() throws {
    let config = smallConfig()
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    for step in 0..<3 {
      let data = model.data(batch: 2, tokens: step + 1, seed: step)
      let arrays = try zip(data, [16, 4, 8]).map { try LatentCacheArray($0, batch: 2, tokens: step + 1, width: $1) }
      let keys = try step == 0 ? cache.storedIndexKeys() : nil
      if step == 0 {
        try cache.append(latent: arrays[0], rope: arrays[1], indexKeys: arrays[2], leftPadding: [1, 0])
        model.append(batch: 2, tokens: 1, data, leftPadding: [1, 0])
        XCTAssertEqual(try keys?.toHost(), [])  // [0, 0, 8] before the first append
      } else {
        let state = try cache.appendReturningState(latent: arrays[0], rope: arrays[1], indexKeys: arrays[2])
        model.append(batch: 2, tokens: step + 1, data)
        try LatentCacheArray.eval([state.latent, state.rope, state.indexKeys])
        XCTAssertEqual(try state.latent.toHost(), try cache.read(.latent))
        XCTAssertEqual(try state.indexKeys?.toHost(), try cache.read(.indexKeys))
      }
    }
    try assertMatches(cache, model, "array appends")
    let state = try cache.state()
    XCTAssertEqual(try state.rope.toHost(), try cache.read(.rope))
    XCTAssertEqual(try cache.storedIndexKeys().toHost(), try cache.read(.indexKeys))
    let packed = try cache.packedState(.latent)
    XCTAssertEqual(packed.storage, .f32)
    XCTAssertEqual(packed.bits, 32)
    XCTAssertEqual(packed.groupSize, 0)
    XCTAssertNil(packed.scales)
    XCTAssertEqual(try packed.values.toHost(), try cache.read(.latent))
    // A part read from a state nothing holds any more: the array is its own owner.
    let values = try cache.packedState(.latent).values
    let rope = try cache.packedState(.rope).values
    XCTAssertEqual(try values.toHost(), try cache.read(.latent))
    XCTAssertEqual(try rope.toHost(), try cache.read(.rope))
  }

  func testPipelinedStepsStoreWhatWasAppended() throws {
    // A decode loop as MLX engines run it: step n + 1 appended, attended and handed to MLX
    // (evalAsync) before the wait for step n; every stored value equals the model's, and the
    // last step's attention what a fresh donor computes once everything has run.
    let config = smallConfig()
    let cache = try Cache(config: config)
    var model = CacheModel(config)
    let ql = try LatentCacheArray(randoms(2 * 3 * 16), shape: [2, 3, 1, 16])
    let qr = try LatentCacheArray(randoms(2 * 3 * 4), shape: [2, 3, 1, 4])
    var inFlight: LatentCacheArray? = nil
    for step in 0..<6 {
      let tokens = step == 0 ? 5 : 1
      let data = model.data(batch: 2, tokens: tokens, seed: 100 + step)
      let arrays = try zip(data, [16, 4, 8]).map { try LatentCacheArray($0, batch: 2, tokens: tokens, width: $1) }
      try cache.append(latent: arrays[0], rope: arrays[1], indexKeys: arrays[2])
      model.append(batch: 2, tokens: tokens, data)
      let out = try cache.captureDonor().attend(qLatent: ql, qRope: qr, scale: 0.3, mode: .none)
      try LatentCacheArray.evalAsync([out])
      try LatentCacheArray.eval([inFlight])
      inFlight = out
    }
    try LatentCacheArray.eval([inFlight])
    try assertMatches(cache, model, "pipelined steps")
    let fresh = try cache.captureDonor().attend(qLatent: ql, qRope: qr, scale: 0.3, mode: .none)
    XCTAssertEqual(try inFlight?.toHost(), try fresh.toHost())
  }

  func testQuantizedStorageReadsCloseAndPacksParts() throws {
    var config = CacheConfig()
    config.kvLoraRank = 64
    config.ropeHeadDim = 64
    config.indexHeadDim = 0
    config.latentStorage = .q8
    config.ropeStorage = .bf16
    let cache = try Cache(config: config)
    let latent = randoms(2 * 3 * 64)
    let rope = randoms(2 * 3 * 64)
    try cache.append(batch: 2, tokens: 3, latent: latent, rope: rope)
    XCTAssertEqual(try cache.signature, "kv:mla-storage:q8-bf16:kv:mla:target")
    for (got, want) in zip(try cache.read(.latent), latent) { XCTAssertEqual(got, want, accuracy: 2.0 / 255 + 0.01) }
    for (got, want) in zip(try cache.read(.rope), rope) { XCTAssertEqual(got, want, accuracy: 0.005) }
    let packed = try cache.packedState(.latent)
    XCTAssertEqual(packed.storage, .q8)
    XCTAssertEqual(packed.bits, 8)
    XCTAssertEqual(packed.groupSize, 64)
    XCTAssertNotNil(packed.scales)
    XCTAssertNotNil(packed.biases)
    XCTAssertEqual(try packed.scales?.toHost().count, 2 * 3)  // one per group of 64
    let scales = try cache.packedState(.latent).scales
    XCTAssertEqual(try scales?.toHost().count, 2 * 3)
  }

  func testDonorAttentionIndexScoresAndSelection() throws {
    let config = smallConfig()
    let (b, h, lq, tokens, pad) = (2, 2, 2, 6, [0, 2])
    let cache = try Cache(config: config)
    let latent = randoms(b * tokens * 16)
    let rope = randoms(b * tokens * 4)
    let keys = randoms(b * tokens * 8)
    try cache.appendPadded(batch: b, tokens: tokens, leftPadding: pad, latent: latent, rope: rope, indexKeys: keys)
    let donor = try cache.captureDonor()
    XCTAssertEqual(try donor.rows(), DonorRows(batch: b, offset: tokens, leftPadding: pad, rowEnds: [tokens, tokens]))
    // The donor is a snapshot: a later append does not show in it.
    try cache.append(batch: b, tokens: 1, latent: randoms(b * 16), rope: randoms(b * 4), indexKeys: randoms(b * 8))
    XCTAssertEqual(try donor.rows().offset, tokens)

    let qLatent = randoms(b * h * lq * 16)
    let qRope = randoms(b * h * lq * 4)
    let ql = try LatentCacheArray(qLatent, shape: [b, h, lq, 16])
    let qr = try LatentCacheArray(qRope, shape: [b, h, lq, 4])
    let scale: Float = 0.3
    // Reference: which window positions query q of row r sees under `causal`.
    func visible(_ r: Int, _ q: Int, causal: Bool) -> [Int] {
      Array(pad[r]..<tokens).filter { !causal || $0 <= tokens - lq + q }
    }
    func dot(_ a: [Float], _ ai: Int, _ bv: [Float], _ bi: Int, _ n: Int) -> Double {
      (0..<n).reduce(0.0) { $0 + Double(a[ai + $1]) * Double(bv[bi + $1]) }
    }
    func reference(_ seen: (Int, Int) -> [Int], bias: (Int, Int, Int, Int) -> Double = { _, _, _, _ in 0 }) -> [Double]
    {
      var out: [Double] = []
      for r in 0..<b {
        for hh in 0..<h {
          for q in 0..<lq {
            let qi = ((r * h + hh) * lq + q)
            let ts = seen(r, q)
            let logits = ts.map {
              Double(scale)
                * (dot(qLatent, qi * 16, latent, (r * tokens + $0) * 16, 16)
                  + dot(qRope, qi * 4, rope, (r * tokens + $0) * 4, 4)) + bias(r, hh, q, $0)
            }
            let m = logits.max()!
            let e = logits.map { exp($0 - m) }
            let z = e.reduce(0, +)
            for c in 0..<16 {
              out.append(zip(ts, e).reduce(0.0) { $0 + $1.1 / z * Double(latent[(r * tokens + $1.0) * 16 + c]) })
            }
          }
        }
      }
      return out
    }
    func assertClose(_ got: LatentCacheArray, _ want: [Double], _ what: String) throws {
      let host = try got.toHost()
      XCTAssertEqual(host.count, want.count, what)
      for (g, w) in zip(host, want) { XCTAssertEqual(Double(g), w, accuracy: 1e-4, what) }
    }
    try assertClose(
      try donor.attend(qLatent: ql, qRope: qr, scale: scale, mode: .none),
      reference { r, q in visible(r, q, causal: false) }, "none")
    try assertClose(
      try donor.attend(qLatent: ql, qRope: qr, scale: scale, mode: .causal),
      reference { r, q in visible(r, q, causal: true) }, "causal")
    let maskValues = randoms(b * h * lq * tokens)
    let mask = try LatentCacheArray(maskValues, shape: [b, h, lq, tokens])
    try assertClose(
      try donor.attend(qLatent: ql, qRope: qr, scale: scale, mode: .array, mask: mask),
      reference(
        { r, q in visible(r, q, causal: false) },
        bias: { r, hh, q, t in Double(maskValues[((r * h + hh) * lq + q) * tokens + t]) }),
      "mask array")
    assertThrows(.invalidArgument, "a mask without the array mode") {
      _ = try donor.attend(qLatent: ql, qRope: qr, scale: scale, mode: .none, mask: mask)
    }
    assertThrows(.shape, "a query of the wrong width") {
      _ = try donor.attend(qLatent: qr, qRope: qr, scale: scale, mode: .none)
    }

    // Index scores: sum over heads of weights * ReLU(q . k), -inf where a query sees nothing.
    let hi = 2
    let qIndex = randoms(b * hi * lq * 8)
    let weights = randoms(b * lq * hi)
    let scores = try donor.indexScores(
      qIndex: try LatentCacheArray(qIndex, shape: [b, hi, lq, 8]), weights: try LatentCacheArray(weights, shape: [b, lq, hi]),
      mode: .causal)
    let got = try scores.toHost()
    var want: [Double] = []
    for r in 0..<b {
      for q in 0..<lq {
        let seen = Set(visible(r, q, causal: true))
        for t in 0..<tokens {
          want.append(
            !seen.contains(t)
              ? -Double.infinity
              : (0..<hi).reduce(0.0) {
                $0 + Double(weights[(r * lq + q) * hi + $1])
                  * max(0, dot(qIndex, ((r * hi + $1) * lq + q) * 8, keys, (r * tokens + t) * 8, 8))
              })
        }
      }
    }
    for (g, w) in zip(got, want) {
      if w.isInfinite { XCTAssertEqual(Double(g), w) } else { XCTAssertEqual(Double(g), w, accuracy: 1e-4) }
    }
    XCTAssertNil(try donor.select(scores: scores, k: tokens), "k covering the window: attend densely")
    let k = 2
    let indices = try XCTUnwrap(try donor.select(scores: scores, k: k))
    let chosen = try indices.toHost().map { Int($0) }
    for r in 0..<b {
      for q in 0..<lq {
        let row = Array(want[((r * lq + q) * tokens)..<((r * lq + q + 1) * tokens)])
        // Compared by score, not position: ReLU makes ties (at 0) common, and any of them is right.
        let top = row.sorted(by: >).prefix(k)
        let picked = chosen[((r * lq + q) * k)..<((r * lq + q + 1) * k)]
        XCTAssertEqual(Set(picked).count, k, "distinct positions")
        for (g, w) in zip(picked.map { row[$0] }.sorted(by: >), top) {
          XCTAssertEqual(g, w, accuracy: 1e-6, "top-\(k) of row \(r) query \(q): picked \(picked)")
        }
      }
    }
    // The selection in one call: the same positions (both from the same scores).
    let qIndexArray = try LatentCacheArray(qIndex, shape: [b, hi, lq, 8])
    let weightsArray = try LatentCacheArray(weights, shape: [b, lq, hi])
    let direct = try XCTUnwrap(try donor.indexSelect(qIndex: qIndexArray, weights: weightsArray, mode: .causal, k: k))
    XCTAssertEqual(try direct.toHost().map { Int($0) }, chosen, "indexSelect picks what select of indexScores picks")
    XCTAssertNil(try donor.indexSelect(qIndex: qIndexArray, weights: weightsArray, mode: .causal, k: tokens))
    let selected = try donor.attendSelected(qLatent: ql, qRope: qr, scale: scale, mode: .causal, indices: indices)
    try assertClose(
      selected,
      reference { r, q in
        let picks = Set(chosen[((r * lq + q) * k)..<((r * lq + q + 1) * k)])
        return visible(r, q, causal: true).filter { picks.contains($0) }
      }, "attend selected")
  }
}
