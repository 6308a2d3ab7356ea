// CacheConfig.swift: one layer's geometry as a Swift struct. It converts to the C struct by
// starting from latent_cache_config_default() and setting its fields, so fields the library
// adds later (reserved ones, a struct size) keep their defaults.
import LatentCache

/// Geometry of one layer's cache. `CacheConfig()` is GLM-5.2's sparse-attention layer
/// (512 / 64 / 128, float32, unbounded, right-justified).
public struct CacheConfig: Sendable, Hashable {
  /// Width of the compressed KV latent per position.
  public var kvLoraRank: Int
  /// Width of the decoupled RoPE key per position.
  public var ropeHeadDim: Int
  /// Width of the DSA index key per position; 0 for a layer without index keys.
  public var indexHeadDim: Int
  /// Most positions a row may hold; 0 for unbounded.
  public var maxTokens: Int
  public var latentStorage: Storage
  public var ropeStorage: Storage
  public var indexStorage: Storage
  public var layout: LatentCacheLayout
  public var role: Role
  /// Composed storage: the float mode of the newest `hotWindow` positions.
  public var hotStorage: Storage
  /// Composed storage: 0 stores every position in its family's mode.
  public var hotWindow: Int

  /// The library's default (GLM-5.2's sparse-attention layer).
  public init() { self.init(latent_cache_config_default()) }

  /// From the C struct. Mode fields holding no known value (ignored ones, which the library
  /// reads back as F32) become `.f32`.
  public init(_ c: latent_cache_config) {
    kvLoraRank = c.kv_lora_rank
    ropeHeadDim = c.rope_head_dim
    indexHeadDim = c.index_head_dim
    maxTokens = c.max_tokens
    latentStorage = Storage(cValue: c.latent_storage) ?? .f32
    ropeStorage = Storage(cValue: c.rope_storage) ?? .f32
    indexStorage = Storage(cValue: c.index_storage) ?? .f32
    layout = LatentCacheLayout(cValue: c.layout) ?? .rightJustified
    role = Role(cValue: c.role) ?? .target
    hotStorage = Storage(cValue: c.hot_storage) ?? .f32
    hotWindow = c.hot_window
  }

  /// The C struct, built from latent_cache_config_default() so unknown fields keep defaults.
  public var cValue: latent_cache_config {
    var c = latent_cache_config_default()
    c.kv_lora_rank = kvLoraRank
    c.rope_head_dim = ropeHeadDim
    c.index_head_dim = indexHeadDim
    c.max_tokens = maxTokens
    c.latent_storage = latentStorage.cValue
    c.rope_storage = ropeStorage.cValue
    c.index_storage = indexStorage.cValue
    c.layout = layout.cValue
    c.role = role.cValue
    c.hot_storage = hotStorage.cValue
    c.hot_window = hotWindow
    return c
  }

  /// GLM-5.2's 79 layer configs: 78 target layers (index keys on 21 of them), then the MTP layer.
  public static func glm52() throws -> [CacheConfig] {
    let raw = try readSized(filler: latent_cache_config_default(), estimate: { 79 }) {
      latent_cache_glm52_configs($0, $1, $2)
    }
    return raw.map(CacheConfig.init)
  }

  /// For each of GLM-5.2's 78 target layers, the layer whose DSA top-k selection it attends
  /// with: itself where it runs the indexer (and has index keys), else the nearest indexer
  /// layer before it (pass that layer's `Donor.select` result to `attendSelected`).
  public static func glm52SelectionSources() throws -> [Int] {
    try readSized(filler: 0, estimate: { 78 }) { latent_cache_glm52_selection_sources($0, $1, $2) }
  }

  /// Bytes `batch` rows of `tokens` positions would hold in a cache of this config.
  public func projectedBytes(batch: Int, tokens: Int) throws -> Int {
    var c = cValue
    var out = 0
    try check(latent_cache_projected_bytes(&c, batch, tokens, &out))
    return out
  }

  /// A family's width per position.
  public func width(_ family: Family) -> Int {
    switch family {
    case .latent: kvLoraRank
    case .rope: ropeHeadDim
    case .indexKeys: indexHeadDim
    }
  }
}
