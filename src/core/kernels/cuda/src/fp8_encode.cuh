//! Header of the FP8 encoding kernel (before MLX's signature).

#include <cuda_fp8.h>
