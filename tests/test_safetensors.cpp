// Unit tests of the strict safetensors reader and the writer helpers
// (docs/format.md, "Checkpoint directories").
#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "unit_util.hpp"

using namespace hfdelta;
using unit::contains;
using unit::error_of;
using unit::TempDir;

namespace {

namespace bfs = boost::filesystem;

constexpr const char* kWhat = "bad.safetensors";

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file: 8-byte length, the header text as given, `data_len` data bytes.
std::string st_file(const std::string& header, std::size_t data_len, char fill = '\x5a') {
  return le64(header.size()) + header + std::string(data_len, fill);
}

std::string tensor_json(const std::string& dtype, const std::string& shape, std::uint64_t b, std::uint64_t e) {
  return "{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," +
         std::to_string(e) + "]}";
}

void write_bytes(const bfs::path& p, const std::string& bytes) {
  std::ofstream f(p.string(), std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  REQUIRE(f.good());
}

// Parses `file` (the whole file in memory) and expects bad_input naming the
// file and every needle.
void expect_bad(const std::string& file, std::initializer_list<std::string_view> needles) {
  const auto e = error_of([&] { parse_safetensors(file, file.size(), kWhat); });
  REQUIRE_MESSAGE(e.has_value(), "no Error thrown");
  const std::string msg = e->what();
  INFO("message: " << msg);
  CHECK(e->code() == Exit::bad_input);
  CHECK(contains(msg, kWhat));
  for (auto n : needles) CHECK_MESSAGE(contains(msg, n), "missing \"" << std::string(n) << "\"");
}

void expect_same(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  CHECK(a.header_len == b.header_len);
  CHECK(a.file_size == b.file_size);
  CHECK(a.header == b.header);
  CHECK(a.has_metadata == b.has_metadata);
  CHECK(a.metadata == b.metadata);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    CHECK(a.tensors[i].name == b.tensors[i].name);
    CHECK(a.tensors[i].dtype == b.tensors[i].dtype);
    CHECK(a.tensors[i].shape == b.tensors[i].shape);
    CHECK(a.tensors[i].begin == b.tensors[i].begin);
    CHECK(a.tensors[i].end == b.tensors[i].end);
  }
}

struct DtypeCase {
  const char* name;
  std::size_t size;
};
constexpr DtypeCase kAllDtypes[] = {
    {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

}  // namespace

// ---- malformed files: one per rule of the reference reader ---------------------

TEST_CASE("safetensors: file shorter than the 8-byte length is refused") {
  for (std::size_t n : {0, 1, 7}) {
    CAPTURE(n);
    const std::string file(n, '\0');
    expect_bad(file, {"shorter than the 8-byte", std::to_string(n) + " bytes"});
  }
}

TEST_CASE("safetensors: header length over 100,000,000 is refused") {
  // Even when the file claims to be big enough, the limit applies first.
  const std::string file = le64(100'000'001) + "{}";
  const auto e = error_of([&] { parse_safetensors(file, 200'000'000, kWhat); });
  REQUIRE(e);
  const std::string msg = e->what();
  INFO(msg);
  CHECK(e->code() == Exit::bad_input);
  CHECK(contains(msg, kWhat));
  CHECK(contains(msg, "exceeds"));
  CHECK(contains(msg, "100000001"));
  // The largest u64 too (no overflow of 8 + N).
  expect_bad(le64(~0ull) + "{}", {"exceeds"});
}

TEST_CASE("safetensors: a header within the format's limit but over hfdelta's (32 MiB) is refused as such") {
  expect_bad(le64(100'000'000) + "{}", {"exceeds hfdelta's limit", "33554432"});
  expect_bad(le64((32u << 20) + 1) + "{}", {"exceeds hfdelta's limit"});
}

TEST_CASE("safetensors: header length of exactly hfdelta's limit is only refused for running past the file") {
  expect_bad(le64(32u << 20) + "{}", {"past the end"});
}

TEST_CASE("safetensors: 8 + N beyond the file is refused") {
  expect_bad(le64(10) + "{}", {"past the end", "10"});
  expect_bad(le64(1), {"past the end"});
  // One byte short.
  const std::string h = "{}      ";
  expect_bad(le64(h.size() + 1) + h, {"past the end"});
}

TEST_CASE("safetensors: invalid JSON is refused") {
  for (const char* h : {"{\"a\": ", "{\"a\":{\"dtype\":\"U8\",}}", "{} x", "{}{}", "{'a':1}", "{\"a\":1,}"}) {
    CAPTURE(h);
    expect_bad(st_file(h, 0), {"not valid UTF-8 JSON"});
  }
}

TEST_CASE("safetensors: invalid UTF-8 in a string is refused") {
  // A lone continuation byte, a truncated sequence, an overlong '/', a UTF-16
  // surrogate encoded as UTF-8, in a metadata value and in a tensor name.
  for (const std::string& bad : {std::string("\xff"), std::string("\xc3"), std::string("\xc0\xaf"),
                                 std::string("\xed\xa0\x80"), std::string("\x80")}) {
    const std::string in_meta = "{\"__metadata__\":{\"k\":\"" + bad + "\"}}";
    expect_bad(st_file(in_meta, 0), {"not valid UTF-8 JSON"});
    const std::string in_name = "{\"t" + bad + "\":" + tensor_json("U8", "[1]", 0, 1) + "}";
    expect_bad(st_file(in_name, 1), {"not valid UTF-8 JSON"});
  }
  // Valid multi-byte UTF-8 is fine.
  const std::string ok = "{\"\xc3\xa9t\xe2\x82\xac\":" + tensor_json("U8", "[1]", 0, 1) + "}";
  const std::string file = st_file(ok, 1);
  const auto h = parse_safetensors(file, file.size(), kWhat);
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == "\xc3\xa9t\xe2\x82\xac");
}

TEST_CASE("safetensors: header that is not an object, or does not start with '{', is refused") {
  for (const char* h : {"[]", "\"x\"", "123", "null", " {}", "\n{}", "\t{}"}) {
    CAPTURE(h);
    expect_bad(st_file(h, 0), {"does not start with"});
  }
  // N = 0: an empty header.
  expect_bad(le64(0), {"does not start with"});
}

TEST_CASE("safetensors: duplicate keys are refused") {
  const std::string t = tensor_json("U8", "[2]", 0, 2);
  expect_bad(st_file("{\"w\":" + t + ",\"w\":" + t + "}", 2), {"duplicate", "\"w\""});
  // Duplicates inside a tensor entry or the metadata would also let readers disagree.
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2),
             {"duplicate", "dtype"});
  expect_bad(st_file("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0), {"duplicate", "\"k\""});
  expect_bad(st_file("{\"__metadata__\":{},\"__metadata__\":{}}", 0), {"duplicate", "__metadata__"});
  // Same key in two different objects is not a duplicate.
  const std::string ok = "{\"__metadata__\":{\"a\":\"x\"},\"a\":" + tensor_json("U8", "[2]", 0, 2) + "}";
  const std::string file = st_file(ok, 2);
  CHECK_NOTHROW(parse_safetensors(file, file.size(), kWhat));
}

TEST_CASE("safetensors: __metadata__ must be an object of strings") {
  expect_bad(st_file("{\"__metadata__\":\"pt\"}", 0), {"__metadata__", "not an object"});
  expect_bad(st_file("{\"__metadata__\":[\"a\"]}", 0), {"__metadata__", "not an object"});
  expect_bad(st_file("{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}", 0), {"__metadata__[\"n\"]", "not a string"});
  expect_bad(st_file("{\"__metadata__\":{\"o\":{}}}", 0), {"\"o\"", "not a string"});
  expect_bad(st_file("{\"__metadata__\":{\"z\":null}}", 0), {"\"z\"", "not a string"});
}

TEST_CASE("safetensors: tensor entries need dtype, shape and data_offsets") {
  expect_bad(st_file("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1), {"'w'", "dtype"});
  expect_bad(st_file("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1), {"'w'", "dtype"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1), {"'w'", "shape"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1), {"'w'", "shape"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1), {"'w'", "data_offsets"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1), {"'w'", "data_offsets"});
  expect_bad(st_file("{\"w\":5}", 0), {"'w'", "not an object"});
}

TEST_CASE("safetensors: data_offsets must be two non-negative integers with begin <= end") {
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1), {"'w'", "data_offsets"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1), {"'w'", "data_offsets"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[]}}", 1), {"'w'", "data_offsets"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1),
             {"'w'", "data_offsets[0]", "non-negative integer"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1),
             {"'w'", "data_offsets[1]", "non-negative integer"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,\"1\"]}}", 1),
             {"'w'", "data_offsets[1]", "non-negative integer"});
  expect_bad(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 1),
             {"'w'", "data_offsets[1]"});
  expect_bad(st_file("{\"w\":" + tensor_json("U8", "[0]", 4, 0) + "}", 4), {"'w'", "begin after end"});
  // Shape entries follow the same rule.
  expect_bad(st_file("{\"w\":" + tensor_json("U8", "[-1]", 0, 1) + "}", 1), {"'w'", "shape entry"});
  expect_bad(st_file("{\"w\":" + tensor_json("U8", "[1.5]", 0, 1) + "}", 1), {"'w'", "shape entry"});
  expect_bad(st_file("{\"w\":" + tensor_json("U8", "[[1]]", 0, 1) + "}", 1), {"'w'", "shape entry"});
}

TEST_CASE("safetensors: offsets must tile the buffer from 0 with no gap and no overlap") {
  SUBCASE("gap between tensors") {
    const std::string h =
        "{\"a\":" + tensor_json("F32", "[1]", 0, 4) + ",\"b\":" + tensor_json("F32", "[1]", 8, 12) + "}";
    expect_bad(st_file(h, 12), {"'b'", "gap", "8", "4"});
  }
  SUBCASE("first tensor not at offset 0") {
    const std::string h = "{\"a\":" + tensor_json("F32", "[1]", 4, 8) + "}";
    expect_bad(st_file(h, 8), {"'a'", "gap", "begin at 4"});
  }
  SUBCASE("overlapping tensors") {
    const std::string h =
        "{\"a\":" + tensor_json("F32", "[2]", 0, 8) + ",\"b\":" + tensor_json("F32", "[2]", 4, 12) + "}";
    expect_bad(st_file(h, 12), {"'b'", "overlap"});
  }
  SUBCASE("two tensors on the same bytes") {
    const std::string h =
        "{\"a\":" + tensor_json("F32", "[1]", 0, 4) + ",\"b\":" + tensor_json("F32", "[1]", 0, 4) + "}";
    expect_bad(st_file(h, 4), {"overlap"});
  }
  SUBCASE("empty tensor inside another tensor's bytes") {
    const std::string h =
        "{\"a\":" + tensor_json("F32", "[1]", 0, 4) + ",\"e\":" + tensor_json("F32", "[0]", 2, 2) + "}";
    expect_bad(st_file(h, 4), {"'e'", "overlap"});
  }
}

TEST_CASE("safetensors: the last end must be the end of the file") {
  const std::string h = "{\"a\":" + tensor_json("F32", "[1]", 0, 4) + "}";
  SUBCASE("trailing bytes") { expect_bad(st_file(h, 6), {"cover 4 bytes", "holds 6 bytes"}); }
  SUBCASE("tensor past the end of the file") { expect_bad(st_file(h, 2), {"cover 4 bytes", "holds 2 bytes"}); }
  SUBCASE("no tensors but data") { expect_bad(st_file("{}", 3), {"cover 0 bytes", "holds 3 bytes"}); }
  SUBCASE("file_size larger than the bytes given") {
    const std::string file = st_file(h, 4);
    const auto e = error_of([&] { parse_safetensors(file, file.size() + 1, kWhat); });
    REQUIRE(e);
    CHECK(e->code() == Exit::bad_input);
    CHECK(contains(e->what(), "holds 5 bytes"));
  }
}

TEST_CASE("safetensors: byte span must equal product(shape) x dtype size") {
  expect_bad(st_file("{\"w\":" + tensor_json("F32", "[2, 3]", 0, 20) + "}", 20), {"'w'", "needs 24", "span 20", "F32"});
  expect_bad(st_file("{\"w\":" + tensor_json("BF16", "[]", 0, 1) + "}", 1), {"'w'", "needs 2"});
  expect_bad(st_file("{\"w\":" + tensor_json("F64", "[0]", 0, 8) + "}", 8), {"'w'", "needs 0"});
  expect_bad(st_file("{\"w\":" + tensor_json("U8", "[3]", 0, 4) + "}", 4), {"'w'", "needs 3"});
}

TEST_CASE("safetensors: arithmetic overflow is refused") {
  SUBCASE("shape product overflows 64 bits") {
    expect_bad(st_file("{\"w\":" + tensor_json("U8", "[4294967296, 4294967296]", 0, 0) + "}", 0), {"'w'", "overflows"});
    // Also for dtypes the tool does not know: the shape itself is nonsense.
    expect_bad(st_file("{\"w\":" + tensor_json("F4", "[4294967296, 4294967297]", 0, 0) + "}", 0), {"'w'", "overflows"});
  }
  SUBCASE("shape fits but times the dtype size overflows") {
    // 2^62 elements of 8 bytes = 2^65.
    expect_bad(st_file("{\"w\":" + tensor_json("F64", "[4611686018427387904]", 0, 0) + "}", 0), {"'w'", "overflows"});
    // 2^63 elements of 2 bytes = 2^64, just one past the maximum.
    expect_bad(st_file("{\"w\":" + tensor_json("BF16", "[2, 4611686018427387904]", 0, 0) + "}", 0),
               {"'w'", "overflows"});
  }
  SUBCASE("a large product that fits is a plain size mismatch") {
    expect_bad(st_file("{\"w\":" + tensor_json("F64", "[1152921504606846976]", 0, 0) + "}", 0),
               {"'w'", "needs 9223372036854775808"});
  }
}

// ---- valid files ---------------------------------------------------------------

TEST_CASE("safetensors: every dtype of the format with its size") {
  for (const auto& d : kAllDtypes) {
    CAPTURE(d.name);
    CHECK(dtype_size(d.name) == d.size);
    const std::string h = "{\"t\":" + tensor_json(d.name, "[3]", 0, 3 * d.size) + "}";
    const std::string file = st_file(h, 3 * d.size);
    const auto hdr = parse_safetensors(file, file.size(), kWhat);
    REQUIRE(hdr.tensors.size() == 1);
    CHECK(hdr.tensors[0].dtype == d.name);
    CHECK(hdr.tensors[0].nbytes() == 3 * d.size);
    CHECK(hdr.tensors[0].elements() == 3);
    // And one byte off is refused.
    const std::string h2 = "{\"t\":" + tensor_json(d.name, "[3]", 0, 3 * d.size + 1) + "}";
    expect_bad(st_file(h2, 3 * d.size + 1), {"'t'", "needs " + std::to_string(3 * d.size)});
  }
  for (const char* unknown : {"F4", "C64", "", "bf16", "U8 ", "F8_E4M3FN"}) {
    CAPTURE(unknown);
    CHECK(dtype_size(unknown) == 0);
  }
}

TEST_CASE("safetensors: unknown dtypes are carried as opaque bytes") {
  // Any consistent offsets are accepted: the shape says nothing about the size.
  const std::string h = "{\"a\":" + tensor_json("F4", "[3]", 0, 5) + ",\"b\":" + tensor_json("C64", "[2, 2]", 5, 6) +
                        ",\"c\":" + tensor_json("F4", "[7]", 6, 6) + "}";
  const std::string file = st_file(h, 6);
  const auto hdr = parse_safetensors(file, file.size(), kWhat);
  REQUIRE(hdr.tensors.size() == 3);
  CHECK(hdr.tensors[0].name == "a");
  CHECK(hdr.tensors[0].nbytes() == 5);
  CHECK(hdr.tensors[0].elements() == 3);
  CHECK(hdr.tensors[1].name == "b");
  CHECK(hdr.tensors[1].nbytes() == 1);
  CHECK(hdr.tensors[1].elements() == 4);
  CHECK(hdr.tensors[2].name == "c");
  CHECK(hdr.tensors[2].nbytes() == 0);
  // The tiling rules still apply to them.
  expect_bad(st_file("{\"a\":" + tensor_json("F4", "[3]", 1, 5) + "}", 5), {"'a'", "gap"});
}

TEST_CASE("safetensors: scalars and empty tensors") {
  SUBCASE("scalar shape [] is one element") {
    const std::string file = st_file("{\"s\":" + tensor_json("F32", "[]", 0, 4) + "}", 4);
    const auto h = parse_safetensors(file, file.size(), kWhat);
    REQUIRE(h.tensors.size() == 1);
    CHECK(h.tensors[0].shape.empty());
    CHECK(h.tensors[0].elements() == 1);
    CHECK(h.tensors[0].nbytes() == 4);
  }
  SUBCASE("empty tensors, several at the same offset") {
    const std::string h = "{\"a\":" + tensor_json("F32", "[1]", 0, 4) + ",\"e1\":" + tensor_json("F32", "[0]", 4, 4) +
                          ",\"e2\":" + tensor_json("BF16", "[2, 0, 3]", 4, 4) +
                          ",\"b\":" + tensor_json("F32", "[1]", 4, 8) + ",\"e3\":" + tensor_json("U8", "[0]", 8, 8) +
                          ",\"e0\":" + tensor_json("I64", "[0, 4611686018427387904]", 0, 0) + "}";
    const std::string file = st_file(h, 8);
    const auto hdr = parse_safetensors(file, file.size(), kWhat);
    REQUIRE(hdr.tensors.size() == 6);
    // Sorted by offset: e0 at 0 (empty sorts before the 4-byte a), e1/e2 at 4 before b, e3 at 8.
    CHECK(hdr.tensors[0].name == "e0");
    CHECK(hdr.tensors[1].name == "a");
    CHECK(((hdr.tensors[2].name == "e1" && hdr.tensors[3].name == "e2") ||
           (hdr.tensors[2].name == "e2" && hdr.tensors[3].name == "e1")));
    CHECK(hdr.tensors[4].name == "b");
    CHECK(hdr.tensors[5].name == "e3");
    CHECK(hdr.find("e2")->elements() == 0);
    CHECK(hdr.find("e2")->nbytes() == 0);
    CHECK(hdr.find("e0")->elements() == 0);
  }
  SUBCASE("only empty tensors, empty buffer") {
    const std::string h =
        "{\"x\":" + tensor_json("F16", "[0]", 0, 0) + ",\"y\":" + tensor_json("F16", "[0, 5]", 0, 0) + "}";
    const std::string file = st_file(h, 0);
    const auto hdr = parse_safetensors(file, file.size(), kWhat);
    CHECK(hdr.tensors.size() == 2);
    CHECK(hdr.data_start() == file.size());
  }
}

TEST_CASE("safetensors: header with only __metadata__ and no tensors") {
  const std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"\xc3\xa9\"}}";
  const std::string file = st_file(h, 0);
  const auto hdr = parse_safetensors(file, file.size(), kWhat);
  CHECK(hdr.tensors.empty());
  CHECK(hdr.has_metadata);
  CHECK(hdr.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"note", "\xc3\xa9"}});
  // Without metadata at all.
  const std::string file2 = st_file("{}", 0);
  const auto h2 = parse_safetensors(file2, file2.size(), kWhat);
  CHECK_FALSE(h2.has_metadata);
  CHECK(h2.metadata.empty());
  CHECK(h2.tensors.empty());
  CHECK(h2.header_len == 2);
  CHECK(h2.header == "{}");
  // Empty metadata object.
  const std::string file3 = st_file("{\"__metadata__\":{}}", 0);
  const auto h3 = parse_safetensors(file3, file3.size(), kWhat);
  CHECK(h3.has_metadata);
  CHECK(h3.metadata.empty());
}

TEST_CASE("safetensors: key order, padding and the parsed fields") {
  const std::string ta = tensor_json("F32", "[2]", 8, 16);
  const std::string tb = tensor_json("U8", "[8]", 0, 8);
  const std::string meta = "{\"format\":\"pt\",\"k\":\"v\"}";
  const std::string order1 = "{\"__metadata__\":" + meta + ",\"a\":" + ta + ",\"b\":" + tb + "}";
  const std::string order2 = "{\"b\":" + tb + ",\"a\":" + ta + ",\"__metadata__\":" + meta + "}";
  const std::string inner = "{\"data_offsets\":[8,16],\"shape\":[2],\"dtype\":\"F32\"}";
  const std::string order3 = "{\"b\":" + tb + ",\"__metadata__\":" + meta + ",\"a\":" + inner + "}";
  std::string padded = order1;
  while (padded.size() % 8 != 0 || padded.size() == order1.size()) padded += ' ';

  std::vector<SafetensorsHeader> hs;
  for (const auto& h : {order1, order2, order3, padded}) {
    const std::string file = st_file(h, 16);
    hs.push_back(parse_safetensors(file, file.size(), kWhat));
    const auto& hdr = hs.back();
    CHECK(hdr.header == h);  // raw bytes kept, padding included
    CHECK(hdr.header_len == h.size());
    CHECK(hdr.file_size == file.size());
    CHECK(hdr.data_start() == 8 + h.size());
    REQUIRE(hdr.tensors.size() == 2);
    CHECK(hdr.tensors[0].name == "b");
    CHECK(hdr.tensors[0].dtype == "U8");
    CHECK(hdr.tensors[0].shape == std::vector<std::uint64_t>{8});
    CHECK(hdr.tensors[0].begin == 0);
    CHECK(hdr.tensors[0].end == 8);
    CHECK(hdr.tensors[1].name == "a");
    CHECK(hdr.tensors[1].begin == 8);
    CHECK(hdr.tensors[1].end == 16);
    CHECK(hdr.file_offset(hdr.tensors[1]) == 8 + h.size() + 8);
    CHECK(hdr.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}});
    REQUIRE(hdr.find("a") != nullptr);
    CHECK(hdr.find("a")->dtype == "F32");
    CHECK(hdr.find("zz") == nullptr);
    CHECK(hdr.find("__metadata__") == nullptr);
  }
  CHECK(hs[3].header_len % 8 == 0);
  CHECK(hs[3].header.back() == ' ');
}

TEST_CASE("safetensors: the bytes given may be just the header") {
  const std::string h = "{\"a\":" + tensor_json("U8", "[100]", 0, 100) + "}";
  const std::string file = st_file(h, 100);
  const auto full = parse_safetensors(file, file.size(), kWhat);
  const auto part = parse_safetensors(std::string_view(file).substr(0, 8 + h.size()), file.size(), kWhat);
  expect_same(full, part);
  // Fewer than 8 + N bytes given is refused, not read past.
  const auto e = error_of([&] { parse_safetensors(std::string_view(file).substr(0, 10), file.size(), kWhat); });
  REQUIRE(e);
  CHECK(e->code() == Exit::bad_input);
  CHECK(contains(e->what(), kWhat));
}

// ---- files on disk -------------------------------------------------------------

TEST_CASE("safetensors: read_safetensors on real files equals parsing the same bytes") {
  TempDir tmp;
  SUBCASE("hand-written file") {
    const std::string h = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":" + tensor_json("BF16", "[4, 2]", 0, 16) +
                          ",\"s\":" + tensor_json("I64", "[]", 16, 24) + "}   ";
    const std::string file = st_file(h, 24, '\x11');
    const bfs::path p = tmp.path() / "model.safetensors";
    write_bytes(p, file);
    const auto from_disk = read_safetensors(p);
    const auto from_mem = parse_safetensors(file, file.size(), p.string());
    expect_same(from_disk, from_mem);
    CHECK(from_disk.tensors.size() == 2);
  }
  SUBCASE("file written from layout_safetensors plus data") {
    const std::map<std::string, std::string> meta{{"format", "pt"}};
    const auto L = layout_safetensors({{"lm_head.weight", "BF16", {3, 5}, 30},
                                       {"embed", "F32", {2, 2}, 16},
                                       {"norm", "F16", {7}, 14},
                                       {"flag", "BOOL", {}, 1}},
                                      &meta);
    std::string data(L.file_size - L.prefix.size(), '\0');
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
    const std::string file = L.prefix + data;
    const bfs::path p = tmp.path() / "w.safetensors";
    write_bytes(p, file);
    const auto from_disk = read_safetensors(p);
    expect_same(from_disk, parse_safetensors(file, file.size(), p.string()));
    REQUIRE(from_disk.tensors.size() == L.tensors.size());
    for (std::size_t i = 0; i < L.tensors.size(); ++i) {
      CHECK(from_disk.tensors[i].name == L.tensors[i].name);
      CHECK(from_disk.tensors[i].begin == L.tensors[i].begin);
      CHECK(from_disk.tensors[i].end == L.tensors[i].end);
    }
    CHECK(from_disk.metadata == meta);
    CHECK(from_disk.file_size == L.file_size);
  }
}

TEST_CASE("safetensors: read_safetensors errors name the path") {
  TempDir tmp;
  struct Case {
    const char* name;
    std::string bytes;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"short.safetensors", "abc", "shorter than"},
      {"empty.safetensors", "", "shorter than"},
      {"huge.safetensors", le64(200'000'000) + "{}", "exceeds"},
      {"beyond.safetensors", le64(64) + "{}", "past the end"},
      {"json.safetensors", st_file("{\"a\"", 0), "not valid UTF-8 JSON"},
      {"trailing.safetensors", st_file("{}", 1), "holds 1 bytes"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const bfs::path p = tmp.path() / c.name;
    write_bytes(p, c.bytes);
    const auto e = error_of([&] { read_safetensors(p); });
    REQUIRE(e);
    const std::string msg = e->what();
    INFO(msg);
    CHECK(e->code() == Exit::bad_input);
    CHECK(contains(msg, p.string()));
    CHECK(contains(msg, c.needle));
  }
  SUBCASE("a directory is not a file") {
    const auto e = error_of([&] { read_safetensors(tmp.path()); });
    REQUIRE(e);
    CHECK(e->code() == Exit::bad_input);
    CHECK(contains(e->what(), tmp.path().string()));
  }
  SUBCASE("a missing file") {
    const bfs::path p = tmp.path() / "missing.safetensors";
    const auto e = error_of([&] { read_safetensors(p); });
    REQUIRE(e);
    CHECK(e->code() == Exit::failure);
    CHECK(contains(e->what(), p.string()));
  }
}

// ---- writing -------------------------------------------------------------------

TEST_CASE(
    "safetensors: layout orders data as the reference writer (dtype enumeration, last first) then name, header padded "
    "to 8") {
  const auto L = layout_safetensors({{"z_u8", "U8", {3}, 3},
                                     {"a_f16", "F16", {2}, 4},
                                     {"opaque", "F4", {5}, 3},
                                     {"b_f64", "F64", {1}, 8},
                                     {"a_f64", "F64", {2}, 16},
                                     {"m_i32", "I32", {}, 4},
                                     {"a_bool", "BOOL", {2}, 2}},
                                    nullptr);
  const std::vector<std::string> want{"a_f64", "b_f64", "m_i32", "a_f16", "z_u8", "opaque", "a_bool"};
  REQUIRE(L.tensors.size() == want.size());
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(L.tensors[i].name == want[i]);
    CHECK(L.tensors[i].begin == pos);
    pos = L.tensors[i].end;
  }
  CHECK(pos == 40);
  CHECK(L.prefix.size() % 8 == 0);
  CHECK(L.file_size == L.prefix.size() + 40);
  // The 8-byte length is little-endian and counts the padded header.
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(L.prefix[i]);
  CHECK(n == L.prefix.size() - 8);
  // Padding is spaces after the closing brace, fewer than 8 of them.
  const std::string header = L.prefix.substr(8);
  const auto close = header.find_last_of('}');
  REQUIRE(close != std::string::npos);
  CHECK(header.size() - close - 1 < 8);
  CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);
  CHECK(header.front() == '{');
  // What the strict parser sees is the layout.
  const std::string file = L.prefix + std::string(40, '\0');
  const auto h = parse_safetensors(file, file.size(), "layout");
  REQUIRE(h.tensors.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CHECK(h.tensors[i].name == L.tensors[i].name);
    CHECK(h.tensors[i].dtype == L.tensors[i].dtype);
    CHECK(h.tensors[i].shape == L.tensors[i].shape);
    CHECK(h.tensors[i].begin == L.tensors[i].begin);
    CHECK(h.tensors[i].end == L.tensors[i].end);
  }
  CHECK_FALSE(h.has_metadata);
}

TEST_CASE("safetensors: layout keeps metadata and awkward names") {
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"quote\"d", "back\\slash"}, {"nl", "a\nb"}};
  const std::string odd = "we\"ird/na\\me.\xc3\xa9\t";
  const auto L = layout_safetensors({{odd, "U8", {2}, 2}}, &meta);
  const std::string file = L.prefix + "xy";
  const auto h = parse_safetensors(file, file.size(), "layout");
  CHECK(h.has_metadata);
  CHECK(h.metadata == meta);
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == odd);
}

TEST_CASE("safetensors: layout with min_header_len reserves room") {
  const std::vector<TensorSpec> specs{{"a", "F32", {4}, 16}, {"b", "U8", {3}, 3}};
  const auto natural = layout_safetensors(specs, nullptr);
  const std::uint64_t natural_len = natural.prefix.size() - 8;
  CHECK(natural_len % 8 == 0);

  const auto big = layout_safetensors(specs, nullptr, 1000);
  CHECK(big.prefix.size() == 8 + 1000);
  CHECK(big.file_size == 8 + 1000 + 19);
  const auto odd = layout_safetensors(specs, nullptr, 1001);
  CHECK(odd.prefix.size() == 8 + 1008);
  const auto small = layout_safetensors(specs, nullptr, 3);
  CHECK(small.prefix == natural.prefix);
  // Data offsets do not depend on the header room.
  REQUIRE(big.tensors.size() == natural.tensors.size());
  for (std::size_t i = 0; i < big.tensors.size(); ++i) {
    CHECK(big.tensors[i].begin == natural.tensors[i].begin);
    CHECK(big.tensors[i].end == natural.tensors[i].end);
  }
  const std::string file = big.prefix + std::string(19, '\x01');
  const auto h = parse_safetensors(file, file.size(), "big");
  CHECK(h.header_len == 1000);
  CHECK(h.tensors.size() == 2);
}

TEST_CASE("safetensors: layout refuses a size that does not match the shape") {
  const auto e = error_of([] { layout_safetensors({{"w", "F32", {2, 2}, 15}}, nullptr); });
  REQUIRE(e);
  const std::string msg = e->what();
  INFO(msg);
  CHECK(contains(msg, "'w'"));
  CHECK(contains(msg, "needs 16"));
  // Unknown dtypes take any size.
  const auto L = layout_safetensors({{"w", "F4", {2, 2}, 3}}, nullptr);
  CHECK(L.tensors.at(0).nbytes() == 3);
}

TEST_CASE("safetensors: layout refuses a shape whose size overflows") {
  // 2^62 elements of 8 bytes is 2^65 bytes: the product wraps to 0 in 64 bits,
  // so a writer that does not check would lay out a 0-byte tensor whose header
  // the strict reader then refuses ("overflows").
  const auto e = error_of([] { layout_safetensors({{"w", "F64", {std::uint64_t{1} << 62}, 0}}, nullptr); });
  CHECK_MESSAGE(e.has_value(), "layout_safetensors accepted shape [2^62] of F64 with 0 bytes");
  if (!e) {
    const auto L = layout_safetensors({{"w", "F64", {std::uint64_t{1} << 62}, 0}}, nullptr);
    const std::string file = L.prefix;
    expect_bad(file, {"overflows"});  // what such a layout leads to
  }
  // Two dimensions whose product wraps.
  const auto e2 = error_of([] {
    layout_safetensors({{"w", "U8", {std::uint64_t{1} << 32, std::uint64_t{1} << 32}, 0}}, nullptr);
  });
  CHECK_MESSAGE(e2.has_value(), "layout_safetensors accepted shape [2^32, 2^32] of U8 with 0 bytes");
}

TEST_CASE("safetensors: encode_safetensors_header") {
  std::vector<TensorInfo> tensors{{"a", "F32", {2}, 0, 8}, {"b", "U8", {3}, 8, 11}};
  const std::string natural = encode_safetensors_header(tensors, nullptr);
  CHECK((natural.size() - 8) % 8 == 0);
  const std::string file = natural + std::string(11, '\0');
  const auto h = parse_safetensors(file, file.size(), "enc");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[1].name == "b");
  CHECK(h.tensors[1].end == 11);

  SUBCASE("exact reserved length") {
    const std::string exact = encode_safetensors_header(tensors, nullptr, 200);
    CHECK(exact.size() == 208);
    const std::string f2 = exact + std::string(11, '\0');
    CHECK(parse_safetensors(f2, f2.size(), "enc").header_len == 200);
    // Exactly the JSON's own length is enough.
    const std::string json_text = natural.substr(8, natural.find_last_of('}') - 8 + 1);
    const std::string tight = encode_safetensors_header(tensors, nullptr, json_text.size());
    CHECK(tight.substr(8) == json_text);
  }
  SUBCASE("reserved length too small throws") {
    const std::string json_text = natural.substr(8, natural.find_last_of('}') - 8 + 1);
    const auto e = error_of([&] { encode_safetensors_header(tensors, nullptr, json_text.size() - 1); });
    REQUIRE(e);
    CHECK(e->code() == Exit::failure);
    CHECK(contains(e->what(), "does not fit"));
    const std::map<std::string, std::string> meta{{"k", std::string(100, 'v')}};
    const auto e2 = error_of([&] { encode_safetensors_header(tensors, &meta, 64); });
    REQUIRE(e2);
    CHECK(contains(e2->what(), "does not fit"));
  }
  SUBCASE("metadata is written") {
    const std::map<std::string, std::string> meta{{"x", "y"}};
    const std::string with = encode_safetensors_header(tensors, &meta);
    const std::string f3 = with + std::string(11, '\0');
    const auto h3 = parse_safetensors(f3, f3.size(), "enc");
    CHECK(h3.has_metadata);
    CHECK(h3.metadata == meta);
    // The JSON is an object whose keys are the tensors and __metadata__.
    const auto j = nlohmann::json::parse(with.substr(8));
    CHECK(j.size() == 3);
    CHECK(j["a"]["dtype"] == "F32");
    CHECK(j["a"]["data_offsets"] == nlohmann::json::array({0, 8}));
    CHECK(j["__metadata__"]["x"] == "y");
  }
}
