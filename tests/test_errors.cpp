// The exit-code table (include/hfdelta/error.hpp) and the places that restate
// it: the man pages' EXIT STATUS sections and the README's table name each
// code with its kind;
// tests/python/test_errors.py checks Python's classes against the same table.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "hfdelta/error.hpp"
#include "unit_util.hpp"

namespace {

using namespace hfdelta;

using unit::source_file;

// The codes an EXIT STATUS section lists, with the kind each names.
std::map<int, std::string> exit_status(const std::string& page) {
  const std::size_t a = page.find(".SH EXIT STATUS\n");
  REQUIRE(a != std::string::npos);
  const std::size_t b = page.find("\n.SH ", a + 1);
  const std::string section = page.substr(a, b == std::string::npos ? std::string::npos : b - a);
  std::map<int, std::string> out;
  const std::regex item(R"re(\n\.TP\n\.BR (\d+) " \(([a-z_]+)\)"\n)re");
  for (std::sregex_iterator it(section.begin(), section.end(), item), end; it != end; ++it)
    out[std::stoi((*it)[1])] = (*it)[2];
  return out;
}

// The Error `f` throws (the test fails if it throws none).
template <class F>
Error caught(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no hfdelta::Error thrown");
  return Error(Exit::ok, "");
}

}  // namespace

TEST_CASE("the exit-code table: one row per code, in order, kinds unique") {
  std::set<std::string> kinds;
  int n = 0;
  for (const ExitCode& e : kExitCodes) {
    CAPTURE(e.kind);
    CHECK(static_cast<int>(e.code) == n++);
    CHECK(kinds.insert(e.kind).second);
    CHECK(std::string(exit_kind(static_cast<int>(e.code))) == e.kind);
  }
  CHECK(std::string(exit_kind(130)) == "stopped");
  CHECK(std::string(exit_kind(99)) == "failure");
}

TEST_CASE("the man pages name every exit code with the table's kind") {
  std::set<int> documented;
  for (const std::string page : {"delta-diff.1", "delta-apply.1", "delta-fleet.1"}) {
    CAPTURE(page);
    const std::map<int, std::string> listed = exit_status(source_file("man/" + page));
    CHECK(listed.size() >= (page == "delta-fleet.1" ? 5u : 8u));  // the fleet view reads only: fewer ways to fail
    for (const auto& item : listed) {
      const int code = item.first;  // not a structured binding: CAPTURE's lambda takes it
      const std::string& kind = item.second;
      CAPTURE(code);
      REQUIRE(code < static_cast<int>(std::size(kExitCodes)));
      CHECK(kind == kExitCodes[code].kind);
      documented.insert(code);
    }
  }
  CHECK(documented.size() == std::size(kExitCodes));  // every code, in one page or both
}

TEST_CASE("the README's exit-code table names every code with the table's kind") {
  const std::string readme = source_file("README.md");
  const std::regex row(R"re(\n\| (\d+) \| `([a-z_]+)` \|)re");
  std::set<int> listed;
  for (std::sregex_iterator it(readme.begin(), readme.end(), row), end; it != end; ++it) {
    const int code = std::stoi((*it)[1]);
    CAPTURE(code);
    REQUIRE(code < static_cast<int>(std::size(kExitCodes)));
    CHECK((*it)[2] == kExitCodes[code].kind);
    CHECK(listed.insert(code).second);
  }
  CHECK(listed.size() == std::size(kExitCodes));
}

TEST_CASE("an error names its file as a field; the codecs' errors get theirs from the layer that reads the file") {
  const Error e = caught([] { fail(Exit::bad_input, std::string("/x/model.safetensors"), "header too long"); });
  CHECK(std::string(e.what()) == "/x/model.safetensors: header too long");
  CHECK(e.path() == "/x/model.safetensors");
  CHECK(std::string(e.kind()) == "bad_input");
  CHECK(caught([] { fail(Exit::usage, "--level: 40 is not in 1-19"); }).path().empty());
  CHECK(caught([] {
          about_file("/d/delta.safetensors", [] { fail(Exit::bad_input, "entry 'w': zstd frame is corrupt"); });
        }).path() == "/d/delta.safetensors");
  // The innermost layer that knew the file names it.
  CHECK(caught([] { about_file("/outer", [] { fail(Exit::bad_input, std::string("/inner"), "bad"); }); }).path() ==
        "/inner");
  const Error again = caught([] {
    try {
      fail(Exit::out_of_order, std::string("/l"), "behind");
    } catch (const Error& first) {
      fail_again(first, std::string(first.what()) + "; and more");
    }
  });
  CHECK(again.code() == Exit::out_of_order);
  CHECK(again.path() == "/l");
  CHECK(std::string(again.what()) == "/l: behind; and more");
}
