// shard-probe DIR ENCODING rows|columns: the memory a ShardWriter adds for
// one piece far larger than its batch (tests/e2e_bounded.cpp runs it).
//
// A child process writes DIR/ckpt, one BF16 tensor of 8400 x 17000 (272 MiB),
// and makes DIR/mirror of it (delta-apply --init), so that none of that
// counts in this process's peak. This process then builds the piece in
// memory: the whole tensor ("rows": contiguous), or its columns 1000..17000
// ("columns", 256 MiB: every row read apart, batches ending mid-row), with
// every seventh element stepped; puts it through a ShardWriter and prints
//   rss_before_kib=N hwm_after_kib=M piece_bytes=P part_bytes=Q
// (VmRSS before put(), VmHWM after finish(): their difference is what the
// writer added). It then commits the version, applies it to the mirror and
// exits 1 unless the mirror's region is the piece, byte for byte.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/apply.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "util/io.hpp"

namespace fs = boost::filesystem;
using namespace hfdelta;

namespace {

constexpr std::uint64_t kRows = 8400, kCols = 17000, kEs = 2;

// The base element (r, c): a fixed pseudo-random 16-bit value.
std::uint16_t base_at(std::uint64_t r, std::uint64_t c) {
  std::uint64_t z = r * kCols + c + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::uint16_t>(z ^ (z >> 31));
}

long status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  return -1;
}

// The checkpoint a row block at a time, then the mirror made of it.
void write_mirror(const fs::path& dir) {
  const fs::path ck = dir / "ckpt";
  fs::create_directories(ck);
  const SafetensorsLayout l = layout_safetensors({{"w.weight", "BF16", {kRows, kCols}, kRows * kCols * kEs}}, nullptr);
  File f(ck / "model.safetensors", File::Mode::create_exclusive);
  f.pwrite_all(l.prefix.data(), l.prefix.size(), 0);
  std::vector<std::uint16_t> row(kCols);
  for (std::uint64_t r = 0; r < kRows; ++r) {
    for (std::uint64_t c = 0; c < kCols; ++c) row[c] = base_at(r, c);
    f.pwrite_all(row.data(), kCols * kEs, l.prefix.size() + l.tensors[0].begin + r * kCols * kEs);
  }
  f.close();
  std::ofstream(ck / "config.json") << "{}\n";
  ApplyOptions o;
  o.sync = false;
  init_local(ck, dir / "mirror", 0, o);
}

int run(const fs::path& dir, Encoding enc, bool columns) {
  const Region g = columns ? Region{0, kRows, 1000, kCols - 1000} : Region{0, kRows, 0, kCols};
  std::vector<std::uint16_t> piece(g.elements());
  for (std::uint64_t r = 0; r < g.rows; ++r)
    for (std::uint64_t c = 0; c < g.cols; ++c) {
      const std::uint64_t i = r * g.cols + c;
      piece[i] = static_cast<std::uint16_t>(base_at(g.row0 + r, g.col0 + c) + (i % 7 == 0));
    }
  const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size() * kEs);
  const fs::path root = dir / "root";
  fs::create_directories(root);
  const fs::path stage = make_shard_stage(root, 1);
  ShardWriter w(dir / "mirror", stage, 0, enc, 3);
  const std::vector<std::uint64_t> shape{kRows, kCols};
  const long before = status_kib("VmRSS:");
  w.put("w.weight", "BF16", shape, g, bytes);
  const std::vector<ShardPart> parts = w.finish(false);
  const long hwm = status_kib("VmHWM:");
  std::printf("rss_before_kib=%ld hwm_after_kib=%ld piece_bytes=%zu part_bytes=%llu\n", before, hwm, bytes.size(),
              static_cast<unsigned long long>(parts.empty() ? 0 : parts[0].size));
  if (parts.size() != 1 || w.mirror_bytes_read() != bytes.size()) return 1;
  const ShardCommit c = commit_sharded(root, dir / "mirror", stage, 1, 0, parts, false);
  ApplyOptions o;
  o.sync = false;
  apply_delta(c.out, dir / "mirror", o);
  // The mirror's region, a row at a time.
  const Checkpoint m = open_checkpoint(dir / "mirror");
  const auto ref = m.tensors.at("w.weight");
  const File f(m.dir / m.shards[ref.shard].file, File::Mode::read);
  const std::uint64_t at = m.shards[ref.shard].header.file_offset(m.info(ref));
  std::vector<std::uint8_t> row(g.cols * kEs);
  for (std::uint64_t r = 0; r < g.rows; ++r) {
    f.pread_exact(row.data(), row.size(), at + ((g.row0 + r) * kCols + g.col0) * kEs);
    if (std::memcmp(row.data(), bytes.data() + r * row.size(), row.size()) != 0) {
      std::fprintf(stderr, "shard-probe: row %llu of the mirror is not the piece's\n",
                   static_cast<unsigned long long>(r));
      return 1;
    }
  }
  std::printf("mirror holds the piece\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto enc = argc == 4 ? parse_encoding(argv[2]) : std::nullopt;
  if (!enc || (std::string(argv[3]) != "rows" && std::string(argv[3]) != "columns")) {
    std::fprintf(stderr, "usage: shard-probe DIR xor|sparse|context rows|columns\n");
    return 2;
  }
  try {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        write_mirror(argv[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shard-probe: %s\n", e.what());
        _exit(1);
      }
      _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
    return run(argv[1], *enc, std::string(argv[3]) == "columns");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shard-probe: %s\n", e.what());
    return 1;
  }
}
