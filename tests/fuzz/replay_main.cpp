// Replays inputs through a fuzz target's LLVMFuzzerTestOneInput without
// libFuzzer, so that `meson test` checks every seed of testdata/fuzz with any
// compiler (and under the sanitizers in the sanitizer build), not only when
// scripts/ci/fuzz.sh runs. A broken invariant aborts, as it does under libFuzzer.
//
// Usage: replay_TARGET PATH...   (a file, or a directory of files)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_check.hpp"

namespace {

std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& p) {
  if (!std::filesystem::is_directory(p)) return {p};
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(p))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // the same order on every run
  return files;
}

std::vector<std::uint8_t> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH...\n", argv[0]);
    return 2;
  }
  std::size_t count = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& f : inputs_of(argv[i])) {
      const std::vector<std::uint8_t> data = read_all(f);
      LLVMFuzzerTestOneInput(data.data(), data.size());
      ++count;
    }
  }
  std::printf("replay: %zu inputs, every invariant held\n", count);
  // An empty corpus proves nothing: fail rather than pass vacuously.
  return count == 0 ? 1 : 0;
}
