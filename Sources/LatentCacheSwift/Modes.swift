// Modes.swift: the C API's mode values (storage, layout, role, family, mask) as Swift enums.
// Each maps to the header's own constant, so a renumbering there cannot go unnoticed here.

/// How a family's positions are stored (`latent_cache_storage`).
public enum Storage: Sendable, Hashable, CaseIterable {
  case f32, bf16, f16, q8, q4, fp8

  public init?(cValue: UInt32) {
    guard let mode = Self.allCases.first(where: { $0.cValue == cValue }) else { return nil }
    self = mode
  }

  public var cValue: UInt32 {
    switch self {
    case .f32: LATENT_CACHE_STORAGE_F32.rawValue
    case .bf16: LATENT_CACHE_STORAGE_BF16.rawValue
    case .f16: LATENT_CACHE_STORAGE_F16.rawValue
    case .q8: LATENT_CACHE_STORAGE_Q8.rawValue
    case .q4: LATENT_CACHE_STORAGE_Q4.rawValue
    case .fp8: LATENT_CACHE_STORAGE_FP8.rawValue
    }
  }
}

/// How rows sit in the stored window (`latent_cache_layout`).
public enum Layout: Sendable, Hashable, CaseIterable {
  case rightJustified, ragged

  public init?(cValue: UInt32) {
    guard let mode = Self.allCases.first(where: { $0.cValue == cValue }) else { return nil }
    self = mode
  }

  public var cValue: UInt32 {
    switch self {
    case .rightJustified: LATENT_CACHE_LAYOUT_RIGHT_JUSTIFIED.rawValue
    case .ragged: LATENT_CACHE_LAYOUT_RAGGED.rawValue
    }
  }
}

/// Which model layer a cache serves (`latent_cache_role`).
public enum Role: Sendable, Hashable, CaseIterable {
  case target, mtp

  public init?(cValue: UInt32) {
    guard let mode = Self.allCases.first(where: { $0.cValue == cValue }) else { return nil }
    self = mode
  }

  public var cValue: UInt32 {
    switch self {
    case .target: LATENT_CACHE_ROLE_TARGET.rawValue
    case .mtp: LATENT_CACHE_ROLE_MTP.rawValue
    }
  }
}

/// A state family (`latent_cache_family`), for reads.
public enum Family: Sendable, Hashable, CaseIterable {
  case latent, rope, indexKeys

  public var cValue: UInt32 {
    switch self {
    case .latent: LATENT_CACHE_FAMILY_LATENT.rawValue
    case .rope: LATENT_CACHE_FAMILY_ROPE.rawValue
    case .indexKeys: LATENT_CACHE_FAMILY_INDEX_KEYS.rawValue
    }
  }
}

/// Which positions each query sees in donor attention (`latent_cache_mask_mode`).
public enum MaskMode: Sendable, Hashable, CaseIterable {
  /// Every valid position of the row.
  case none
  /// Bottom-right aligned, as MLX's SDPA.
  case causal
  /// Every valid position, plus an additive mask array.
  case array

  public var cValue: UInt32 {
    switch self {
    case .none: LATENT_CACHE_MASK_NONE.rawValue
    case .causal: LATENT_CACHE_MASK_CAUSAL.rawValue
    case .array: LATENT_CACHE_MASK_ARRAY.rawValue
    }
  }
}

/// An MLX array's element type (`latent_cache_dtype`). The header does not declare that enum's
/// constants yet (only its name), so the values mirror the library's definition
/// (src/ffi/host_arrays.rs); tests check them against arrays of known types.
public enum DType: UInt32, Sendable, CaseIterable {
  case float32 = 0, bfloat16, float16, int32, uint32, int64, uint8, bool, int8, int16, uint16, uint64, float64, complex64
  /// A value this Swift layer does not know (a newer library).
  case unknown = 0xFFFF_FFFF
}
