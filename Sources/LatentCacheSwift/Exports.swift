// Exports.swift: re-exports the C module, so `import LatentCacheSwift` alone also names the C
// API (its config struct, status constants, mlx_array) and engines can mix the Swift layer with
// direct C calls through each wrapper's `handle`.
@_exported import LatentCache

/// The library as a whole: its version.
public enum LatentCacheLibrary {
  /// The linked library's version ("MAJOR.MINOR.PATCH"); compare with `LATENT_CACHE_VERSION`,
  /// the header's, to catch a header/library mismatch.
  public static var version: String { String(cString: latent_cache_version()) }
}
