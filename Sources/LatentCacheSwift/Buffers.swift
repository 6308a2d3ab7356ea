// Buffers.swift: reads into buffers the Swift layer sizes itself. A size asked for in one call
// can be stale by the next (another task appended in between), so a read that gets
// BUFFER_TOO_SMALL asks for the size again and retries with at least twice the room: the
// caller never sees an error about a buffer it never passed, and a cache growing without pause
// still ends the loop (the room grows geometrically). Also the borrowed-argument helpers.
import LatentCache

/// Reads `[T]` through `fill(buffer, capacity, &written)`, sizing the buffer with `estimate`.
func readSized<T>(
  filler: T, estimate: () throws -> Int,
  _ fill: (UnsafeMutablePointer<T>?, Int, UnsafeMutablePointer<Int>) -> latent_cache_status
) throws -> [T] {
  var capacity = max(try estimate(), 0)
  while true {
    var out = [T](repeating: filler, count: capacity)
    var written = 0
    let status = out.withUnsafeMutableBufferPointer { fill($0.baseAddress, $0.count, &written) }
    if status == LATENT_CACHE_STATUS_BUFFER_TOO_SMALL {
      capacity = max(try estimate(), capacity * 2, 16)
      continue
    }
    // The message, when failing, is read here: synchronously, right after the call.
    try check(status)
    out.removeSubrange(min(written, out.count)...)
    return out
  }
}

/// A NUL-terminated string read the same way (`written` excludes the terminator).
func readSizedString(
  estimate: Int, _ fill: (UnsafeMutablePointer<CChar>?, Int, UnsafeMutablePointer<Int>) -> latent_cache_status
) throws -> String {
  let bytes = try readSized(filler: CChar(0), estimate: { estimate }, fill)
  return String(decoding: bytes.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Calls `body` with a pointer to `values`' elements, or NULL when `values` is nil (the C API's
/// "absent" for optional vectors).
func withOptionalBuffer<T, R>(_ values: [T]?, _ body: (UnsafePointer<T>?) throws -> R) rethrows -> R {
  guard let values else { return try body(nil) }
  return try values.withUnsafeBufferPointer { try body($0.baseAddress) }
}

/// Calls `body` with a C string of `value`, or NULL when `value` is nil.
func withOptionalCString<R>(_ value: String?, _ body: (UnsafePointer<CChar>?) throws -> R) rethrows -> R {
  guard let value else { return try body(nil) }
  return try value.withCString { try body($0) }
}

/// Copies and frees bytes a `..._save_to_buffer` call returned.
func takeBytes(_ data: UnsafeMutablePointer<UInt8>?, _ count: Int) -> [UInt8] {
  defer { latent_cache_bytes_free(data, count) }
  guard let data else { return [] }
  return Array(UnsafeBufferPointer(start: data, count: count))
}
