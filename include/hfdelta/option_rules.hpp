// The rules of the options that delta-diff, delta-apply and the Python
// package take, kept once for all of them. Each rule is a phrase that follows
// the option's name as a front-end spells it ("--level", "level (of zstd)"):
// *_rule says what is allowed ("must be 1 to 19"), *_problem what is wrong
// with a value ("must be 1 to 19, not 20"; empty when it is allowed), and
// check_option throws a problem as Error(usage).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hfdelta/encodings.hpp"

namespace hfdelta {

struct DiffOptions;
struct PublishTarget;

// Throws Error(usage, name + " " + problem) unless `problem` is empty.
void check_option(const std::string& name, const std::string& problem);

// zstd's compression level.
inline constexpr int kMinLevel = 1;
inline constexpr int kMaxLevel = 19;
std::string level_rule();
std::string level_problem(long long level);

// Worker threads: 0 (all cores) or more.
std::string threads_rule();
std::string threads_problem(long long threads);

// Seconds to wait for a lock: a number >= 0; `to_wait` says how the
// front-end waits as long as it takes ("leave it out to wait").
std::string lock_timeout_rule(std::string_view to_wait);
std::string lock_timeout_problem(double seconds, std::string_view to_wait);

// The names an encoding option takes: the encodings a delta is written in,
// and "auto" (one chosen per tensor).
const std::vector<std::string>& encoding_names();
std::string encoding_rule();
std::string encoding_problem(std::string_view name);
// The encoding an allowed name gives: none for "auto".
std::optional<Encoding> encoding_option(std::string_view name);

// The versions of a delta published at `t` (publish_target) on
// `base_version` (none: the root's newest version, or the one before t's):
// opts.version, opts.base_version and opts.root. Error(usage) naming
// `base_option` (--base-version, base_version) for version 0 without a base
// given, and for a base that is not below the version.
void set_diff_versions(DiffOptions& opts, const PublishTarget& t, std::optional<std::uint64_t> base_version,
                       const std::string& base_option);

}  // namespace hfdelta
