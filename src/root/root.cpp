#include "hfdelta/root.hpp"

#include <cstdint>
#include <utility>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

std::vector<fs::path> chain_between(const fs::path& first, const fs::path& last) {
  const fs::path a = fs::absolute(first), b = fs::absolute(last);
  const auto va = version_from_dirname(a.filename().string()), vb = version_from_dirname(b.filename().string());
  for (const auto& [p, v] : {std::pair{first, va}, std::pair{last, vb}})
    if (!v) fail(Exit::bad_input, p, "--squash takes version directories named weight_vNNNNNN");
  if (a.parent_path() != b.parent_path())
    throw Error(Exit::bad_input, first.string() + " and " + last.string() + ": not in the same directory",
                last.string());
  if (*vb <= *va) fail(Exit::bad_input, last, "is not newer than " + first.string());
  std::vector<fs::path> chain;
  const std::set<std::uint64_t> withdrawn = scan_withdrawn(a.parent_path());
  for (std::uint64_t v = *va; v <= *vb; ++v) {
    const fs::path d = a.parent_path() / version_dirname(v);
    boost::system::error_code ec;
    if (withdrawn.count(v) && !fs::exists(d, ec)) continue;  // the next version is published on the one before
    if (!fs::is_directory(d, ec)) fail(Exit::bad_input, d, "missing; the chain from " + first.string() + " is broken");
    chain.push_back(d);
  }
  return chain;
}

}  // namespace hfdelta
