#include "hfdelta/signals.hpp"

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "hfdelta/error.hpp"

namespace hfdelta {

namespace {

std::atomic<int> g_signal{0};       // the first signal recorded
std::atomic<bool> g_thrown{false};  // check_stop has thrown for it
std::atomic<int> g_deferred{0};     // StopDeferred objects alive

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&s, sig);
  return s;
}

}  // namespace

void handle_stop_signals() {
  const sigset_t set = stop_set();
  if (const int e = pthread_sigmask(SIG_BLOCK, &set, nullptr); e != 0)
    fail(Exit::failure, std::string("pthread_sigmask: ") + std::strerror(e));
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      int none = 0;
      g_signal.compare_exchange_strong(none, sig);  // later signals change nothing: SIGKILL forces
    }
  }).detach();
}

void check_stop() {
  const int sig = g_signal.load(std::memory_order_relaxed);
  if (sig == 0 || g_deferred.load() > 0 || g_thrown.exchange(true)) return;
  fail(static_cast<Exit>(128 + sig), std::string("interrupted by ") + stop_signal_name(sig));
}

const char* stop_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
}

int stop_signal() { return g_signal.load(); }

StopDeferred::StopDeferred() { g_deferred.fetch_add(1); }
StopDeferred::~StopDeferred() { g_deferred.fetch_sub(1); }

sigset_t unblocked_mask() {
  sigset_t s;
  sigemptyset(&s);
  return s;
}

}  // namespace hfdelta
