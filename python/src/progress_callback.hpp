// A Python progress callback fed from hfdelta::progress while a call runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include <nanobind/nanobind.h>

namespace hfdelta::python {

// Calls `callback(phase, done, total)` from a thread of its own about every
// 0.2 s while it lives, whenever a phase begun during its life has moved, and
// once more when it stops. Construct it and let it die with the GIL released
// (after nb::gil_scoped_release, so that it is destroyed first): each call
// takes the GIL. A callback that raises is not called again; its exception
// goes to sys.unraisablehook (printed, by default) and the operation goes on.
// `callback` may be None (nothing is started); the caller keeps it alive.
class ProgressCallback {
 public:
  explicit ProgressCallback(nanobind::handle callback);
  ~ProgressCallback();
  ProgressCallback(const ProgressCallback&) = delete;
  ProgressCallback& operator=(const ProgressCallback&) = delete;

 private:
  void loop();
  bool report();  // false once the callback raised

  PyObject* callback_ = nullptr;  // borrowed
  std::uint64_t start_phase_ = 0;
  std::uint64_t last_phase_ = 0, last_done_ = 0;
  bool reported_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hfdelta::python
