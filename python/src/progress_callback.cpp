#include "progress_callback.hpp"

#include <chrono>

#include "hfdelta/progress.hpp"

namespace nb = nanobind;

namespace hfdelta::python {

ProgressCallback::ProgressCallback(nb::handle callback) {
  if (!callback.is_valid() || callback.is_none()) return;
  callback_ = callback.ptr();
  start_phase_ = progress::snapshot().phase;  // a phase of an earlier call is not this one's
  thread_ = std::thread([this] { loop(); });
}

ProgressCallback::~ProgressCallback() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressCallback::loop() {
  std::unique_lock lock(mu_);
  bool alive = true;
  while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_; }))
    if (alive) {
      lock.unlock();
      alive = report();
      lock.lock();
    }
  lock.unlock();
  if (alive) report();  // where the call ended
}

bool ProgressCallback::report() {
  const progress::Snapshot s = progress::snapshot();
  if (!s.what || s.phase == start_phase_) return true;                           // nothing begun by this call yet
  if (reported_ && s.phase == last_phase_ && s.done == last_done_) return true;  // nothing moved
  reported_ = true, last_phase_ = s.phase, last_done_ = s.done;
  nb::gil_scoped_acquire gil;
  try {
    nb::handle{callback_}(s.what, s.done, s.total);
    return true;
  } catch (nb::python_error& e) {
    e.discard_as_unraisable(nb::handle{callback_});
    return false;
  }
}

}  // namespace hfdelta::python
