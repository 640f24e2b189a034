// Fault injection for the crash-safety tests (docs/hacking.md, "Fault
// injection"). Private to the library: io.cpp calls it in every function that
// changes a file or directory.
#pragma once

namespace hfdelta {

// A write step: every call that changes a file or directory passes here
// first. For tests of crash safety, HFDELTA_FAULT_AT=N makes the N-th step
// fail: HFDELTA_FAULT_MODE=kill (default) kills the process with SIGKILL,
// =error throws an I/O error instead, =persist throws one at step N and at
// every step after it, =pause stops the process (SIGSTOP) at step N and, once
// it is continued, waits a while for a stop signal, =hold stops it at step N
// and lets it go on once continued (a test changes the files meanwhile: the
// second actor between a check and a commit). Unset, it costs one atomic
// increment. Every write step is also a safe point to stop at (check_stop).
void fault_point(const char* what);

}  // namespace hfdelta
