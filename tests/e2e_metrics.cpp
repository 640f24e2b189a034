// End-to-end: delta-apply --metrics FILE, a Prometheus textfile for
// node_exporter's textfile collector. The file parses (a small parser here,
// not the library's: every sample's metric has # HELP and # TYPE before it,
// every value is a number, labels unescaped), its values are the --json
// object's, a failed run records its exit code and keeps the last success,
// and no temporary file is ever left beside it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "e2e_util.hpp"

using namespace e2e;

namespace {

// One sample: metric name, labels (unescaped), value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// `text` in the exposition format; REQUIREs that each sample's metric has
// # HELP and # TYPE lines before it and that its value is a number.
std::vector<Sample> parse_textfile(const std::string& text) {
  INFO(text);
  std::set<std::string> helped, typed;
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.rfind("# HELP ", 0) == 0) {
      helped.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      REQUIRE(rest.substr(rest.find(' ') + 1) == "gauge");
      typed.insert(rest.substr(0, rest.find(' ')));
      continue;
    }
    REQUIRE(line[0] != '#');
    Sample s;
    const std::size_t brace = line.find('{');
    REQUIRE(brace != std::string::npos);
    s.name = line.substr(0, brace);
    REQUIRE_MESSAGE(helped.count(s.name), s.name << " has no # HELP before it");
    REQUIRE_MESSAGE(typed.count(s.name), s.name << " has no # TYPE before it");
    std::size_t i = brace + 1;
    while (line[i] != '}') {  // name="value", ... with \\ \" \n escaped
      const std::size_t eq = line.find("=\"", i);
      REQUIRE(eq != std::string::npos);
      const std::string key = line.substr(i, eq - i);
      std::string value;
      for (i = eq + 2; line[i] != '"'; ++i) {
        if (line[i] == '\\') {
          ++i;
          value += line[i] == 'n' ? '\n' : line[i];
        } else {
          value += line[i];
        }
      }
      s.labels[key] = value;
      ++i;
      if (line[i] == ',') ++i;
    }
    REQUIRE(line[i + 1] == ' ');
    const std::string v = line.substr(i + 2);
    char* end = nullptr;
    s.value = std::strtod(v.c_str(), &end);
    REQUIRE_MESSAGE((!v.empty() && *end == '\0'), "not a number: " << line);
    out.push_back(s);
  }
  return out;
}

// The value of `name` (with phase=`phase` if given); none when absent.
std::optional<double> value_of(const std::vector<Sample>& s, const std::string& name, const std::string& phase = "") {
  for (const Sample& x : s)
    if (x.name == name && (phase.empty() || (x.labels.count("phase") && x.labels.at("phase") == phase))) return x.value;
  return std::nullopt;
}

std::vector<Sample> read_metrics(const fs::path& file) { return parse_textfile(read_file(file)); }

// Nothing but FILE in its directory: no temporary file left.
void check_alone(const fs::path& file) {
  CHECK(list_names(file.parent_path()) == std::vector<std::string>{file.filename().string()});
}

struct Chain {
  TempDir t;
  fs::path series = gen_series(t / "series", 3);
  fs::path root = t / "root";
  fs::path local = t / "local \"q\" \\ b";  // a label value to escape
  fs::path metrics = t / "textfile" / "hfdelta-model.prom";
  Chain() {
    fs::create_directories(root);
    fs::create_directories(metrics.parent_path());
    for (int v = 1; v <= 3; ++v)
      E2E_REQUIRE_CODE(diff({"-q", save_dir(series, v - 1).string(), save_dir(series, v).string(), root.string()}), 0);
    require_init(save_dir(series, 0), local);
  }
};

}  // namespace

TEST_CASE("metrics: a pull's textfile parses and holds the --json values, LOCAL's label escaped") {
  Chain c;
  const RunResult r = apply({"--json", "--root", c.root.string(), "--target", "2", c.local.string(), "--metrics",
                             c.metrics.string(), "--then", "sleep 0.3"});
  E2E_REQUIRE_CODE(r, 0);
  const json j = parse_json(r.out);
  const std::vector<Sample> s = read_metrics(c.metrics);
  for (const Sample& x : s) CHECK(x.labels.at("local") == fs::absolute(c.local).string());
  CHECK(value_of(s, "hfdelta_version_held") == 2);
  CHECK(j["behind_complete"] == 1);
  CHECK(value_of(s, "hfdelta_versions_behind") == j["behind_complete"].get<double>());
  CHECK(value_of(s, "hfdelta_last_exit_code") == 0);
  CHECK(value_of(s, "hfdelta_last_run_versions_applied") == 2);
  CHECK(value_of(s, "hfdelta_last_run_delta_bytes") == j["delta_bytes"].get<double>());
  CHECK(value_of(s, "hfdelta_last_run_root_bytes") == j["root_bytes"].get<double>());
  const auto success = value_of(s, "hfdelta_last_success_timestamp_seconds");
  REQUIRE(success);
  CHECK(*success == value_of(s, "hfdelta_last_run_timestamp_seconds"));
  CHECK(std::fabs(*success - double(std::time(nullptr))) < 600);  // a unix time, not a duration
  for (const char* p : {"lock", "read", "patch", "sync", "then"}) {
    const auto v = value_of(s, "hfdelta_last_run_phase_seconds", p);
    REQUIRE_MESSAGE(v, p);
    CHECK(std::fabs(*v - j["phases"][p].get<double>()) <= 1e-6);
  }
  CHECK(*value_of(s, "hfdelta_last_run_phase_seconds", "then") >= 0.3);
  check_alone(c.metrics);

  SUBCASE("one delta by hand: no versions behind or ROOT bytes, no --then phase") {
    const RunResult one =
        apply({"--json", "--metrics", c.metrics.string(), version_dir(c.root, 3).string(), c.local.string()});
    E2E_REQUIRE_CODE(one, 0);
    const std::vector<Sample> s1 = read_metrics(c.metrics);
    CHECK(value_of(s1, "hfdelta_version_held") == 3);
    CHECK_FALSE(value_of(s1, "hfdelta_versions_behind"));
    CHECK_FALSE(value_of(s1, "hfdelta_last_run_root_bytes"));
    CHECK_FALSE(value_of(s1, "hfdelta_last_run_phase_seconds", "then"));
    CHECK(value_of(s1, "hfdelta_last_run_delta_bytes") == parse_json(one.out)["delta_bytes"].get<double>());
    check_alone(c.metrics);
  }
}

TEST_CASE("metrics: a failed run records its exit code, keeps the last success, and the version held") {
  Chain c;
  E2E_REQUIRE_CODE(
      apply({"-q", "--root", c.root.string(), "--target", "1", c.local.string(), "--metrics", c.metrics.string()}), 0);
  const auto success = value_of(read_metrics(c.metrics), "hfdelta_last_success_timestamp_seconds");
  REQUIRE(success);
  int want = 0;
  std::vector<std::string> args;
  SUBCASE("a target not published (exit 4), no result") {
    want = 4, args = {"--root", c.root.string(), "--target", "9"};
  }
  SUBCASE("ROOT missing (exit 2), no result") { want = 2, args = {"--root", (c.t / "gone").string()}; }
  SUBCASE("a failed --then (exit 9), the version applied") {
    want = 9, args = {"--root", c.root.string(), "--then", "exit 1"};
  }
  args.insert(args.end(), {c.local.string(), "--metrics", c.metrics.string()});
  const RunResult r = apply(args);
  E2E_REQUIRE_CODE(r, want);
  const std::vector<Sample> s = read_metrics(c.metrics);
  CHECK(value_of(s, "hfdelta_last_exit_code") == want);
  CHECK(value_of(s, "hfdelta_last_success_timestamp_seconds") == success);
  CHECK(*value_of(s, "hfdelta_last_run_timestamp_seconds") >= *success);
  const double held = want == 9 ? 3 : 1;
  CHECK(value_of(s, "hfdelta_version_held") == held);
  if (want == 4) CHECK(value_of(s, "hfdelta_versions_behind") == 2);   // ROOT read after the failure
  if (want == 2) CHECK_FALSE(value_of(s, "hfdelta_versions_behind"));  // ROOT cannot be read
  CHECK(value_of(s, "hfdelta_last_run_phase_seconds", "lock").has_value() == (want == 9));
  check_alone(c.metrics);
}

TEST_CASE("metrics: a FILE whose directory is missing is refused before anything is done (exit 2)") {
  Chain c;
  const fs::path bad = c.t / "nowhere" / "m.prom";
  const RunResult r = apply({"--root", c.root.string(), c.local.string(), "--metrics", bad.string()});
  E2E_CHECK_CODE(r, 2);
  CHECK(contains(r.err, bad.string()));
  CHECK_FALSE(fs::exists(bad.parent_path()));
  CHECK(state_version(c.local) == v6(0));
  E2E_CHECK_CODE(apply({"--status", c.local.string(), "--metrics", c.metrics.string()}), 2);  // not with --status
}
