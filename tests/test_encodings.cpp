// The table of encodings (include/hfdelta/encodings.hpp): its lookups, and
// docs/format.md's copy of it, row by row.
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "hfdelta/encodings.hpp"
#include "hfdelta/error.hpp"
#include "unit_util.hpp"
#include "hfdelta/option_rules.hpp"

namespace {

using namespace hfdelta;

using unit::source_file;

// The cells of each row of the markdown table whose header line is `header`.
std::vector<std::vector<std::string>> table_rows(const std::string& page, const std::string& header) {
  std::size_t at = page.find("\n" + header + "\n");
  REQUIRE(at != std::string::npos);
  at = page.find('\n', page.find('\n', at + 1) + 1) + 1;  // past the header and its |---| line
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(page.substr(at));
  for (std::string line; std::getline(in, line) && line.starts_with("|");) {
    std::vector<std::string> cells;
    std::istringstream cs(line.substr(1));
    for (std::string c; std::getline(cs, c, '|');) {
      const std::size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
    }
    rows.push_back(std::move(cells));
  }
  return rows;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

}  // namespace

TEST_CASE("the encodings table: names and codes unique, each found back by its name and its code") {
  std::set<std::string_view> names;
  std::set<std::uint32_t> codes;
  for (const EncodingInfo& e : kEncodings) {
    CAPTURE(e.name);
    CHECK(names.insert(e.name).second);
    CHECK(parse_encoding(e.name) == e.encoding);
    CHECK(encoding_name(e.encoding) == e.name);
    CHECK((e.magic.empty() || e.magic.size() == 4));
    CHECK(e.name != kAutoEncoding);
    if (e.code) {
      CHECK(codes.insert(*e.code).second);
      CHECK(encoding_of_code(*e.code) == e.encoding);
      CHECK(code_of(e.encoding, "test") == *e.code);
    } else {
      CHECK_THROWS_AS(code_of(e.encoding, "test"), Error);
    }
    CHECK((!e.in_parts || e.code));  // a part is named by its code
  }
  CHECK(!parse_encoding("auto"));
  CHECK(!parse_encoding("XOR"));
  CHECK(!encoding_of_code(5));
}

TEST_CASE("--encoding takes the encodings a whole delta may be written in, and auto") {
  std::vector<std::string> want;
  for (const EncodingInfo& e : kEncodings)
    if (e.whole_delta) want.emplace_back(e.name);
  want.emplace_back("auto");
  CHECK(encoding_names() == want);
  for (const EncodingInfo& e : kEncodings) {
    CAPTURE(e.name);
    CHECK(encoding_problem(e.name).empty() == e.whole_delta);
  }
}

TEST_CASE("docs/format.md's table of encodings is the code's, row by row") {
  const auto rows = table_rows(source_file("docs/format.md"),
                               "| name | magic | code | revision | chunked | needs base | whole delta | in parts |");
  REQUIRE(rows.size() == kEncodings.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<std::string>& r = rows[i];
    const EncodingInfo& e = kEncodings[i];
    CAPTURE(e.name);
    REQUIRE(r.size() == 8);
    CHECK(r[0] == "`" + std::string(e.name) + "`");
    CHECK(r[1] == (e.magic.empty() ? std::string("zstd frame") : "`" + std::string(e.magic) + "`"));
    CHECK(r[2] == (e.code ? std::to_string(*e.code) : std::string("—")));
    CHECK(r[3] == std::to_string(e.revision));
    CHECK(r[4] == yes_no(e.chunked));
    CHECK(r[5] == yes_no(e.needs_base));
    CHECK(r[6] == yes_no(e.whole_delta));
    CHECK(r[7] == yes_no(e.in_parts));
  }
}
