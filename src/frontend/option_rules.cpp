#include "hfdelta/option_rules.hpp"

#include <sstream>

#include "hfdelta/diff.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"

namespace hfdelta {

void check_option(const std::string& name, const std::string& problem) {
  if (!problem.empty()) fail(Exit::usage, name + " " + problem);
}

std::string level_rule() { return "must be " + std::to_string(kMinLevel) + " to " + std::to_string(kMaxLevel); }

std::string level_problem(long long level) {
  if (level >= kMinLevel && level <= kMaxLevel) return "";
  return level_rule() + ", not " + std::to_string(level);
}

std::string threads_rule() { return "must be 0 (all cores) or more"; }

std::string threads_problem(long long threads) {
  if (threads >= 0) return "";
  return threads_rule() + ", not " + std::to_string(threads);
}

std::string lock_timeout_rule(std::string_view to_wait) {
  return "must be a number of seconds >= 0 (" + std::string(to_wait) + ")";
}

std::string lock_timeout_problem(double seconds, std::string_view to_wait) {
  if (seconds >= 0) return "";  // NaN is not
  std::ostringstream value;
  value << seconds;
  return lock_timeout_rule(to_wait) + ", not " + value.str();
}

const std::vector<std::string>& encoding_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const EncodingInfo& e : kEncodings)
      if (e.whole_delta) v.emplace_back(e.name);
    v.emplace_back(kAutoEncoding);
    return v;
  }();
  return names;
}

std::string encoding_rule() {
  const std::vector<std::string>& names = encoding_names();
  std::string rule = "must be";
  for (std::size_t i = 0; i < names.size(); ++i)
    rule += (i == 0 ? " " : i + 1 == names.size() ? " or " : ", ") + names[i];
  return rule;
}

std::string encoding_problem(std::string_view name) {
  for (const std::string& n : encoding_names())
    if (n == name) return "";
  return encoding_rule() + ", not \"" + std::string(name) + "\"";
}

std::optional<Encoding> encoding_option(std::string_view name) {
  if (name == kAutoEncoding) return std::nullopt;
  return parse_encoding(name);
}

void set_diff_versions(DiffOptions& opts, const PublishTarget& t, std::optional<std::uint64_t> base_version,
                       const std::string& base_option) {
  if (!base_version && t.version == 0) fail(Exit::usage, "version 0 has no base; give " + base_option);
  opts.version = t.version;
  // In a root, the base is its newest version (below a withdrawn one, not
  // the number before).
  opts.base_version = base_version ? *base_version : t.newest ? *t.newest : t.version - 1;
  opts.root = t.root;
  if (opts.base_version >= opts.version) fail(Exit::usage, base_option + " must be lower than the version");
}

}  // namespace hfdelta
