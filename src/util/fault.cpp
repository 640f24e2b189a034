#include "util/fault.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "hfdelta/error.hpp"
#include "hfdelta/signals.hpp"

namespace hfdelta {

namespace {

struct FaultPlan {
  long long at = 0;  // 0: off
  bool kill = true;
  bool persist = false;  // every step from `at` on fails, as on a full or dying disk
  bool pause = false;    // the process stops itself at step `at`, for a test to signal it there
  bool hold = false;     // the same, for a test to change what it works on there; continued, it goes on
  FaultPlan() {
    if (const char* v = std::getenv("HFDELTA_FAULT_AT")) at = std::atoll(v);
    if (const char* m = std::getenv("HFDELTA_FAULT_MODE")) {
      persist = std::strcmp(m, "persist") == 0;
      pause = std::strcmp(m, "pause") == 0;
      hold = std::strcmp(m, "hold") == 0;
      kill = !persist && !pause && !hold && std::strcmp(m, "error") != 0;
    }
  }
};

// Stopped (SIGSTOP) until continued, then waits a while for the signal the
// test sends meanwhile to be recorded, so that it is seen at this very step.
void pause_for_signal() {
  ::raise(SIGSTOP);
  for (int i = 0; i < 1000 && stop_signal() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check_stop();
}

}  // namespace

void fault_point(const char* what) {
  check_stop();  // every write step is a safe point to stop at
  static const FaultPlan plan;
  static std::atomic<long long> steps{0};
  const long long n = steps.fetch_add(1, std::memory_order_relaxed) + 1;
  if (plan.at == 0 || n < plan.at || (n > plan.at && !plan.persist)) return;
  if (plan.pause) return pause_for_signal();
  if (plan.hold) {
    ::raise(SIGSTOP);
    return;
  }
  if (plan.kill) ::raise(SIGKILL);
  fail(Exit::failure, std::string("injected fault at write step ") + std::to_string(n) + " (" + what + ")");
}

}  // namespace hfdelta
