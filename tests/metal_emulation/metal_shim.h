// A CPU emulation of the Metal Shading Language features the library's Metal kernels use, so
// that their sources (src/core/decode_metal.rs) run on machines without an Apple GPU: every
// thread of a threadgroup is an OS thread, threadgroup memory is shared by them (threadgroups
// run one after another), and SIMD-group shuffles exchange values through a barrier of the
// group's 32 lanes. It checks the kernels' logic (indices, reductions, masks, the online
// softmax), not Metal's compiler or its speed.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

typedef unsigned int uint;
typedef unsigned short ushort;
struct uint3 {
  uint x, y, z;
};

// Address spaces: device and constant memory are plain memory here; threadgroup variables are
// shared by the threads of the (one running) threadgroup.
#define device
#define constant
#define threadgroup static
// MLX's utils.h (prepended to every kernel) defines this as a full-unroll pragma.
#define MLX_MTL_PRAGMA_UNROLL

using std::clamp;
using std::exp2;
using std::fma;
using std::max;
using std::min;

// MLX's bfloat16_t, as 16 bits converted exactly to and from float (round to nearest even).
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
typedef _Float16 float16_t;

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

struct SimdGroup {
  std::barrier<> bar{32};
  float slot[32];
  uint uslot[32];
};

struct Lane {
  uint lane;
  SimdGroup* simd;
  std::barrier<>* group;
};

inline thread_local Lane lc_lane;

inline void threadgroup_barrier(mem_flags) { lc_lane.group->arrive_and_wait(); }

inline float simd_shuffle(float v, ushort from) {
  SimdGroup& g = *lc_lane.simd;
  g.slot[lc_lane.lane] = v;
  g.bar.arrive_and_wait();
  const float r = g.slot[from];
  g.bar.arrive_and_wait();
  return r;
}

inline float simd_shuffle_xor(float v, ushort mask) { return simd_shuffle(v, lc_lane.lane ^ mask); }

// The sum of `v` over the SIMD group's lanes below this one (`below`) or over all of them.
inline uint lc_simd_total(uint v, bool below) {
  SimdGroup& g = *lc_lane.simd;
  g.uslot[lc_lane.lane] = v;
  g.bar.arrive_and_wait();
  uint total = 0;
  for (uint l = 0; l < (below ? lc_lane.lane : 32u); l++) total += g.uslot[l];
  g.bar.arrive_and_wait();
  return total;
}
inline uint simd_sum(uint v) { return lc_simd_total(v, false); }
inline uint simd_prefix_exclusive_sum(uint v) { return lc_simd_total(v, true); }

// The bitwise OR of `v` over the SIMD group's lanes.
inline uint simd_or(uint v) {
  SimdGroup& g = *lc_lane.simd;
  g.uslot[lc_lane.lane] = v;
  g.bar.arrive_and_wait();
  uint all = 0;
  for (uint l = 0; l < 32u; l++) all |= g.uslot[l];
  g.bar.arrive_and_wait();
  return all;
}

inline uint popcount(uint x) { return uint(__builtin_popcount(x)); }
inline uint ctz(uint x) { return x == 0 ? 32u : uint(__builtin_ctz(x)); }

// Threadgroup and device atomics (the emulation's threadgroup memory is shared by its threads;
// a device `uint` buffer is viewed as atomics by a cast, as Metal allows).
typedef std::atomic<uint> atomic_uint;
constexpr std::memory_order memory_order_relaxed = std::memory_order_relaxed;
inline void atomic_store_explicit(atomic_uint* a, uint v, std::memory_order o) { a->store(v, o); }
inline uint atomic_load_explicit(atomic_uint* a, std::memory_order o) { return a->load(o); }
inline uint atomic_fetch_add_explicit(atomic_uint* a, uint v, std::memory_order o) { return a->fetch_add(v, o); }
inline uint atomic_fetch_or_explicit(atomic_uint* a, uint v, std::memory_order o) { return a->fetch_or(v, o); }

// Metal's bit reinterpretation.
template <typename T, typename F>
T as_type(F f) {
  static_assert(sizeof(T) == sizeof(F));
  T t;
  std::memcpy(&t, &f, sizeof(T));
  return t;
}

// The kernel attributes the sources use, as Metal passes them.
struct Attributes {
  uint thread_index_in_threadgroup, thread_index_in_simdgroup, simdgroup_index_in_threadgroup;
  uint3 threadgroup_position_in_grid, threadgroups_per_grid, thread_position_in_threadgroup;
};

#define LC_ATTRIBUTES(a)                                                  \
  const uint thread_index_in_threadgroup = a.thread_index_in_threadgroup; \
  const uint thread_index_in_simdgroup = a.thread_index_in_simdgroup;     \
  const uint simdgroup_index_in_threadgroup = a.simdgroup_index_in_threadgroup; \
  const uint3 threadgroup_position_in_grid = a.threadgroup_position_in_grid; \
  const uint3 threadgroups_per_grid = a.threadgroups_per_grid;            \
  const uint3 thread_position_in_threadgroup = a.thread_position_in_threadgroup;

// Runs `kernel` over `groups` threadgroups of `threads` threads (a multiple of 32), one
// threadgroup at a time.
inline void dispatch(uint3 groups, uint threads, const std::function<void(const Attributes&)>& kernel) {
  for (uint z = 0; z < groups.z; z++) {
    for (uint y = 0; y < groups.y; y++) {
      for (uint x = 0; x < groups.x; x++) {
        std::barrier<> group(threads);
        std::vector<std::unique_ptr<SimdGroup>> simds;
        for (uint s = 0; s < threads / 32; s++) simds.push_back(std::make_unique<SimdGroup>());
        std::vector<std::thread> pool;
        for (uint t = 0; t < threads; t++) {
          pool.emplace_back([&, t] {
            lc_lane = Lane{t % 32, simds[t / 32].get(), &group};
            Attributes a{t, t % 32, t / 32, {x, y, z}, groups, {t, 0, 0}};
            kernel(a);
          });
        }
        for (auto& th : pool) th.join();
      }
    }
  }
}
