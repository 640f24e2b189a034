// Cleanup of what a scope made (a temporary file or directory, a
// transaction step, a descriptor) when that scope is left by an exception,
// which then goes on: the one form of `try { ... } catch (...) { cleanup;
// throw; }`.
#pragma once

#include <exception>
#include <utility>

namespace hfdelta {

// Runs `undo` when destroyed during unwinding from an exception thrown after
// it was made; never on a normal exit. `undo` runs in a destructor, so it
// must not throw: what it throws is swallowed (the exception under way is
// the one to report), as the cleanup of a failed step reports nothing.
template <class F>
class OnFailure {
 public:
  explicit OnFailure(F undo) : undo_(std::move(undo)), uncaught_(std::uncaught_exceptions()) {}
  ~OnFailure() {
    if (std::uncaught_exceptions() <= uncaught_) return;
    try {
      undo_();
    } catch (...) {}
  }
  OnFailure(const OnFailure&) = delete;
  OnFailure& operator=(const OnFailure&) = delete;

 private:
  F undo_;
  int uncaught_;
};

}  // namespace hfdelta
