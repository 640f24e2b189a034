// Strict parsing of untrusted JSON (headers, indexes, manifests, state).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace hfdelta {

// Deeper nesting than any file of ours has; messages quote values, and
// quoting a value nested without bound would recurse without bound.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`: valid UTF-8 JSON, no key twice in one object (a JSON library
// keeps one of them silently, so two readers could disagree), nesting at most
// kMaxJsonDepth. Errors are Error(bad_input): "WHAT: SUBJECT is not valid
// UTF-8 JSON: ...", "... has duplicate key ...", "... is nested too deeply".
nlohmann::json parse_json_text(std::string_view text, const std::string& what, const std::string& subject);

}  // namespace hfdelta
