#include <doctest/doctest.h>

#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"

using namespace hfdelta;

TEST_CASE("layout round-trips through the strict parser") {
  auto L = layout_safetensors({{"a", "BF16", {2, 3}, 12}, {"b", "F32", {}, 4}}, nullptr);
  std::string file = L.prefix + std::string(L.file_size - L.prefix.size(), '\0');
  auto h = parse_safetensors(file, file.size(), "x.safetensors");
  REQUIRE(h.tensors.size() == 2);
  CHECK(h.tensors[0].name == "b");  // F32 first: descending alignment
  CHECK(h.header_len % 8 == 0);
}
