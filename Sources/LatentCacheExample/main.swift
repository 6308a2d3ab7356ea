// main.swift: the Swift engine example: a GLM-5.2-shaped decode loop over a CacheSet of a few
// layers (target layers with and without DSA index keys, and the MTP layer). It prefills two
// prompts of different lengths (left padding), decodes steps through MLX arrays with one
// evaluation per step and attention over a donor, runs a speculative round with per-row
// rollback, then saves and reloads the set. Each stage checks what it prints against the values
// it appended (kept on the host) and exits non-zero on any mismatch.
import LatentCache
import LatentCacheSwift
#if canImport(Darwin)
  import Darwin
#else
  import Glibc
#endif

func require(_ ok: Bool, _ what: String) {
  if !ok {
    print("FAILED: \(what)")
    exit(1)
  }
}

// GLM-5.2's first four target layers (0 to 2 run the DSA indexer, with index keys; 3 does not)
// and its MTP layer.
let glm = try CacheConfig.glm52()
let configs = Array(glm[0..<4]) + [glm[78]]
let set = try CacheSet(layers: configs)
let layers = try set.layers()
print(
  "latent-cache \(LatentCacheLibrary.version): \(configs.count) layers, signatures "
    + (try layers.map { try $0.signature }).joined(separator: ", "))

// A deterministic value per (layer, row, position, channel); `history[l][b][f]` keeps what each
// layer's row holds per family, the reference every check compares with.
func value(_ l: Int, _ b: Int, _ t: Int, _ c: Int, _ f: Int) -> Float {
  Float(l * 997 + b * 131 + t * 17 + f * 7) + Float(c % 64) / 64
}
var history = configs.map { _ in [[[Float]]](repeating: [[], [], []], count: 2) }
let families: [Family] = [.latent, .rope, .indexKeys]

/// One append of `tokens` positions starting at position `t0` of each row, on every layer,
/// through MLX arrays; returns the stored state so the caller evaluates once per step.
@MainActor func appendStep(tokens: Int, t0: [Int], leftPadding: [Int]? = nil) throws -> [LatentCacheArray?] {
  var outs: [LatentCacheArray?] = []
  for (l, cache) in layers.enumerated() {
    var arrays: [LatentCacheArray?] = []
    for (f, family) in families.enumerated() {
      let width = configs[l].width(family)
      if width == 0 {
        arrays.append(nil)
        continue
      }
      var data: [Float] = []
      for b in 0..<2 {
        let row = (0..<tokens).flatMap { t in (0..<width).map { value(l, b, t0[b] + t, $0, f) } }
        data += row
        // Padding positions are stored but never valid: the reference skips them.
        history[l][b][f] += row.dropFirst((leftPadding?[b] ?? 0) * width)
      }
      arrays.append(try LatentCacheArray(data, batch: 2, tokens: tokens, width: width))
    }
    let state = try cache.appendReturningState(
      latent: arrays[0]!, rope: arrays[1]!, indexKeys: arrays[2], leftPadding: leftPadding)
    outs += [state.latent, state.rope, state.indexKeys]
  }
  return outs
}

@MainActor func checkAgainstHistory(_ what: String, _ caches: [Cache]) throws {
  for (l, cache) in caches.enumerated() {
    for b in 0..<2 {
      for (f, family) in families.enumerated() where configs[l].width(family) > 0 {
        require(try cache.readRow(family, row: b) == history[l][b][f], "\(what): layer \(l) row \(b) \(family)")
      }
    }
  }
  print("\(what): every layer's rows read back exactly (\(try caches[0].rowOffsets) positions)")
}

// Prefill: prompts of 12 and 9 tokens, the shorter left-padded by 3.
try set.reserve(64)
try LatentCacheArray.eval(try appendStep(tokens: 12, t0: [0, 0], leftPadding: [0, 3]))
require(try layers[0].rowOffsets == [12, 9], "prefill row offsets")
try checkAgainstHistory("prefill", layers)

// Decode: four steps of one token, one evaluation per step. Layer 2 runs the DSA indexer: its
// index scores pick the top 8 positions per row, and layer 3, which has no index keys, attends
// over layer 2's selection (GLM-5.2's selection sources say so), while layer 0 attends densely.
let sources = try CacheConfig.glm52SelectionSources()
require(sources[2] == 2 && sources[3] == 2, "layer 3 takes layer 2's selection")
let heads = 2
let qLatent = try LatentCacheArray([Float](repeating: 0.01, count: 2 * heads * 512), shape: [2, heads, 1, 512])
let qRope = try LatentCacheArray([Float](repeating: 0.02, count: 2 * heads * 64), shape: [2, heads, 1, 64])
let qIndex = try LatentCacheArray((0..<(2 * heads * 128)).map { Float($0 % 7) / 7 }, shape: [2, heads, 1, 128])
let weights = try LatentCacheArray([Float](repeating: 0.5, count: 2 * heads), shape: [2, 1, heads])
var position = [12, 12]
for step in 0..<4 {
  var outs = try appendStep(tokens: 1, t0: position)
  let dense = try layers[0].captureDonor().attend(qLatent: qLatent, qRope: qRope, scale: 0.0417, mode: .causal)
  let indexer = try layers[sources[3]].captureDonor()
  let scores = try indexer.indexScores(qIndex: qIndex, weights: weights, mode: .causal)
  let selected = try indexer.select(scores: scores, k: 8)
  let indices = try selected.map { try $0.toHostInt32() } ?? []
  require(indices.count == 2 * 8, "8 positions selected per row")
  let sparse = try layers[3].captureDonor().attendSelected(
    qLatent: qLatent, qRope: qRope, scale: 0.0417, mode: .causal, indices: selected!)
  outs += [dense, sparse]
  try LatentCacheArray.eval(outs)
  require(try dense.shape == [2, heads, 1, 512] && sparse.shape == [2, heads, 1, 512], "attention output shapes")
  position = position.map { $0 + 1 }
  print(
    "decode step \(step): \(try layers[0].offset) positions stored; layer 3 attends over layer 2's picks "
      + "\(indices.prefix(8).sorted())")
}
try checkAgainstHistory("decode", layers)

// A speculative round: three drafts, row 0 accepts two, row 1 none.
try set.beginSpeculativeRound()
try LatentCacheArray.eval(try appendStep(tokens: 3, t0: position))
try set.rollBackSpeculativeRound(keepingPerRow: [2, 0])
for l in history.indices {
  for f in 0..<3 where configs[l].width(families[f]) > 0 {
    let w = configs[l].width(families[f])
    history[l][0][f].removeLast(1 * w)
    history[l][1][f].removeLast(3 * w)
  }
}
require(try layers[0].rowOffsets == [18, 13], "row offsets after the round")
try checkAgainstHistory("speculative round (kept 2 and 0 of 3 drafts)", layers)

// Save and reload: the reloaded set holds exactly the same rows.
let dir = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
let path = "\(dir)/latent-cache-swift-example-\(getpid()).safetensors"
try set.save(to: path)
let reloaded = try CacheSet(contentsOfFile: path)
unlink(path)
try checkAgainstHistory("save and reload", try reloaded.layers())
let bytes = try set.serialized()
try checkAgainstHistory("bytes round trip (\(bytes.count) bytes)", try CacheSet(serialized: bytes).layers())

// A rejected call throws with its status and changes nothing.
do {
  try set.trim(100)
  require(false, "trimming 100 positions succeeded")
} catch let error as LatentCacheError {
  require(error.status == .outOfRange, "trim status \(error.status)")
  print("trim(100) refused as expected: \(error)")
}
try checkAgainstHistory("after the refused trim", layers)
print("example: all checks passed")
