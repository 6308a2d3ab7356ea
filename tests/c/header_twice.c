/* The header must compile as C11 and as C++17, and survive being included twice. */
#include "latent_cache.h"
#include "latent_cache.h"

int header_twice_compiles(void);
int header_twice_compiles(void) { return (int)LATENT_CACHE_STATUS_OK; }
