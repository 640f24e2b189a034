// The metrics file of delta-apply --metrics (hfdelta/metrics_textfile.hpp):
// label values escaped as the exposition format says, each metric with its
// # HELP and # TYPE, metrics left out when unknown, the last success read back.
#include <cstdio>
#include <string>

#include <doctest/doctest.h>

#include "hfdelta/metrics_textfile.hpp"
#include "unit_util.hpp"

using namespace hfdelta;

TEST_CASE("escape_label_value: backslash, double quote and newline, nothing else") {
  CHECK(escape_label_value("/local/model") == "/local/model");
  CHECK(escape_label_value("a\\b") == "a\\\\b");
  CHECK(escape_label_value("say \"hi\"") == "say \\\"hi\\\"");
  CHECK(escape_label_value("two\nlines") == "two\\nlines");
  CHECK(escape_label_value("\\\"\n") == "\\\\\\\"\\n");
  CHECK(escape_label_value("tab\there, {x=1}, 'q', ü") == "tab\there, {x=1}, 'q', ü");  // kept as they are
  CHECK(escape_label_value("") == "");
}

TEST_CASE("format_metrics: HELP and TYPE before each metric's samples, the label escaped, unknowns left out") {
  RunMetrics m;
  m.local = "/local/a \"b\"\\c";
  m.exit_code = 5;
  m.run_time = 1700000000.25;
  m.version_held = 7;
  m.phases = PhaseTimes{0.5, 1, 2, 3, std::nullopt};
  const std::string text = format_metrics(m);
  INFO(text);
  const std::string label = "local=\"/local/a \\\"b\\\"\\\\c\"";
  CHECK(text.find("# HELP hfdelta_version_held ") < text.find("# TYPE hfdelta_version_held gauge\n"));
  CHECK(text.find("# TYPE hfdelta_version_held gauge\n") < text.find("hfdelta_version_held{" + label + "} 7\n"));
  CHECK(text.find("hfdelta_last_exit_code{" + label + "} 5\n") != std::string::npos);
  CHECK(text.find("hfdelta_last_run_timestamp_seconds{" + label + "} 1700000000.250\n") != std::string::npos);
  CHECK(text.find("hfdelta_last_run_phase_seconds{" + label + ",phase=\"patch\"} 2.000000\n") != std::string::npos);
  CHECK(text.find("phase=\"then\"") == std::string::npos);  // no --then ran
  for (const char* absent : {"hfdelta_versions_behind", "hfdelta_last_success_timestamp_seconds",
                             "hfdelta_last_run_delta_bytes", "hfdelta_last_run_root_bytes"})
    CHECK(text.find(absent) == std::string::npos);
  CHECK(text.back() == '\n');
}

TEST_CASE("read_last_success: the value an earlier file holds, none without one") {
  const unit::TempDir t;
  const auto file = t.path() / "m.prom";
  CHECK_FALSE(read_last_success(file));
  RunMetrics m;
  m.local = "/l";
  m.last_success = 1712345678.5;
  std::FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f);
  const std::string text = format_metrics(m);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  REQUIRE(read_last_success(file));
  CHECK(*read_last_success(file) == doctest::Approx(1712345678.5));
  f = std::fopen(file.c_str(), "w");
  std::fputs("# HELP hfdelta_last_success_timestamp_seconds x\nhfdelta_last_success_timestamp_seconds_total 3\n", f);
  std::fclose(f);
  CHECK_FALSE(read_last_success(file));  // another metric's name that starts the same
}

TEST_CASE("metrics_file_problem: an existing, writable directory, not a directory as FILE") {
  const unit::TempDir t;
  CHECK(metrics_file_problem(t.path() / "m.prom").empty());
  CHECK(metrics_file_problem(t.path() / "missing" / "m.prom").find("does not exist") != std::string::npos);
  CHECK(metrics_file_problem(t.path()).find("is a directory") != std::string::npos);
}
