// How far the current long operation is, for a command to show (whether and
// how is the command's choice: nothing is printed here). Worker threads add
// to it with relaxed atomics, once per unit of work (a tensor, a chunk range,
// a file), so keeping count costs nothing measurable.
#pragma once

#include <cstdint>

namespace hfdelta::progress {

// A new phase: `what` (a static string: "diff", "apply", "copy", "hash",
// "squash") of `total` units, bytes unless `bytes` is false (entries).
void begin(const char* what, std::uint64_t total, bool bytes = true);
void add(std::uint64_t n);

struct Snapshot {
  const char* what = nullptr;  // none: no phase begun yet
  std::uint64_t done = 0, total = 0;
  bool bytes = true;
  std::uint64_t phase = 0;  // changes with every begin()
};
Snapshot snapshot();

}  // namespace hfdelta::progress
