// Parallel loop over independent units (tensors, files) that carries the
// first exception out of the OpenMP region, where it may not propagate itself;
// and the rule that cuts a large tensor's chunks into units of their own.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

#include "hfdelta/signals.hpp"

namespace hfdelta {

inline int default_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

// Runs body(i, thread) for i in [0, n), largest units first if the caller
// sorted them so; after the first error the remaining units are skipped.
template <class F>
void parallel_for(std::size_t n, int threads, F&& body) {
  std::exception_ptr error;
  std::mutex mu;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::size_t i = 0; i < n; ++i) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (error) continue;
    }
    try {
      check_stop();  // each unit is a safe point to stop at
      body(i, static_cast<std::size_t>(omp_get_thread_num()));
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Chunks [c0, c1) of a tensor, worked on as one unit; `bytes` for scheduling.
struct ChunkRange {
  std::uint64_t c0 = 0, c1 = 0;
  std::uint64_t bytes = 0;
};

// A tensor of `nbytes` in `chunks` chunks of `chunk_bytes`, out of `total`
// bytes of work for `threads`: cut into ranges of about a quarter of a
// thread's share of its chunks when it is larger than that share, so that it
// does not keep the other cores waiting. Empty: not worth cutting.
inline std::vector<ChunkRange> split_chunk_ranges(std::uint64_t nbytes, std::uint64_t chunks, std::uint64_t chunk_bytes,
                                                  std::uint64_t total, int threads) {
  std::vector<ChunkRange> ranges;
  if (threads <= 1 || chunks < 2 || nbytes <= total / static_cast<std::uint64_t>(threads)) return ranges;
  const std::uint64_t per = std::max<std::uint64_t>(1, chunks / (4 * static_cast<std::uint64_t>(threads)));
  for (std::uint64_t c0 = 0; c0 < chunks; c0 += per) {
    const std::uint64_t c1 = std::min(chunks, c0 + per);
    ranges.push_back({c0, c1, std::min(nbytes, c1 * chunk_bytes) - c0 * chunk_bytes});
  }
  return ranges;
}

}  // namespace hfdelta
