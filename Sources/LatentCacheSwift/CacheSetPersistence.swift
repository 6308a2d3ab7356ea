// CacheSetPersistence.swift: a set saved and loaded in the library's format (file or bytes)
// and in the seed's (mlx-bun) prompt-cache format with its tokens and identity strings.
import LatentCache

/// What a file of the seed's format holds besides the caches.
public struct MlxbunInfo: Sendable, Equatable {
  /// The token ids the state encodes.
  public var tokens: [UInt32]
  public var modelID: String?
  public var configFingerprint: String?
  public var tokenizerHash: String?
  /// The adapter namespace ("" for the base model).
  public var namespace: String?

  public init(
    tokens: [UInt32] = [], modelID: String? = nil, configFingerprint: String? = nil, tokenizerHash: String? = nil,
    namespace: String? = nil
  ) {
    self.tokens = tokens
    self.modelID = modelID
    self.configFingerprint = configFingerprint
    self.tokenizerHash = tokenizerHash
    self.namespace = namespace
  }
}

extension CacheSet {
  /// Loads a set saved by `save(to:)` (or a GLM-5 prompt cache of mlx-lm's).
  public convenience init(contentsOfFile path: String) throws {
    var raw: OpaquePointer?
    try check(latent_cache_set_load(path, &raw))
    self.init(adopting: raw!)
  }

  /// Loads a set from the bytes `serialized()` returned.
  public convenience init(serialized bytes: [UInt8]) throws {
    var raw: OpaquePointer?
    try bytes.withUnsafeBufferPointer { try check(latent_cache_set_load_from_buffer($0.baseAddress, $0.count, &raw)) }
    self.init(adopting: raw!)
  }

  /// Loads a prompt cache of the seed's format (float32 layers, rows right-justified).
  public convenience init(mlxbunFile path: String) throws {
    var raw: OpaquePointer?
    try check(latent_cache_set_load_mlxbun(path, &raw))
    self.init(adopting: raw!)
  }

  /// Saves every layer to `path` (never a partial file under that name).
  public func save(to path: String) throws { try check(latent_cache_set_save(handle, path)) }

  /// The bytes a file would hold.
  public func serialized() throws -> [UInt8] {
    var data: UnsafeMutablePointer<UInt8>?
    var count = 0
    try check(latent_cache_set_save_to_buffer(handle, &data, &count))
    return takeBytes(data, count)
  }

  /// Saves every layer in the seed's format (float32 layers, rows of one length, no padding).
  public func saveMlxbun(to path: String, info: MlxbunInfo? = nil) throws {
    try withMlxbunInfo(info) { latent_cache_set_save_mlxbun(handle, path, $0) }
  }

  /// Saves every layer in the seed's block layout (format version 5): a manifest at `path`, and
  /// each tensor's bytes in blocks of `blockBytes` (0: 1 MiB) named by their SHA-256 in a
  /// `blocks` folder beside it, blocks already there reused; so saving a conversation again after
  /// it grew writes its new positions. Load it with `CacheSet(mlxbunFile:)`.
  public func saveMlxbunBlocks(to path: String, info: MlxbunInfo? = nil, blockBytes: Int = 0) throws {
    try withMlxbunInfo(info) { latent_cache_set_save_mlxbun_blocks(handle, path, $0, blockBytes) }
  }

  /// Calls `save` with `info` as the C struct (NULL without it), its strings alive for the call.
  private func withMlxbunInfo(
    _ info: MlxbunInfo?, _ save: (UnsafePointer<latent_cache_mlxbun_info>?) -> latent_cache_status
  ) throws {
    guard let info else { return try check(save(nil)) }
    try info.tokens.withUnsafeBufferPointer { tokens in
      try withOptionalCString(info.modelID) { model in
        try withOptionalCString(info.configFingerprint) { fingerprint in
          try withOptionalCString(info.tokenizerHash) { tokenizer in
            try withOptionalCString(info.namespace) { ns in
              var c = latent_cache_mlxbun_info(
                tokens: tokens.baseAddress, tokens_len: tokens.count, model_id: model, config_fingerprint: fingerprint,
                tokenizer_hash: tokenizer, ns: ns)
              try check(save(&c))
            }
          }
        }
      }
    }
  }

  /// The token ids of a file of the seed's format (no tensor is read).
  public static func mlxbunTokens(path: String) throws -> [UInt32] {
    try readSized(filler: UInt32(0), estimate: { 4096 }) { latent_cache_mlxbun_tokens(path, $0, $1, $2) }
  }

  /// The JSON header of a file of the seed's format.
  public static func mlxbunHeader(path: String) throws -> String {
    try readSizedString(estimate: 4096) { latent_cache_mlxbun_header(path, $0, $1, $2) }
  }
}
