#include "hfdelta/version.hpp"

#include <algorithm>
#include <cstdio>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {
constexpr std::string_view kPrefix = "weight_v";
}

std::string format_version(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06llu", static_cast<unsigned long long>(v));
  return buf;
}

namespace {
// Decimal digits to a number; nullopt for anything else or on overflow.
std::optional<std::uint64_t> parse_digits(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<unsigned>(c - '0'), &v))
      return std::nullopt;
  }
  return v;
}
}  // namespace

std::uint64_t parse_version(std::string_view s, const std::string& what) {
  if (auto v = parse_digits(s)) return *v;
  fail(Exit::bad_input, what + ": version \"" + std::string(s) + "\" is not a decimal number");
}

std::optional<std::uint64_t> version_from_dirname(std::string_view name) {
  if (name.size() < kPrefix.size() + 6 || name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  return parse_digits(name.substr(kPrefix.size()));
}

std::string version_dirname(std::uint64_t v) { return std::string(kPrefix) + format_version(v); }

std::vector<VersionDir> scan_root(const fs::path& root) {
  boost::system::error_code ec;
  if (!fs::is_directory(root, ec)) fail(Exit::bad_input, root.string() + ": not a directory");
  std::vector<VersionDir> out;
  for (fs::directory_iterator it(root, ec), end; it != end && !ec; it.increment(ec)) {
    const auto v = version_from_dirname(it->path().filename().string());
    if (!v || !fs::is_directory(it->path())) continue;
    for (const auto& o : out)
      if (o.version == *v)
        fail(Exit::bad_input, root.string() + ": version " + format_version(*v) + " is published twice (" +
                                  o.path.filename().string() + ", " + it->path().filename().string() + ")");
    out.push_back({*v, it->path()});
  }
  if (ec) fail(Exit::failure, root.string() + ": cannot list directory: " + ec.message());
  std::sort(out.begin(), out.end(), [](const VersionDir& a, const VersionDir& b) { return a.version < b.version; });
  return out;
}

}  // namespace hfdelta
