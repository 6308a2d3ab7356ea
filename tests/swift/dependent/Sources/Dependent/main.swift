// main.swift: the dependent package's program: `import LatentCacheSwift` alone names the Swift
// layer and the C API it re-exports; it builds a config, appends, reads back, and checks a
// rejected call's status, exiting non-zero on any mismatch.
import LatentCacheSwift

var config = CacheConfig()
config.indexHeadDim = 0
// The C struct and constants are visible through the re-export.
let raw: latent_cache_config = config.cValue
precondition(raw.kv_lora_rank == 512 && LATENT_CACHE_STATUS_SHAPE.rawValue == Status.shape.cValue.rawValue)

let cache = try Cache(config: config)
let latent = (0..<(2 * 512)).map { Float($0) }
let rope = (0..<(2 * 64)).map { -Float($0) }
try cache.append(batch: 1, tokens: 2, latent: latent, rope: rope)
let readBack = try cache.readRow(.latent, row: 0)
precondition(readBack == latent, "latent read back differs")
do {
  try cache.trim(3)
  fatalError("trimming 3 of 2 positions succeeded")
} catch let error as LatentCacheError {
  precondition(error.status == .outOfRange, "trim beyond the row: \(error)")
}
let offset = try cache.offset
precondition(offset == 2, "the rejected trim changed the cache")
print("dependent package: latent-cache \(LatentCacheLibrary.version) linked and working")
