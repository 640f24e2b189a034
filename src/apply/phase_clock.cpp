#include "apply/phase_clock.hpp"

namespace hfdelta {

namespace {
thread_local PhaseClock* t_current = nullptr;
}  // namespace

PhaseClock::PhaseClock() : since_(Clock::now()), outer_(t_current) { t_current = this; }

PhaseClock::~PhaseClock() { t_current = outer_; }

void PhaseClock::enter(Phase p) {
  const auto now = Clock::now();
  const double s = std::chrono::duration<double>(now - since_).count();
  since_ = now;
  VersionPhases* v = in_version_ ? &versions_.back() : nullptr;
  switch (phase_) {
    case Phase::lock:
      totals_.lock += s;
      break;
    case Phase::read:
      totals_.read += s;
      if (v) v->read += s;
      break;
    case Phase::patch:
      totals_.patch += s;
      if (v) v->patch += s;
      break;
    case Phase::sync:
      totals_.sync += s;
      if (v) v->sync += s;
      break;
    case Phase::then:
      totals_.then = totals_.then.value_or(0) + s;
      break;
  }
  phase_ = p;
  if (p == Phase::then) in_version_ = false;
}

void PhaseClock::begin_version(std::uint64_t version, bool full) {
  enter(Phase::read);
  versions_.push_back({version, full, 0, 0, 0});
  in_version_ = true;
}

void PhaseClock::drop_version() {
  if (!in_version_) return;
  enter(phase_);  // the time so far stays in the totals
  versions_.pop_back();
  in_version_ = false;
}

void PhaseClock::stop(PhaseTimes& totals, std::vector<VersionPhases>& versions) {
  enter(phase_);
  totals = totals_;
  versions = versions_;
}

void enter_phase(Phase p) {
  if (t_current) t_current->enter(p);
}

void begin_version_phases(std::uint64_t version, bool full) {
  if (t_current) t_current->begin_version(version, full);
}

void drop_version_phases() {
  if (t_current) t_current->drop_version();
}

}  // namespace hfdelta
