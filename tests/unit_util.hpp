// Helpers shared by the unit tests.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <doctest/doctest.h>
#include <boost/filesystem.hpp>

#include "hfdelta/error.hpp"

namespace unit {

// A fresh directory from mkdtemp under $TMPDIR (or /tmp), removed afterwards.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/hfdelta-unit-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    boost::system::error_code ec;
    boost::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const boost::filesystem::path& path() const { return path_; }

 private:
  boost::filesystem::path path_;
};

// The hfdelta::Error that f() throws, if any.
template <class F>
std::optional<hfdelta::Error> error_of(F&& f) {
  try {
    f();
  } catch (const hfdelta::Error& e) {
    return e;
  }
  return std::nullopt;
}

inline bool contains(const std::string& hay, std::string_view needle) { return hay.find(needle) != std::string::npos; }

// A file of the source tree (HFDELTA_TESTDATA is its testdata/).
inline std::string source_file(const std::string& name) {
  const char* testdata = std::getenv("HFDELTA_TESTDATA");
  REQUIRE(testdata != nullptr);
  std::ifstream in(std::string(testdata) + "/../" + name);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace unit
