// latent_cache.hpp: a C++17 RAII layer over the whole of latent_cache.h. Caches, returned arrays
// and packed states free themselves and are move-only; failures throw latent_cache_cpp::Error
// carrying the status and the library's message; host reads return std::vector. Hand-written;
// the C header stays the source of truth for every rule (ownership, threads, evaluation).
#ifndef LATENT_CACHE_HPP
#define LATENT_CACHE_HPP

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "latent_cache.h"

namespace latent_cache_cpp {

// A failed call: its status and this thread's message for it; what() reads "STATUS_NAME: message".
class Error : public std::runtime_error {
 public:
  Error(latent_cache_status status, const std::string &message)
      : std::runtime_error(std::string(latent_cache_status_name(static_cast<uint32_t>(status))) + ": " + message),
        status_(status) {}
  latent_cache_status status() const noexcept { return status_; }

 private:
  latent_cache_status status_;
};

inline void check(latent_cache_status status) {
  if (status == LATENT_CACHE_STATUS_OK) return;
  std::string message(latent_cache_last_error(nullptr, 0), '\0');
  latent_cache_last_error(message.data(), message.size() + 1);
  throw Error(status, message);
}

namespace detail {
// A prefill vector for the C call: NULL when empty; otherwise it must hold `rows` entries (the
// C call reads that many).
inline const size_t *or_null(const std::vector<size_t> &v, size_t rows) {
  if (v.empty()) return nullptr;
  if (v.size() != rows)
    throw Error(LATENT_CACHE_STATUS_INVALID_ARGUMENT, "prefill vectors must be empty or all of one length");
  return v.data();
}
}  // namespace detail

inline const char *version() noexcept { return latent_cache_version(); }

// An mlx_array the library handed over: freed when destroyed (latent_cache_array_free). Empty
// (ctx == NULL) where the library returns no array, such as index keys on a layer without DSA.
class Array {
 public:
  Array() noexcept = default;
  explicit Array(mlx_array raw) noexcept : raw_(raw) {}
  Array(Array &&other) noexcept : raw_(other.release()) {}
  Array &operator=(Array &&other) noexcept {
    if (this != &other) {
      reset();
      raw_ = other.release();
    }
    return *this;
  }
  Array(const Array &) = delete;
  Array &operator=(const Array &) = delete;
  ~Array() { reset(); }

  // A float32 array [batch, tokens, width] holding a copy of `data`.
  static Array from_host(const std::vector<float> &data, size_t batch, size_t tokens, size_t width) {
    mlx_array raw{nullptr};
    check(latent_cache_array_from_host(data.data(), data.size(), batch, tokens, width, &raw));
    return Array(raw);
  }

  // The handle, still owned by this object (pass it to mlx-c or to the library's calls).
  mlx_array get() const noexcept { return raw_; }
  bool empty() const noexcept { return raw_.ctx == nullptr; }
  // Gives up ownership: the caller frees the returned handle.
  mlx_array release() noexcept { return std::exchange(raw_, mlx_array{nullptr}); }
  void reset() noexcept { latent_cache_array_free(release()); }

 private:
  mlx_array raw_{nullptr};
};

// Evaluates arrays (empty ones are skipped) under the library's evaluation lock.
inline void eval(const std::vector<const Array *> &arrays) {
  std::vector<mlx_array> raw;
  raw.reserve(arrays.size());
  for (const Array *a : arrays) raw.push_back(a->get());
  check(latent_cache_eval(raw.data(), raw.size()));
}

// Hands arrays to MLX and returns once their work is queued; `eval` of them later waits (a
// pipelined decode loop: build step n + 1, eval_async it, then eval step n).
inline void eval_async(const std::vector<const Array *> &arrays) {
  std::vector<mlx_array> raw;
  raw.reserve(arrays.size());
  for (const Array *a : arrays) raw.push_back(a->get());
  check(latent_cache_eval_async(raw.data(), raw.size()));
}

// Hands the library the engine's evaluation lock (both callbacks NULL restores its own).
inline void set_eval_lock(latent_cache_lock_fn lock, latent_cache_lock_fn unlock, void *ctx) {
  check(latent_cache_set_eval_lock(lock, unlock, ctx));
}

// Where the library evaluates: its own thread (true, the default) or the calling thread.
inline void set_evaluation_thread(bool enabled) { latent_cache_set_evaluation_thread(enabled); }

// The values of every stored family, as an append or `state` returns them.
struct State {
  Array latent, rope, index_keys;
};

// One family's stored parts (latent_cache_packed_state): released when destroyed.
class Packed {
 public:
  Packed() noexcept = default;
  Packed(Packed &&other) noexcept : raw_(std::exchange(other.raw_, empty_packed())) {}
  Packed &operator=(Packed &&other) noexcept {
    if (this != &other) {
      latent_cache_packed_release(&raw_);
      raw_ = std::exchange(other.raw_, empty_packed());
    }
    return *this;
  }
  Packed(const Packed &) = delete;
  Packed &operator=(const Packed &) = delete;
  ~Packed() { latent_cache_packed_release(&raw_); }

  uint32_t storage() const noexcept { return raw_.storage; }
  uint32_t bits() const noexcept { return raw_.bits; }
  uint32_t group_size() const noexcept { return raw_.group_size; }
  // Borrowed views, valid while this object lives.
  mlx_array values() const noexcept { return raw_.values; }
  mlx_array scales() const noexcept { return raw_.scales; }
  mlx_array biases() const noexcept { return raw_.biases; }
  latent_cache_packed *out() noexcept { return &raw_; }

 private:
  static latent_cache_packed empty_packed() noexcept {
    latent_cache_packed p{};
    p.values.ctx = p.scales.ctx = p.biases.ctx = nullptr;
    return p;
  }
  latent_cache_packed raw_ = empty_packed();
};

// A snapshot of a cache's rows (latent_cache_capture_donor_rows) and attention over it; freed
// when destroyed. Valid after the cache moves on or is destroyed.
class Donor {
 public:
  explicit Donor(latent_cache_donor *raw) noexcept : handle_(raw) {}

  size_t batch_size() const { return rows().batch; }
  size_t offset() const { return rows().offset; }
  std::vector<size_t> left_pad() const { return rows().left_pad; }
  std::vector<size_t> row_ends() const { return rows().row_ends; }

  // Absorbed MLA attention [B, H, Lq, kv_lora_rank] (latent_cache_donor_attend), lazily.
  Array attend(const Array &q_latent, const Array &q_rope, float scale,
               latent_cache_mask_mode mode = LATENT_CACHE_MASK_NONE, const Array &mask = Array()) const {
    mlx_array out{nullptr};
    check(latent_cache_donor_attend(handle_.get(), q_latent.get(), q_rope.get(), scale, static_cast<uint32_t>(mode),
                                    mask.get(), &out));
    return Array(out);
  }

  // DSA index scores [B, Lq, T] (latent_cache_donor_index_scores), lazily.
  Array index_scores(const Array &q_index, const Array &weights, latent_cache_mask_mode mode = LATENT_CACHE_MASK_NONE) const {
    mlx_array out{nullptr};
    check(latent_cache_donor_index_scores(handle_.get(), q_index.get(), weights.get(), static_cast<uint32_t>(mode), &out));
    return Array(out);
  }

  // The top-k positions per query [B, Lq, k]; empty when the window holds no more than k.
  Array select(const Array &scores, size_t k) const {
    mlx_array out{nullptr};
    check(latent_cache_donor_select(handle_.get(), scores.get(), k, &out));
    return Array(out);
  }

  // Attention over the selected positions alone (latent_cache_donor_attend_selected).
  Array attend_selected(const Array &q_latent, const Array &q_rope, float scale, const Array &indices,
                        latent_cache_mask_mode mode = LATENT_CACHE_MASK_NONE) const {
    mlx_array out{nullptr};
    check(latent_cache_donor_attend_selected(handle_.get(), q_latent.get(), q_rope.get(), scale,
                                             static_cast<uint32_t>(mode), indices.get(), &out));
    return Array(out);
  }

 private:
  struct Rows {
    size_t batch = 0, offset = 0;
    std::vector<size_t> left_pad, row_ends;
  };
  Rows rows() const {
    Rows r;
    check(latent_cache_donor_rows(handle_.get(), &r.batch, &r.offset, nullptr, nullptr, 0));
    r.left_pad.resize(r.batch);
    r.row_ends.resize(r.batch);
    check(latent_cache_donor_rows(handle_.get(), &r.batch, &r.offset, r.left_pad.data(), r.row_ends.data(), r.batch));
    return r;
  }
  struct Free {
    void operator()(latent_cache_donor *d) const noexcept { latent_cache_donor_free(d); }
  };
  std::unique_ptr<latent_cache_donor, Free> handle_;
};

// An array of any rank holding a copy of `data` (latent_cache_array_from_host_shape).
inline Array array_from_host(const std::vector<float> &data, const std::vector<size_t> &shape) {
  mlx_array raw{nullptr};
  check(latent_cache_array_from_host_shape(data.data(), data.size(), shape.data(), shape.size(), &raw));
  return Array(raw);
}

// The float32 values of any array, row-major (latent_cache_array_to_host; evaluates it).
inline std::vector<float> to_host(const Array &a) {
  size_t written = 0;
  std::vector<float> out(64);
  latent_cache_status s = latent_cache_array_to_host(a.get(), out.data(), out.size(), &written);
  for (size_t size = 256; s == LATENT_CACHE_STATUS_BUFFER_TOO_SMALL; size *= 4) {
    out.resize(size);
    s = latent_cache_array_to_host(a.get(), out.data(), out.size(), &written);
  }
  check(s);
  out.resize(written);
  return out;
}

// One layer's cache. Movable, not copyable; frees the handle when destroyed.
class Cache {
 public:
  explicit Cache(const latent_cache_config &config) {
    latent_cache *raw = nullptr;
    check(latent_cache_new(&config, &raw));
    handle_.reset(raw);
  }

  // Takes ownership of a handle the C API returned (latent_cache_extract_row).
  static Cache adopt(latent_cache *raw) { return Cache(raw); }

  latent_cache *get() const noexcept { return handle_.get(); }

  // Host path.
  void append(size_t batch, size_t tokens, const std::vector<float> &latent, const std::vector<float> &rope,
              const std::vector<float> &index_keys = {}) {
    check(latent_cache_append_host(get(), batch, tokens, latent.data(), latent.size(), rope.data(), rope.size(),
                                   keys(index_keys), index_keys.size()));
  }

  void append_padded(size_t batch, size_t tokens, const std::vector<size_t> &left_pad,
                     const std::vector<float> &latent, const std::vector<float> &rope,
                     const std::vector<float> &index_keys = {}) {
    check(latent_cache_append_host_padded(get(), batch, tokens, left_pad.data(), left_pad.size(), latent.data(),
                                          latent.size(), rope.data(), rope.size(), keys(index_keys),
                                          index_keys.size()));
  }

  std::vector<float> read_row(latent_cache_family family, size_t row) const {
    std::vector<size_t> rows = row_offsets();
    std::vector<float> out(row < rows.size() ? rows[row] * width(family) : 0);
    size_t written = 0;
    check(latent_cache_read_row_host(get(), static_cast<uint32_t>(family), row, out.data(), out.size(), &written));
    out.resize(written);
    return out;
  }

  // The whole window [batch, offset, width]; positions outside a row's valid range are unspecified.
  std::vector<float> read(latent_cache_family family) const {
    std::vector<float> out(batch_size() * offset() * width(family));
    size_t written = 0;
    check(latent_cache_read_host(get(), static_cast<uint32_t>(family), out.data(), out.size(), &written));
    out.resize(written);
    return out;
  }

  // MLX-array path. `index_keys` may be empty on a layer without DSA.
  State append_latent(const Array &latent, const Array &rope, const Array &index_keys = Array()) {
    State s;
    mlx_array l{nullptr}, r{nullptr}, k{nullptr};
    check(latent_cache_append_latent(get(), latent.get(), rope.get(), index_keys.get(), &l, &r, &k));
    s.latent = Array(l), s.rope = Array(r), s.index_keys = Array(k);
    return s;
  }

  // Appends without building any returned value (the stored parts are read with packed_state).
  void append_latent_only(const Array &latent, const Array &rope, const Array &index_keys = Array()) {
    check(latent_cache_append_latent(get(), latent.get(), rope.get(), index_keys.get(), nullptr, nullptr, nullptr));
  }

  State append_latent_padded(const std::vector<size_t> &left_pad, const Array &latent, const Array &rope,
                             const Array &index_keys = Array()) {
    State s;
    mlx_array l{nullptr}, r{nullptr}, k{nullptr};
    check(latent_cache_append_latent_padded(get(), left_pad.data(), left_pad.size(), latent.get(), rope.get(),
                                            index_keys.get(), &l, &r, &k));
    s.latent = Array(l), s.rope = Array(r), s.index_keys = Array(k);
    return s;
  }

  Array stored_index_keys() const {
    mlx_array raw{nullptr};
    check(latent_cache_stored_index_keys(get(), &raw));
    return Array(raw);
  }

  State state() const {
    State s;
    mlx_array l{nullptr}, r{nullptr}, k{nullptr};
    check(latent_cache_state(get(), &l, &r, &k));
    s.latent = Array(l), s.rope = Array(r), s.index_keys = Array(k);
    return s;
  }

  void save(const std::string &path) const { check(latent_cache_save(get(), path.c_str())); }
  static Cache load(const std::string &path) {
    latent_cache *raw = nullptr;
    check(latent_cache_load(path.c_str(), &raw));
    return Cache(raw);
  }

  Donor capture_donor_rows() const {
    latent_cache_donor *raw = nullptr;
    check(latent_cache_capture_donor_rows(get(), &raw));
    return Donor(raw);
  }

  Packed packed_state(latent_cache_family family) const {
    Packed p;
    check(latent_cache_packed_state(get(), static_cast<uint32_t>(family), p.out()));
    return p;
  }

  // Rounds, trims, rows.
  void trim(size_t n, bool bypass = false) { check(latent_cache_trim(get(), n, bypass)); }
  void reset() { check(latent_cache_reset(get())); }
  void reserve(size_t tokens) { check(latent_cache_reserve(get(), tokens)); }
  void spec_round_begin() { check(latent_cache_spec_round_begin(get())); }
  void spec_round_commit() { check(latent_cache_spec_round_commit(get())); }
  void spec_round_rollback(size_t keep) { check(latent_cache_spec_round_rollback(get(), keep)); }
  void spec_round_rollback(const std::vector<size_t> &keep) {
    check(latent_cache_spec_round_rollback_rows(get(), keep.data(), keep.size()));
  }
  void filter_rows(const std::vector<size_t> &rows) { check(latent_cache_filter_rows(get(), rows.data(), rows.size())); }
  // A padded batched prefill; an empty vector is "absent", the others give one entry per row.
  void prefill_prepare(const std::vector<size_t> &lengths, const std::vector<size_t> &left_padding,
                       const std::vector<size_t> &right_padding) {
    size_t rows = std::max({lengths.size(), left_padding.size(), right_padding.size()});
    check(latent_cache_prefill_prepare(get(), detail::or_null(lengths, rows), detail::or_null(left_padding, rows),
                                       detail::or_null(right_padding, rows), rows));
  }
  void prefill_finalize() { check(latent_cache_prefill_finalize(get())); }
  // Prefill maintenance (composed storage): boundaries wait until prefill_end; prefill_commit
  // fixes the listed rows at their prompt end.
  void prefill_begin() { check(latent_cache_prefill_begin(get())); }
  void prefill_commit(const std::vector<size_t> &rows) {
    check(latent_cache_prefill_commit(get(), rows.data(), rows.size()));
  }
  void prefill_end() { check(latent_cache_prefill_end(get())); }
  // Every row of `sources` after this cache's rows, in order (an empty cache is filled; rows
  // joining a running batch take free slots, see reserve_rows).
  void reserve_rows(size_t rows) { check(latent_cache_reserve_rows(get(), rows)); }
  void shrink_rows() { check(latent_cache_shrink_rows(get())); }
  void merge_rows(const std::vector<const Cache *> &sources) {
    std::vector<const latent_cache *> raw;
    raw.reserve(sources.size());
    for (const Cache *c : sources) raw.push_back(c->get());
    check(latent_cache_merge_rows(get(), raw.data(), raw.size()));
  }
  Cache extract_row(size_t row) const {
    latent_cache *raw = nullptr;
    check(latent_cache_extract_row(get(), row, &raw));
    return Cache(raw);
  }

  // Queries.
  std::vector<size_t> row_offsets() const { return rows(latent_cache_row_offsets); }
  std::vector<size_t> left_pad() const { return rows(latent_cache_left_pad); }
  std::vector<size_t> row_ends() const { return rows(latent_cache_row_ends); }
  size_t offset() const { return size(latent_cache_offset); }
  size_t batch_size() const { return size(latent_cache_batch_size); }
  size_t kv_lora_rank() const { return size(latent_cache_kv_lora_rank); }
  size_t rope_head_dim() const { return size(latent_cache_rope_head_dim); }
  size_t index_head_dim() const { return size(latent_cache_index_head_dim); }
  size_t bytes_per_token() const { return size(latent_cache_bytes_per_token); }
  size_t max_append_tokens() const { return size(latent_cache_max_append_tokens); }
  size_t minimum_reusable_offset() const { return size(latent_cache_minimum_reusable_offset); }
  // Each row's count of positions read in the compact mode (empty unless storage is composed).
  std::vector<size_t> converted_positions() const {
    std::vector<size_t> out(batch_size());
    size_t written = 0;
    check(latent_cache_converted_positions(get(), out.data(), out.size(), &written));
    out.resize(written);
    return out;
  }
  latent_cache_config config() const {
    latent_cache_config out = latent_cache_config_default();
    check(latent_cache_get_config(get(), &out));
    return out;
  }
  bool is_trimmable() const { return flag(latent_cache_is_trimmable); }
  bool in_spec_round() const { return flag(latent_cache_in_spec_round); }
  std::string signature() const {
    // A too-small buffer writes nothing, so grow until the string and its NUL fit.
    for (size_t size = 128;; size *= 2) {
      std::string out(size, '\0');
      size_t written = 0;
      latent_cache_status status = latent_cache_signature(get(), out.data(), out.size(), &written);
      if (status == LATENT_CACHE_STATUS_BUFFER_TOO_SMALL && size < (1u << 20)) continue;
      check(status);
      out.resize(written);  // the count excludes the NUL
      return out;
    }
  }

 private:
  explicit Cache(latent_cache *raw) : handle_(raw) {}

  static const float *keys(const std::vector<float> &index_keys) {
    return index_keys.empty() ? nullptr : index_keys.data();
  }

  size_t width(latent_cache_family family) const {
    switch (family) {
      case LATENT_CACHE_FAMILY_LATENT: return kv_lora_rank();
      case LATENT_CACHE_FAMILY_ROPE: return rope_head_dim();
      default: return index_head_dim();
    }
  }

  using RowQuery = latent_cache_status (*)(const latent_cache *, size_t *, size_t, size_t *);
  std::vector<size_t> rows(RowQuery query) const {
    std::vector<size_t> out(batch_size());
    size_t written = 0;
    check(query(get(), out.data(), out.size(), &written));
    return out;
  }

  using SizeQuery = latent_cache_status (*)(const latent_cache *, size_t *);
  size_t size(SizeQuery query) const {
    size_t out = 0;
    check(query(get(), &out));
    return out;
  }

  using FlagQuery = latent_cache_status (*)(const latent_cache *, bool *);
  bool flag(FlagQuery query) const {
    bool out = false;
    check(query(get(), &out));
    return out;
  }

  struct Free {
    void operator()(latent_cache *cache) const noexcept { latent_cache_free(cache); }
  };
  std::unique_ptr<latent_cache, Free> handle_;
};

// A model's caches as one handle (latent_cache_set). Movable, not copyable; frees the set (and
// with it every layer) when destroyed. Set-wide calls change every layer or none.
class Set {
 public:
  explicit Set(const std::vector<latent_cache_config> &layers) {
    latent_cache_set *raw = nullptr;
    check(latent_cache_set_new(layers.data(), layers.size(), &raw));
    handle_.reset(raw);
  }

  // GLM-5.2's 78 layers and its MTP layer (latent_cache_glm52_configs), to edit before use.
  static std::vector<latent_cache_config> glm52_configs() {
    std::vector<latent_cache_config> out(79, latent_cache_config_default());
    size_t written = 0;
    check(latent_cache_glm52_configs(out.data(), out.size(), &written));
    out.resize(written);
    return out;
  }

  latent_cache_set *get() const noexcept { return handle_.get(); }

  size_t layer_count() const {
    size_t out = 0;
    check(latent_cache_set_layer_count(get(), &out));
    return out;
  }
  // Layer i's cache, lent: valid while the set lives; never free it.
  latent_cache *layer(size_t i) const {
    latent_cache *out = nullptr;
    check(latent_cache_set_layer(get(), i, &out));
    return out;
  }

  void trim(size_t n, bool bypass = false) { check(latent_cache_set_trim(get(), n, bypass)); }
  void reset() { check(latent_cache_set_reset(get())); }
  void reserve(size_t tokens) { check(latent_cache_set_reserve(get(), tokens)); }
  void reserve_rows(size_t rows) { check(latent_cache_set_reserve_rows(get(), rows)); }
  void shrink_rows() { check(latent_cache_set_shrink_rows(get())); }
  void spec_round_begin() { check(latent_cache_set_spec_round_begin(get())); }
  void spec_round_commit() { check(latent_cache_set_spec_round_commit(get())); }
  void spec_round_rollback(size_t keep) { check(latent_cache_set_spec_round_rollback(get(), keep)); }
  void spec_round_rollback(const std::vector<size_t> &keep) {
    check(latent_cache_set_spec_round_rollback_rows(get(), keep.data(), keep.size()));
  }
  void filter_rows(const std::vector<size_t> &rows) {
    check(latent_cache_set_filter_rows(get(), rows.data(), rows.size()));
  }
  void prefill_prepare(const std::vector<size_t> &lengths, const std::vector<size_t> &left_padding,
                       const std::vector<size_t> &right_padding) {
    size_t rows = std::max({lengths.size(), left_padding.size(), right_padding.size()});
    check(latent_cache_set_prefill_prepare(get(), detail::or_null(lengths, rows),
                                           detail::or_null(left_padding, rows), detail::or_null(right_padding, rows),
                                           rows));
  }
  void prefill_finalize() { check(latent_cache_set_prefill_finalize(get())); }
  void prefill_begin() { check(latent_cache_set_prefill_begin(get())); }
  void prefill_commit(const std::vector<size_t> &rows) {
    check(latent_cache_set_prefill_commit(get(), rows.data(), rows.size()));
  }
  void prefill_end() { check(latent_cache_set_prefill_end(get())); }
  void merge_rows(const std::vector<const Set *> &sources) {
    std::vector<const latent_cache_set *> raw;
    raw.reserve(sources.size());
    for (const Set *s : sources) raw.push_back(s->get());
    check(latent_cache_set_merge_rows(get(), raw.data(), raw.size()));
  }
  Set extract_row(size_t row) const {
    latent_cache_set *raw = nullptr;
    check(latent_cache_set_extract_row(get(), row, &raw));
    return Set(raw);
  }
  size_t bytes_in_use() const {
    size_t out = 0;
    check(latent_cache_set_bytes_in_use(get(), &out));
    return out;
  }

  // Saving and loading (latent_cache_set_save / _load, and to and from bytes).
  void save(const std::string &path) const { check(latent_cache_set_save(get(), path.c_str())); }
  static Set load(const std::string &path) {
    latent_cache_set *raw = nullptr;
    check(latent_cache_set_load(path.c_str(), &raw));
    return Set(raw);
  }
  std::vector<uint8_t> save_to_buffer() const {
    uint8_t *data = nullptr;
    size_t len = 0;
    check(latent_cache_set_save_to_buffer(get(), &data, &len));
    std::vector<uint8_t> out(data, data + len);
    latent_cache_bytes_free(data, len);
    return out;
  }
  static Set load_from_buffer(const std::vector<uint8_t> &bytes) {
    latent_cache_set *raw = nullptr;
    check(latent_cache_set_load_from_buffer(bytes.data(), bytes.size(), &raw));
    return Set(raw);
  }

  // The seed's (mlx-bun's) prompt-cache files: float32 layers whose rows all hold one length.
  void save_mlxbun(const std::string &path, const std::vector<uint32_t> &tokens,
                   const latent_cache_mlxbun_info &identity = latent_cache_mlxbun_info{}) const {
    latent_cache_mlxbun_info info = identity;
    info.tokens = tokens.data();
    info.tokens_len = tokens.size();
    check(latent_cache_set_save_mlxbun(get(), path.c_str(), &info));
  }
  // The same in the seed's block layout (format version 5): a manifest at `path`, the tensors'
  // blocks of `block_bytes` (0: 1 MiB) in blocks/ beside it, blocks already there reused.
  void save_mlxbun_blocks(const std::string &path, const std::vector<uint32_t> &tokens, size_t block_bytes = 0,
                          const latent_cache_mlxbun_info &identity = latent_cache_mlxbun_info{}) const {
    latent_cache_mlxbun_info info = identity;
    info.tokens = tokens.data();
    info.tokens_len = tokens.size();
    check(latent_cache_set_save_mlxbun_blocks(get(), path.c_str(), &info, block_bytes));
  }
  static Set load_mlxbun(const std::string &path) {
    latent_cache_set *raw = nullptr;
    check(latent_cache_set_load_mlxbun(path.c_str(), &raw));
    return Set(raw);
  }
  static std::vector<uint32_t> mlxbun_tokens(const std::string &path) {
    size_t written = 0;
    std::vector<uint32_t> out(1024);
    while (true) {
      latent_cache_status status = latent_cache_mlxbun_tokens(path.c_str(), out.data(), out.size(), &written);
      if (status != LATENT_CACHE_STATUS_BUFFER_TOO_SMALL) {
        check(status);
        break;
      }
      out.resize(out.size() * 4);
    }
    out.resize(written);
    return out;
  }

 private:
  explicit Set(latent_cache_set *raw) : handle_(raw) {}
  struct Free {
    void operator()(latent_cache_set *set) const noexcept { latent_cache_set_free(set); }
  };
  std::unique_ptr<latent_cache_set, Free> handle_;
};

// The prefix store (latent_cache_store_*): the longest stored prefix of a token sequence,
// restored into an empty set or lent below its rows, from RAM and an SSD folder within byte
// budgets. Move-only; freed (after the writes already handed to its writer) when it goes.
class Store {
 public:
  struct Options {
    std::string folder;  // empty: RAM only
    size_t block_tokens = 256;
    uint64_t ram_bytes = 0;
    uint64_t ssd_bytes = 0;
  };
  explicit Store(const Options &o) {
    latent_cache_store *raw = nullptr;
    check(latent_cache_store_open(o.folder.empty() ? nullptr : o.folder.c_str(), o.block_tokens, o.ram_bytes,
                                  o.ssd_bytes, &raw));
    handle_.reset(raw);
  }
  latent_cache_store *get() const noexcept { return handle_.get(); }

  // Blocks newly stored.
  size_t put(const Set &set, size_t row, const std::string &ns, const std::vector<uint32_t> &tokens) {
    size_t stored = 0;
    check(latent_cache_store_put(get(), set.get(), row, bytes(ns), ns.size(), tokens.data(), tokens.size(), &stored));
    return stored;
  }
  // Positions of the longest stored prefix (no file read).
  size_t lookup(const Set &set, const std::string &ns, const std::vector<uint32_t> &tokens) {
    size_t out = 0;
    check(latent_cache_store_lookup(get(), set.get(), bytes(ns), ns.size(), tokens.data(), tokens.size(), &out));
    return out;
  }
  // Positions restored into the (empty) set's one row.
  size_t restore(const Set &set, const std::string &ns, const std::vector<uint32_t> &tokens) {
    size_t out = 0;
    check(latent_cache_store_restore(get(), set.get(), bytes(ns), ns.size(), tokens.data(), tokens.size(), &out));
    return out;
  }
  // Positions lent below `rows` empty rows of the (empty) set.
  size_t attach(const Set &set, const std::string &ns, const std::vector<uint32_t> &tokens, size_t rows) {
    size_t out = 0;
    check(latent_cache_store_attach(get(), set.get(), bytes(ns), ns.size(), tokens.data(), tokens.size(), rows, &out));
    return out;
  }
  void sync() { check(latent_cache_store_sync(get())); }
  size_t refresh() {
    size_t out = 0;
    check(latent_cache_store_refresh(get(), &out));
    return out;
  }
  latent_cache_store_stats stats() const {
    latent_cache_store_stats out{};
    check(latent_cache_store_info(get(), &out));
    return out;
  }

 private:
  static const uint8_t *bytes(const std::string &s) noexcept { return reinterpret_cast<const uint8_t *>(s.data()); }
  struct Free {
    void operator()(latent_cache_store *store) const noexcept { latent_cache_store_free(store); }
  };
  std::unique_ptr<latent_cache_store, Free> handle_;
};

}  // namespace latent_cache_cpp

#endif  // LATENT_CACHE_HPP
