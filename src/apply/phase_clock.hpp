// Splitting an operation's wall time into phases (hfdelta::PhaseTimes):
// every instant from the clock's start belongs to the phase entered last,
// so the phases add up to the whole. The passes deep inside an apply mark
// their phases through the calling thread's current clock, so no signature
// carries it; without one (a unit test calling a pass) a mark does nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "hfdelta/apply.hpp"

namespace hfdelta {

enum class Phase { lock, read, patch, sync, then };

class PhaseClock {
 public:
  PhaseClock();  // starts in Phase::lock, as this thread's current clock
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  void enter(Phase p);
  void begin_version(std::uint64_t version, bool full);  // enters Phase::read
  void drop_version();  // the version turned out a no-op: its time stays in the totals only
  // Ends the phase under way; the totals and each version's share.
  void stop(PhaseTimes& totals, std::vector<VersionPhases>& versions);

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point since_;
  Phase phase_ = Phase::lock;
  PhaseTimes totals_;
  std::vector<VersionPhases> versions_;
  bool in_version_ = false;  // versions_.back() is under way
  PhaseClock* outer_;        // the thread's clock before this one
};

// On this thread's current clock, if any. Phase::then also ends the
// version under way: the hook runs once for the whole operation.
void enter_phase(Phase p);
void begin_version_phases(std::uint64_t version, bool full);
void drop_version_phases();

}  // namespace hfdelta
