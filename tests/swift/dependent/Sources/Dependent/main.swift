// main.swift: the dependent package's program: `import LatentCacheSwift` names the Swift layer,
// `import LatentCache` the C API beside it (not re-exported: an app on mlx-swift has its own
// mlx-c module); it builds a config, appends, reads back, and checks a rejected call's status,
// exiting non-zero on any mismatch. Beside them a module exporting mlx-swift's and SwiftUI's
// names (`MLXNamesStandIn`), each used unqualified, and an array bridged by its context pointer.
import LatentCache
import LatentCacheSwift
import MLXNamesStandIn

var config = CacheConfig()
config.indexHeadDim = 0
// The C struct and constants, through the C module.
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

// The names an mlx-swift app has, unqualified, beside the Swift layer's.
let theirs = MLXArray([1, 2], [2])
let dtype: DType = .bfloat16
let device = Device.gpu
struct Row: Layout {}
precondition(theirs.shape == [2] && dtype != .float32 && device != .cpu && Memory.activeMemory == 0 && check(true))
precondition(lastErrorMessage().isEmpty)
// Ours, by their own names; an array crosses by its context pointer (borrowed here).
let ours = try LatentCacheArray([1, 2, 3, 4] as [Float], shape: [2, 2])
let ourType: LatentCacheDType = try ours.dtype
let held = try LatentCacheMemory.info().active
precondition(ourType == .float32 && !LatentCacheDevice.allCases.isEmpty && held > 0)
let borrowed = LatentCacheArray(borrowingContext: ours.context)!
let values = try borrowed.toHost()
precondition(values == [1, 2, 3, 4], "an array borrowed by its context pointer reads differently")
print("dependent package: latent-cache beside mlx-swift's names")
