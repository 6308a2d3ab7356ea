// Status.swift: the library's statuses as a Swift enum, so call sites match `.shape` instead of
// comparing raw C values; `cValue` and `init(_:)` convert at the C boundary.
import LatentCache

/// The result of a C call. Every status but `.ok` is a failure after which the cache is exactly
/// as before the call.
public enum Status: Sendable, Hashable, CustomStringConvertible {
  case ok
  /// A required pointer was NULL, or a handle was not live.
  case nullArgument
  /// An argument outside what the call accepts.
  case invalidArgument
  /// An array or buffer of the wrong rank, width, batch, token count or length.
  case shape
  /// An array of a dtype the call does not take.
  case dtype
  /// A row, count or position beyond what the cache holds.
  case outOfRange
  /// Not allowed in the cache's current state (round or prefill misuse, non-empty merge target).
  case invalidState
  /// Beyond `max_tokens`, INT32_MAX positions, or MLX's memory limit.
  case capacity
  /// An output buffer too small (the Swift layer sizes its own buffers and retries).
  case bufferTooSmall
  /// MLX itself failed.
  case backend
  /// The library panicked; free the handle involved.
  case panic
  /// A value this Swift layer does not know (a newer library).
  case unknown(UInt32)

  public init(_ status: latent_cache_status) {
    switch status {
    case LATENT_CACHE_STATUS_OK: self = .ok
    case LATENT_CACHE_STATUS_NULL_ARGUMENT: self = .nullArgument
    case LATENT_CACHE_STATUS_INVALID_ARGUMENT: self = .invalidArgument
    case LATENT_CACHE_STATUS_SHAPE: self = .shape
    case LATENT_CACHE_STATUS_DTYPE: self = .dtype
    case LATENT_CACHE_STATUS_OUT_OF_RANGE: self = .outOfRange
    case LATENT_CACHE_STATUS_INVALID_STATE: self = .invalidState
    case LATENT_CACHE_STATUS_CAPACITY: self = .capacity
    case LATENT_CACHE_STATUS_BUFFER_TOO_SMALL: self = .bufferTooSmall
    case LATENT_CACHE_STATUS_BACKEND: self = .backend
    case LATENT_CACHE_STATUS_PANIC: self = .panic
    default: self = .unknown(status.rawValue)
    }
  }

  /// The C value.
  public var cValue: latent_cache_status {
    switch self {
    case .ok: LATENT_CACHE_STATUS_OK
    case .nullArgument: LATENT_CACHE_STATUS_NULL_ARGUMENT
    case .invalidArgument: LATENT_CACHE_STATUS_INVALID_ARGUMENT
    case .shape: LATENT_CACHE_STATUS_SHAPE
    case .dtype: LATENT_CACHE_STATUS_DTYPE
    case .outOfRange: LATENT_CACHE_STATUS_OUT_OF_RANGE
    case .invalidState: LATENT_CACHE_STATUS_INVALID_STATE
    case .capacity: LATENT_CACHE_STATUS_CAPACITY
    case .bufferTooSmall: LATENT_CACHE_STATUS_BUFFER_TOO_SMALL
    case .backend: LATENT_CACHE_STATUS_BACKEND
    case .panic: LATENT_CACHE_STATUS_PANIC
    case .unknown(let raw): latent_cache_status(rawValue: raw)
    }
  }

  /// The library's name for it ("SHAPE", "OUT_OF_RANGE", ...; "UNKNOWN" for unknown values).
  public var name: String { String(cString: latent_cache_status_name(cValue.rawValue)) }

  public var description: String { name }
}
