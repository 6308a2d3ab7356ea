/* Force-included before every mlx-c source and into bindgen. mlx-c's half.h declares float16_t and
 * bfloat16_t only on arm64; other targets need them for the float16/bfloat16 accessors that mlx-rs
 * binds. C++ gets MLX's own half types (what mlx-c's .cpp files convert to and from); bindgen gets
 * C types of the same size. */
#ifndef LATENT_CACHE_MLX_C_PRELUDE_H
#define LATENT_CACHE_MLX_C_PRELUDE_H
/* mlx-c calls std::format without including <format> (it arrives transitively with other standard
 * libraries). Where the library has none, build.rs puts our stand-in on the include path. */
#if defined(__cplusplus) && __has_include(<format>)
#include <format>
#endif
#if !defined(__aarch64__) && !defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC)
#define HAS_FLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
#include <mlx/types/half_types.h>
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#else
#include <stdint.h>
typedef _Float16 float16_t;
typedef uint16_t bfloat16_t;
#endif
#endif
#endif
