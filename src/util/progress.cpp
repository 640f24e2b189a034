#include "hfdelta/progress.hpp"

#include <atomic>

namespace hfdelta::progress {

namespace {
std::atomic<const char*> g_what{nullptr};
std::atomic<std::uint64_t> g_done{0}, g_total{0}, g_phase{0};
std::atomic<bool> g_bytes{true};
}  // namespace

void begin(const char* what, std::uint64_t total, bool bytes) {
  g_done.store(0, std::memory_order_relaxed);
  g_total.store(total, std::memory_order_relaxed);
  g_bytes.store(bytes, std::memory_order_relaxed);
  g_what.store(what, std::memory_order_relaxed);
  g_phase.fetch_add(1, std::memory_order_release);
}

void add(std::uint64_t n) { g_done.fetch_add(n, std::memory_order_relaxed); }

Snapshot snapshot() {
  Snapshot s;
  s.phase = g_phase.load(std::memory_order_acquire);
  s.what = g_what.load(std::memory_order_relaxed);
  s.done = g_done.load(std::memory_order_relaxed);
  s.total = g_total.load(std::memory_order_relaxed);
  s.bytes = g_bytes.load(std::memory_order_relaxed);
  return s;
}

}  // namespace hfdelta::progress
