// Errors.swift: how a failed C call becomes a Swift error. The library keeps its last error
// message per thread, so the message must be read on the thread of the failed call, right
// after it: `check` does that synchronously, and every wrapper calls it inside the same
// non-async function as the C call (an `await` in between could resume on another thread and
// read that thread's message, or none).
import LatentCache

/// A rejected call: its status and the library's message for it. The cache is exactly as it
/// was before the call.
public struct LatentCacheError: Error, Sendable, Equatable, CustomStringConvertible {
  public let status: Status
  public let message: String

  public init(status: Status, message: String) {
    self.status = status
    self.message = message
  }

  public var description: String { "\(status.name): \(message)" }
}

extension LatentCacheError {
  /// This thread's last failure message ("" when no call on this thread has failed).
  public static func lastMessage() -> String {
    // Sized in one go: the message cannot change between the two calls, which run on this
    // thread with no library call between them.
    let length = latent_cache_last_error(nil, 0)
    var bytes = [CChar](repeating: 0, count: length + 1)
    _ = latent_cache_last_error(&bytes, bytes.count)
    return String(decoding: bytes.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }

  /// Throws `LatentCacheError` with `status` and this thread's message unless `status` is OK:
  /// for an engine's own C calls. Call it synchronously right after the C call that returned
  /// `status` (never after an `await`), so the message read is that call's.
  public static func check(_ status: latent_cache_status) throws {
    if status == LATENT_CACHE_STATUS_OK { return }
    throw LatentCacheError(status: Status(status), message: lastMessage())
  }
}

/// `LatentCacheError.check`, for this module's own calls (not exported: an app's `check` is its
/// own).
func check(_ status: latent_cache_status) throws {
  try LatentCacheError.check(status)
}
