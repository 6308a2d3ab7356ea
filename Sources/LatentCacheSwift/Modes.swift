// Modes.swift: the C API's mode values (storage, layout, role, family, mask) as Swift enums.
// Each maps to the header's own constant, so a renumbering there cannot go unnoticed here.
import LatentCache

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
public enum LatentCacheLayout: Sendable, Hashable, CaseIterable {
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
  /// Every valid position of the row (padding and positions past the row's end are -inf).
  case none
  /// Bottom-right aligned, as MLX's SDPA: query `i` of `Lq` is the row's position
  /// `len - Lq + i` and sees the row's positions up to it (one before the row sees none: zeros).
  case causal
  /// Every valid position, plus an additive mask array broadcastable to `[B, H, Lq, T]`.
  case array

  public var cValue: UInt32 {
    switch self {
    case .none: LATENT_CACHE_MASK_NONE.rawValue
    case .causal: LATENT_CACHE_MASK_CAUSAL.rawValue
    case .array: LATENT_CACHE_MASK_ARRAY.rawValue
    }
  }
}

/// An MLX array's element type (`latent_cache_dtype`). Host arrays are made and read in
/// `.float32`, `.bfloat16`, `.float16` and `.int32`; the others name what arrays may hold.
public enum LatentCacheDType: Sendable, Hashable, CaseIterable {
  case float32, bfloat16, float16, int32, uint32, int64, uint8, bool, int8, int16, uint16, uint64, float64, complex64

  public init?(cValue: UInt32) {
    guard let type = Self.allCases.first(where: { $0.cValue == cValue }) else { return nil }
    self = type
  }

  public var cValue: UInt32 {
    switch self {
    case .float32: LATENT_CACHE_DTYPE_FLOAT32.rawValue
    case .bfloat16: LATENT_CACHE_DTYPE_BFLOAT16.rawValue
    case .float16: LATENT_CACHE_DTYPE_FLOAT16.rawValue
    case .int32: LATENT_CACHE_DTYPE_INT32.rawValue
    case .uint32: LATENT_CACHE_DTYPE_UINT32.rawValue
    case .int64: LATENT_CACHE_DTYPE_INT64.rawValue
    case .uint8: LATENT_CACHE_DTYPE_UINT8.rawValue
    case .bool: LATENT_CACHE_DTYPE_BOOL.rawValue
    case .int8: LATENT_CACHE_DTYPE_INT8.rawValue
    case .int16: LATENT_CACHE_DTYPE_INT16.rawValue
    case .uint16: LATENT_CACHE_DTYPE_UINT16.rawValue
    case .uint64: LATENT_CACHE_DTYPE_UINT64.rawValue
    case .float64: LATENT_CACHE_DTYPE_FLOAT64.rawValue
    case .complex64: LATENT_CACHE_DTYPE_COMPLEX64.rawValue
    }
  }
}

/// The device the library's MLX work runs on (`latent_cache_device`).
public enum LatentCacheDevice: Sendable, Hashable, CaseIterable {
  /// MLX's default device (the GPU where MLX has one), its CPU otherwise.
  case `default`
  case cpu, gpu

  public init?(cValue: UInt32) {
    guard let device = Self.allCases.first(where: { $0.cValue == cValue }) else { return nil }
    self = device
  }

  public var cValue: UInt32 {
    switch self {
    case .default: LATENT_CACHE_DEVICE_DEFAULT.rawValue
    case .cpu: LATENT_CACHE_DEVICE_CPU.rawValue
    case .gpu: LATENT_CACHE_DEVICE_GPU.rawValue
    }
  }
}
