// latent_cache.hpp: a small C++17 RAII layer over latent_cache.h. Handles free themselves,
// failures throw latent_cache::Error carrying the status and the library's message, and reads
// return std::vector. Hand-written; the C header stays the source of truth.
#ifndef LATENT_CACHE_HPP
#define LATENT_CACHE_HPP

#include <memory>
#include <stdexcept>
#include <string>
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

// One layer's cache. Movable, not copyable; frees the handle when destroyed.
class Cache {
 public:
  explicit Cache(const latent_cache_config &config) {
    latent_cache *raw = nullptr;
    check(latent_cache_new(&config, &raw));
    handle_.reset(raw);
  }

  latent_cache *get() const noexcept { return handle_.get(); }

  void append(size_t batch, size_t tokens, const std::vector<float> &latent, const std::vector<float> &rope,
              const std::vector<float> &index_keys = {}) {
    check(latent_cache_append_host(get(), batch, tokens, latent.data(), latent.size(), rope.data(), rope.size(),
                                   index_keys.empty() ? nullptr : index_keys.data(), index_keys.size()));
  }

  std::vector<float> read_row(latent_cache_family family, size_t row) const {
    size_t width = 0, written = 0;
    switch (family) {
      case LATENT_CACHE_FAMILY_LATENT: check(latent_cache_kv_lora_rank(get(), &width)); break;
      case LATENT_CACHE_FAMILY_ROPE: check(latent_cache_rope_head_dim(get(), &width)); break;
      default: check(latent_cache_index_head_dim(get(), &width)); break;
    }
    std::vector<size_t> rows = row_offsets();
    std::vector<float> out(row < rows.size() ? rows[row] * width : 0);
    check(latent_cache_read_row_host(get(), static_cast<uint32_t>(family), row, out.data(), out.size(), &written));
    out.resize(written);
    return out;
  }

  std::vector<size_t> row_offsets() const { return rows(latent_cache_row_offsets); }
  std::vector<size_t> left_pad() const { return rows(latent_cache_left_pad); }

  size_t offset() const {
    size_t out = 0;
    check(latent_cache_offset(get(), &out));
    return out;
  }

  void trim(size_t n, bool bypass = false) { check(latent_cache_trim(get(), n, bypass)); }
  void spec_round_begin() { check(latent_cache_spec_round_begin(get())); }
  void spec_round_commit() { check(latent_cache_spec_round_commit(get())); }
  void spec_round_rollback(const std::vector<size_t> &keep) {
    check(latent_cache_spec_round_rollback_rows(get(), keep.data(), keep.size()));
  }

 private:
  using RowQuery = latent_cache_status (*)(const latent_cache *, size_t *, size_t, size_t *);

  std::vector<size_t> rows(RowQuery query) const {
    size_t batch = 0, written = 0;
    check(latent_cache_batch_size(get(), &batch));
    std::vector<size_t> out(batch);
    check(query(get(), out.data(), out.size(), &written));
    return out;
  }

  struct Free {
    void operator()(latent_cache *cache) const noexcept { latent_cache_free(cache); }
  };
  std::unique_ptr<latent_cache, Free> handle_;
};

}  // namespace latent_cache_cpp

#endif  // LATENT_CACHE_HPP
