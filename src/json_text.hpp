// Strict, bounded parsing of untrusted JSON (headers, indexes, manifests,
// state, checksum records).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "hfdelta/hash.hpp"

namespace hfdelta {

// Deeper nesting than any file of ours has; messages quote values, and
// quoting a value nested without bound would recurse without bound.
inline constexpr int kMaxJsonDepth = 64;

// What one JSON document may hold. A parsed document costs up to about 100
// bytes of memory per value (a key counts as one), so these bound the memory
// a hostile file can make a reader take (docs/crash-safety.md, "Hostile input").
struct JsonLimits {
  std::uint64_t bytes;   // the whole text
  std::uint64_t values;  // values and keys, at every depth
  int depth = kMaxJsonDepth;
};

// A safetensors header: about 10 values per tensor, so some 100,000 tensors
// in one weight file (the largest models have under 100,000 in all).
inline constexpr JsonLimits kHeaderJson{32u << 20, 1'000'000};
// An index (of a checkpoint or a delta) or a checksum record: a few values
// per tensor of the whole model.
inline constexpr JsonLimits kIndexJson{64u << 20, 1'000'000};
// A transaction manifest: a few values per file of the checkpoint.
inline constexpr JsonLimits kManifestJson{16u << 20, 500'000};
// LOCAL's state.json.
inline constexpr JsonLimits kStateJson{1u << 20, 1'000};

// Parses `text`: valid UTF-8 JSON within `limits`, no key twice in one object
// (a JSON library keeps one of them silently, so two readers could disagree).
// The limits and duplicates are checked by a first pass that builds nothing,
// so a hostile document is refused before it costs memory. Errors are
// Error(bad_input): "WHAT: SUBJECT is not valid UTF-8 JSON: ...", "... has
// duplicate key ...", "... is nested too deeply", "... has more than N values".
nlohmann::json parse_json_text(std::string_view text, const std::string& what, const std::string& subject,
                               const JsonLimits& limits);

// XXH3-128 of j.dump() (compact), computed as it is serialised: a large
// document is never held twice.
Hash128 xxh3_128_of_dump(const nlohmann::json& j);

}  // namespace hfdelta
