// The entry encodings of the disk-delta format, one row each: the only place
// an encoding's name, magic, codes and rules are written (docs/format.md,
// "Encodings", holds the same table; tests/test_encodings.cpp compares them).
// Code that acts on an encoding either reads its row or switches over
// Encoding with no default (the build makes a missing case an error), so a
// new encoding is a new row, and the compiler lists the rest.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace hfdelta {

// The zstd level when none is given (--level 0): each frame kind's own,
// 3 for hfdelta's frames and 1 for the slime layout's (codec/codec.hpp).
inline constexpr int kDefaultLevel = 0;

enum class Encoding : std::uint8_t {
  xor_bytes,  // "xor": frame decodes to new XOR old, the tensor's full length
  overwrite,  // "overwrite": u32 K, K ascending u32 byte positions, K new bytes
  sparse,     // "sparse" (hfdelta's own): per chunk of elements, changed element
              // indices as varint gaps and the changed elements' differences as
              // byte planes, each stream its own zstd frame; 64-bit positions
  stack,      // "stack" (hfdelta's own, revision 4): entries of the encodings
              // above laid one after another (its layers), each with the
              // checksum of the bytes it leaves. Squashing writes it where a
              // tensor's entries do not compose without its base bytes.
  context,    // "context" (hfdelta's own, revision 5): like sparse, but each
              // change is coded in a context both ends derive from the base
              // element (its exponent bits): positions as gaps among the base
              // elements of the same context group, values per group.
              // Decoding needs the base bytes.
  parts,      // "parts" (hfdelta's own, revision 6): entries of regions of the
              // tensor seen as a matrix (its parts), each with its region's
              // new checksum (docs/format.md, "parts"); written by a sharded publisher.
};

struct EncodingInfo {
  Encoding encoding;
  std::string_view name;   // in the index, --encoding, --inspect and --json
  std::string_view magic;  // an entry's first 4 bytes; empty: the entry is one zstd frame
  // The u32 that names it in a stacked entry's layer records and a parts
  // entry's part records; none: it can be neither.
  std::optional<std::uint32_t> code;
  unsigned revision;  // the lowest hfdelta_format that has it
  bool chunked;       // independent chunks of 2^20 elements, split over threads
  bool needs_base;    // decoding reads the base bytes, not only the entry
  bool whole_delta;   // may be a delta's delta_encoding (and --encoding); else per tensor only
  bool in_parts;      // may be a part of a parts entry (every coded one may be a stacked layer)
};

// In the order of Encoding.
inline constexpr std::array<EncodingInfo, 6> kEncodings{{
    // encoding, name, magic, code, revision, chunked, needs_base, whole_delta, in_parts
    {Encoding::xor_bytes, "xor", "", 0, 1, false, false, true, true},
    {Encoding::overwrite, "overwrite", "", 1, 1, false, false, true, false},
    {Encoding::sparse, "sparse", "HFS2", 2, 2, true, false, true, true},
    {Encoding::stack, "stack", "HFK1", std::nullopt, 4, false, false, false, false},
    {Encoding::context, "context", "HFC1", 3, 5, true, true, true, true},
    {Encoding::parts, "parts", "HFR1", 4, 6, false, false, false, false},
}};

// delta_encoding (and --encoding) "auto": no entry encoding, but each
// entry's own in hfdelta_encodings.
inline constexpr std::string_view kAutoEncoding = "auto";

constexpr const EncodingInfo& encoding_info(Encoding e) { return kEncodings[static_cast<std::size_t>(e)]; }

constexpr bool table_in_enum_order() {
  for (std::size_t i = 0; i < kEncodings.size(); ++i)
    if (static_cast<std::size_t>(kEncodings[i].encoding) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "kEncodings: one row per Encoding, in its order");

constexpr std::string_view encoding_name(Encoding e) { return encoding_info(e).name; }
// sparse and context: entries of independent chunks of elements, which the
// diff engine scans in blocks and delta-apply splits over threads.
constexpr bool chunked(Encoding e) { return encoding_info(e).chunked; }

// A count per encoding (entries of each, in --json by the table's names).
struct EncodingCounts {
  std::array<std::uint64_t, kEncodings.size()> n{};
  std::uint64_t& operator[](Encoding e) { return n[static_cast<std::size_t>(e)]; }
  std::uint64_t operator[](Encoding e) const { return n[static_cast<std::size_t>(e)]; }
};

std::optional<Encoding> parse_encoding(std::string_view name);
// The encoding a stacked layer's or a part's record names; none for a code
// that names none.
std::optional<Encoding> encoding_of_code(std::uint32_t code);
// The record code of `e`, which must have one (Error(failure) otherwise:
// `what` says who asked).
std::uint32_t code_of(Encoding e, std::string_view what);

}  // namespace hfdelta
