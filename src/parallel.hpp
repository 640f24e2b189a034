// Parallel loop over independent units (tensors, files) that carries the
// first exception out of the OpenMP region, where it may not propagate itself.
#pragma once

#include <omp.h>

#include <cstddef>
#include <exception>
#include <mutex>

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

}  // namespace hfdelta
