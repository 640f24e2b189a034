// Lookups in the table of encodings (hfdelta/encodings.hpp; docs/format.md,
// "Encodings").
#include "hfdelta/encodings.hpp"

#include <string>

#include "hfdelta/error.hpp"

namespace hfdelta {

std::optional<Encoding> parse_encoding(std::string_view name) {
  for (const EncodingInfo& e : kEncodings)
    if (e.name == name) return e.encoding;
  return std::nullopt;
}

std::optional<Encoding> encoding_of_code(std::uint32_t code) {
  for (const EncodingInfo& e : kEncodings)
    if (e.code == code) return e.encoding;
  return std::nullopt;
}

std::uint32_t code_of(Encoding e, std::string_view what) {
  const std::optional<std::uint32_t> c = encoding_info(e).code;
  if (!c) fail(Exit::failure, std::string(what) + ": \"" + std::string(encoding_name(e)) + "\" has no record code");
  return *c;
}

}  // namespace hfdelta
