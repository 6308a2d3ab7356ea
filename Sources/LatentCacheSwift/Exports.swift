// Exports.swift: the C module, imported (not re-exported: an app on mlx-swift has its own mlx-c
// module, whose `mlx_array` would meet ours). An engine that mixes the Swift layer with direct C
// calls through each wrapper's `handle` imports `LatentCache` itself; one that bridges arrays to
// mlx-swift passes their context pointers (`LatentCacheArray(borrowingContext:)`).
import LatentCache

/// The library as a whole: its version.
public enum LatentCacheLibrary {
  /// The linked library's version ("MAJOR.MINOR.PATCH"); compare with `LATENT_CACHE_VERSION`,
  /// the header's, to catch a header/library mismatch.
  public static var version: String { String(cString: latent_cache_version()) }
}
