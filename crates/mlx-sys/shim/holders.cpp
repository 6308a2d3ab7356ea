// What mlx-c does not say about an array, read from the MLX array behind it (an `mlx_array` is
// `{ void *ctx }` pointing to an `mlx::core::array` in every mlx-c version).
//
// `lc_mlx_data_holders`: how many references hold the array's buffer. Besides the array itself,
// a buffer is held by every evaluated view of it and, on every backend, by the work MLX has
// handed to the device (or the CPU's queue) that reads it, until that work completes. A write
// into the buffer is done in place only when the array holds it alone; the library waits for the
// work in flight to let go before it writes (`core/mlx/readers.rs`).
//
// `lc_mlx_active_tasks`: the batches of work MLX has handed to its devices and not seen complete
// (its scheduler's count; on CUDA the last batch of an evaluation is not counted, so 0 means
// "nothing counted", and a synchronisation covers the rest).
#include <mlx/array.h>
#include <mlx/scheduler.h>

#include "mlx/c/array.h"

extern "C" long lc_mlx_data_holders(mlx_array arr) {
  if (arr.ctx == nullptr) {
    return -1;
  }
  const auto& a = *static_cast<const mlx::core::array*>(arr.ctx);
  return static_cast<long>(a.data_shared_ptr().use_count());
}

extern "C" int lc_mlx_active_tasks(void) {
  return mlx::core::scheduler::n_active_tasks();
}
