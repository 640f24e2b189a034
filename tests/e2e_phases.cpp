// End-to-end: delta-apply reports where its time went, phase by phase: the
// time before --then (lock, read, patch, sync: an engine still serves the old
// weights) apart from --then's (the engine's reload, its pause), in --json
// and in the text summary, per version for a pull. No upper bound on any
// time: only that each is there, non-negative, and that --then's covers the
// command's own sleep.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

const char* const kBefore[] = {"lock", "read", "patch", "sync"};

// The phases object's totals: present, numbers >= 0, before_then their sum.
void check_totals(const json& p) {
  INFO(p.dump());
  double sum = 0;
  for (const char* k : kBefore) {
    REQUIRE(p.contains(k));
    REQUIRE(p[k].is_number());
    CHECK(p[k].get<double>() >= 0);
    sum += p[k].get<double>();
  }
  REQUIRE(p["before_then"].is_number());
  CHECK(p["before_then"].get<double>() == doctest::Approx(sum).epsilon(1e-9));
  REQUIRE(p["versions"].is_array());
}

// A series of 4 saves, versions 1..3 published in ROOT, LOCAL at version 0.
struct Chain {
  TempDir t;
  fs::path series = gen_series(t / "series", 4);
  fs::path root = t / "root";
  fs::path local = t / "local";
  Chain() {
    fs::create_directories(root);
    for (int v = 1; v <= 3; ++v)
      E2E_REQUIRE_CODE(diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), root.string()}), 0);
    require_init(save_dir(series, 0), local);
  }
};

}  // namespace

TEST_CASE("phases: a pull's --json has each phase, --then's time apart, each version's share") {
  Chain c;
  const RunResult r = apply({"--json", "--root", c.root.string(), c.local.string(), "--then", "sleep 0.3"});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  const json& p = j["phases"];
  check_totals(p);
  REQUIRE(p["then"].is_number());
  CHECK(p["then"].get<double>() >= 0.3);  // the command's sleep, counted apart from the apply
  REQUIRE(p["versions"].size() == 3);
  for (int v = 1; v <= 3; ++v) {
    const json& e = p["versions"][v - 1];
    CHECK(e["version"] == v6(v));
    CHECK(e["full"] == false);
    double own = 0;
    for (const char* k : {"read", "patch", "sync"}) {
      REQUIRE(e[k].is_number());
      CHECK(e[k].get<double>() >= 0);
      own += e[k].get<double>();
    }
    CHECK(own <= p["before_then"].get<double>() + 1e-9);  // a share of the totals
  }
  CHECK(p["patch"].get<double>() > 0);  // three versions were written
}

TEST_CASE("phases: one delta applied by hand, a full version, --init, a no-op") {
  Chain c;
  SUBCASE("DELTA LOCAL with --then") {
    const RunResult r = apply({"--json", "--then", "sleep 0.3", version_dir(c.root, 1).string(), c.local.string()});
    E2E_REQUIRE_CODE(r, 0);
    const json p = parse_json(r.out)["phases"];
    check_totals(p);
    CHECK(p["then"].get<double>() >= 0.3);
    REQUIRE(p["versions"].size() == 1);
    CHECK(p["versions"][0]["version"] == v6(1));
  }
  SUBCASE("--init: the copy is a full version's, no --then: then is null") {
    const RunResult r =
        apply({"--json", "--init", save_dir(c.series, 1).string(), (c.t / "other").string(), "--init-version", "1"});
    E2E_REQUIRE_CODE(r, 0);
    const json p = parse_json(r.out)["phases"];
    check_totals(p);
    CHECK(p["then"].is_null());
    REQUIRE(p["versions"].size() == 1);
    CHECK(p["versions"][0]["full"] == true);
  }
  SUBCASE("a no-op pull: no version's share, --then still timed") {
    E2E_REQUIRE_CODE(apply({"-q", "--root", c.root.string(), c.local.string()}), 0);
    const RunResult r = apply({"--json", "--root", c.root.string(), c.local.string(), "--then", "sleep 0.3"});
    E2E_REQUIRE_CODE(r, 0);
    const json j = parse_json(r.out);
    CHECK(j["noop"] == true);
    check_totals(j["phases"]);
    CHECK(j["phases"]["versions"].empty());
    CHECK(j["phases"]["then"].get<double>() >= 0.3);
  }
  SUBCASE("a failed --then (exit 9): its time is reported with the error") {
    const RunResult r = apply({"--json", "--root", c.root.string(), c.local.string(), "--then", "sleep 0.3; exit 1"});
    E2E_REQUIRE_CODE(r, 9);
    const json j = parse_json(r.out);
    CHECK(j["ok"] == false);
    check_totals(j["phases"]);
    CHECK(j["phases"]["then"].get<double>() >= 0.3);
  }
}

TEST_CASE("phases: the text summary names them, --then's time apart, one line per version of a pull") {
  Chain c;
  const RunResult r = apply({"--root", c.root.string(), c.local.string(), "--then", "sleep 0.3"});
  E2E_REQUIRE_CODE(r, 0);
  INFO(r.describe());
  CHECK(contains(r.out, "phases: lock "));
  for (const char* k : {", read ", ", patch ", ", sync "}) CHECK(contains(r.out, k));
  const std::size_t at = r.out.find(" s before --then; then ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(r.out.substr(at + std::strlen(" s before --then; then "))) >= 0.3);
  for (int v = 1; v <= 3; ++v) CHECK(contains(r.out, "  version " + v6(v) + " (delta): read "));
  const RunResult quiet = apply({"-q", "--root", c.root.string(), c.local.string(), "--then", "true"});
  E2E_CHECK_CODE(quiet, 0);
  CHECK(quiet.out.empty());
}
