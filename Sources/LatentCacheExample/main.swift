// main.swift: the Swift example: one sparse-attention layer's cache, a few appended positions
// read back exactly, a speculative round rolled back, and a rejected call caught as an error.
import LatentCacheSwift

let cache = try Cache()
let rank = try cache.width(.latent)
let rope = try cache.width(.rope)
let index = try cache.width(.indexKeys)
print("latent-cache \(Cache.version): widths \(rank) / \(rope) / \(index)")

// Four positions of one row, each value distinct, appended one position at a time (decode).
var written: [Float] = []
for step in 0..<4 {
  let latent = (0..<rank).map { Float(step * rank + $0) }
  written += latent
  try cache.append(
    batch: 1, tokens: 1, latent: latent, rope: [Float](repeating: Float(step), count: rope),
    indexKeys: [Float](repeating: -Float(step), count: index))
}
let readBack = try cache.readRow(.latent, row: 0)
precondition(readBack == written, "the latent read back differs from what was appended")
let stored = try cache.offset()
print("stored \(stored) positions; the latent reads back exactly")

// A speculative round: three drafts, one accepted.
try cache.specRoundBegin()
try cache.append(
  batch: 1, tokens: 3, latent: [Float](repeating: 0.5, count: 3 * rank),
  rope: [Float](repeating: 0.5, count: 3 * rope), indexKeys: [Float](repeating: 0.5, count: 3 * index))
try cache.specRoundRollback(keep: [1])
let afterRound = try cache.offset()
print("after a round keeping 1 of 3 drafts: \(afterRound) positions")

// A rejected call throws, and changes nothing.
do {
  _ = try cache.readRow(.latent, row: 7)
} catch let error as LatentCacheError {
  print("row 7 refused as expected: \(error)")
}
let final = try cache.offset()
precondition(final == 5, "a rejected call changed the cache")
