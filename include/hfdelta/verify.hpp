// delta-apply --verify: checking LOCAL against the checksums recorded for its
// version (checksum_record.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

struct VerifyReport {
  enum class State { clean, interrupted, uninitialised, corrupt } state = State::clean;
  std::optional<std::uint64_t> version, pending;
  std::uint64_t weight_files = 0, tensors = 0, files = 0, bytes = 0;  // what was checked
  std::vector<std::string> problems;                                  // one line each, naming the file
};

// Re-hashes LOCAL against the record of its version, under LOCAL's lock,
// changing nothing. Throws Error(bad_input) when no record exists for the
// version (LOCAL was set up by a tool that does not record one).
VerifyReport verify_local(const boost::filesystem::path& local, double lock_timeout, int threads);

}  // namespace hfdelta
