// PhaseClock (apply/phase_clock.hpp): an operation's wall time split into
// phases that add up to the whole, each version's share, the thread's
// current clock.
#include <chrono>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "apply/phase_clock.hpp"

using namespace hfdelta;

namespace {

void nap() { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

}  // namespace

TEST_CASE("PhaseClock: the phases add up, each version gets its share, then ends the version") {
  const auto t0 = std::chrono::steady_clock::now();
  PhaseTimes t;
  std::vector<VersionPhases> v;
  {
    PhaseClock clock;
    nap();                     // lock
    enter_phase(Phase::read);  // the marks reach the thread's current clock
    nap();                     // a pull's own read: totals only
    begin_version_phases(1, false);
    nap();
    enter_phase(Phase::patch);
    nap();
    enter_phase(Phase::sync);
    nap();
    begin_version_phases(2, true);
    nap();
    drop_version_phases();  // version 2 refused: its time stays in the totals
    begin_version_phases(3, false);
    enter_phase(Phase::patch);
    nap();
    enter_phase(Phase::then);
    nap();
    clock.stop(t, v);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(t.then);
  CHECK(t.lock >= 0.02);
  CHECK(t.read >= 0.06);  // the pull's own, version 1's and dropped version 2's
  CHECK(t.patch >= 0.04);
  CHECK(t.sync >= 0.02);
  CHECK(*t.then >= 0.02);
  CHECK(t.before_then() + *t.then <= wall);
  REQUIRE(v.size() == 2);
  CHECK((v[0].version == 1 && !v[0].full && v[1].version == 3));
  CHECK(v[0].read >= 0.02);
  CHECK(v[0].patch >= 0.02);
  CHECK(v[0].sync >= 0.02);
  CHECK(v[1].patch >= 0.02);
  CHECK(v[1].sync == 0);  // then ended it: the hook counts for no version
  CHECK(v[0].read + v[1].read < t.read);
}

TEST_CASE("PhaseClock: marks without a clock do nothing; a clock ends as the thread's current one") {
  enter_phase(Phase::patch);  // none current: no effect, no crash
  begin_version_phases(1, false);
  drop_version_phases();
  PhaseTimes outer_t;
  std::vector<VersionPhases> outer_v;
  PhaseClock outer;
  {
    PhaseClock inner;
    begin_version_phases(7, false);  // the inner clock's
    PhaseTimes t;
    std::vector<VersionPhases> v;
    inner.stop(t, v);
    CHECK(v.size() == 1);
  }
  begin_version_phases(8, false);  // the outer one's again
  outer.stop(outer_t, outer_v);
  REQUIRE(outer_v.size() == 1);
  CHECK(outer_v[0].version == 8);
  CHECK_FALSE(outer_t.then);
}
