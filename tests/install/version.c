/* version.c: an installed latent-cache agrees with itself on its version: the library's
 * latent_cache_version(), the header's LATENT_CACHE_VERSION macros and the version the build
 * system found (pkg-config's or CMake's, passed in as EXPECTED_VERSION). Also makes one cache,
 * so the library and the MLX it loads really work from where they were installed. */
#include <stdio.h>
#include <string.h>

#include "latent_cache.h"

#define STR2(x) #x
#define STR(x) STR2(x)

int main(void) {
  const char *runtime = latent_cache_version();
  const char *macros = STR(LATENT_CACHE_VERSION_MAJOR) "." STR(LATENT_CACHE_VERSION_MINOR) "." STR(
      LATENT_CACHE_VERSION_PATCH);
  if (strcmp(runtime, LATENT_CACHE_VERSION) != 0 || strcmp(macros, LATENT_CACHE_VERSION) != 0 ||
      strcmp(runtime, EXPECTED_VERSION) != 0) {
    fprintf(stderr, "version mismatch: library %s, header %s (%s), build system %s\n", runtime,
            LATENT_CACHE_VERSION, macros, EXPECTED_VERSION);
    return 1;
  }
  latent_cache_config config = latent_cache_config_default();
  latent_cache *cache = NULL;
  if (latent_cache_new(&config, &cache) != LATENT_CACHE_STATUS_OK) {
    char message[256];
    latent_cache_last_error(message, sizeof message);
    fprintf(stderr, "latent_cache_new: %s\n", message);
    return 1;
  }
  latent_cache_free(cache);
  printf("latent-cache %s: library, header and build system agree\n", runtime);
  return 0;
}
