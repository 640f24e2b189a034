// The rules of the front-ends' options (hfdelta/option_rules.hpp), which the
// CLI and the Python package both check their options by.
#include <limits>
#include <string>

#include <doctest/doctest.h>

#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/option_rules.hpp"
#include "hfdelta/version.hpp"
#include "unit_util.hpp"

using namespace hfdelta;

TEST_CASE("option rules: bounds and their messages") {
  CHECK(level_problem(kMinLevel).empty());
  CHECK(level_problem(kMaxLevel).empty());
  CHECK(level_problem(0) == "must be 1 to 19, not 0");
  CHECK(level_problem(20) == "must be 1 to 19, not 20");
  CHECK(threads_problem(0).empty());
  CHECK(threads_problem(-1) == "must be 0 (all cores) or more, not -1");
  CHECK(lock_timeout_problem(0, "x").empty());
  CHECK(lock_timeout_problem(-0.5, "None: wait") == "must be a number of seconds >= 0 (None: wait), not -0.5");
  CHECK(!lock_timeout_problem(std::numeric_limits<double>::quiet_NaN(), "x").empty());
  for (const std::string& n : encoding_names()) CHECK(encoding_problem(n).empty());
  CHECK(encoding_problem("stack") == "must be xor, overwrite, sparse, context or auto, not \"stack\"");
  CHECK(!encoding_option("auto"));
  CHECK(encoding_option("xor") == Encoding::xor_bytes);
  const auto e = unit::error_of([] { check_option("--level", level_problem(0)); });
  REQUIRE(e);
  CHECK(e->code() == Exit::usage);
  CHECK(std::string(e->what()) == "--level must be 1 to 19, not 0");
  CHECK(!unit::error_of([] { check_option("--level", level_problem(3)); }));
}

TEST_CASE("option rules: the versions of a delta") {
  DiffOptions d;
  PublishTarget t;
  t.version = 7;
  set_diff_versions(d, t, std::nullopt, "--base-version");
  CHECK(d.version == 7);
  CHECK(d.base_version == 6);
  t.newest = 4;  // a root whose newest version is 4 (5 and 6 withdrawn)
  t.root = "/r";
  set_diff_versions(d, t, std::nullopt, "--base-version");
  CHECK(d.base_version == 4);
  CHECK(d.root == "/r");
  set_diff_versions(d, t, 2, "--base-version");
  CHECK(d.base_version == 2);
  const auto high = unit::error_of([&] { set_diff_versions(d, t, 7, "base_version"); });
  REQUIRE(high);
  CHECK(std::string(high->what()) == "base_version must be lower than the version");
  t = {};
  const auto zero = unit::error_of([&] { set_diff_versions(d, t, std::nullopt, "--base-version"); });
  REQUIRE(zero);
  CHECK(zero->code() == Exit::usage);
  CHECK(std::string(zero->what()) == "version 0 has no base; give --base-version");
}
