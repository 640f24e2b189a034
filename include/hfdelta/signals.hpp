// Stopping on SIGINT, SIGTERM and SIGHUP at a safe point.
//
// A handler may do almost nothing safely, and a write cut anywhere would
// leave a half-written journal or a temporary directory. So the signals are
// only recorded, by a thread that waits for them, and the work checks for
// them where an error may already happen: at every write step and at every
// unit of a parallel loop. The first check after a signal throws
// Error(128 + N), which unwinds through the ordinary failure paths:
// delta-diff removes its temporary directory, delta-apply rolls back.
#pragma once

#include <signal.h>

namespace hfdelta {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread, and so in every
// thread it starts afterwards (call it first in main), and starts the thread
// that records them. Without it, the signals act as usual.
void handle_stop_signals();

// Throws Error(Exit(128 + N), "interrupted by SIGNAME") once, the first time
// it is called after signal N arrived, unless a StopDeferred is alive.
void check_stop();

// The signal that arrived (0: none).
int stop_signal();

// "SIGINT", "SIGTERM", "SIGHUP" (else "a signal").
const char* stop_signal_name(int sig);

// While one is alive (in any thread), check_stop does not throw: a rollback
// or the cleanup after a commit runs to its end.
class StopDeferred {
 public:
  StopDeferred();
  ~StopDeferred();
  StopDeferred(const StopDeferred&) = delete;
  StopDeferred& operator=(const StopDeferred&) = delete;
};

// The signal mask a child process should start with: none blocked (the
// --then command must stop on Ctrl-C like any other).
sigset_t unblocked_mask();

}  // namespace hfdelta
