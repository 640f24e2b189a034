#include "hfdelta/report_json.hpp"

#include <algorithm>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/host_report.hpp"
#include "hfdelta/version.hpp"

namespace hfdelta {

using json = nlohmann::json;

namespace {

// The state's exit code: 0 clean, else what the state says (ok: false).
json state_outcome(Exit code) { return {{"ok", code == Exit::ok}, {"exit_code", static_cast<int>(code)}}; }

// LOCAL as every JSON object names it: absolute and normalised, as the host
// reports store it, so that outputs of runs from other directories compare.
std::string absolute_local(const std::string& local) {
  boost::system::error_code ec;
  const boost::filesystem::path cwd = boost::filesystem::current_path(ec);
  if (ec) return local;
  return boost::filesystem::absolute(local, cwd).lexically_normal().string();
}

double density_of(const DiffSummary& s) { return s.elements ? double(s.elements_changed) / double(s.elements) : 0.0; }

}  // namespace

json phases_json(const ApplyResult& r) {
  const PhaseTimes& t = r.phases;
  json versions = json::array();
  for (const VersionPhases& v : r.version_phases)
    versions.push_back({{"version", format_version(v.version)},
                        {"full", v.full},
                        {"read", v.read},
                        {"patch", v.patch},
                        {"sync", v.sync}});
  return {{"lock", t.lock},
          {"read", t.read},
          {"patch", t.patch},
          {"sync", t.sync},
          {"then", t.then ? json(*t.then) : json()},
          {"before_then", t.before_then()},
          {"versions", std::move(versions)}};
}

std::uint64_t behind_complete(const ApplyResult& r) {
  if (r.no_version || !r.newest_complete || *r.newest_complete <= r.to_version) return 0;
  return *r.newest_complete - r.to_version;
}

json json_report(json j) {
  j["schema"] = kJsonSchema;
  if (!j.contains("ok")) j["ok"] = true;
  return j;
}

json error_json(int code, const std::string& message, const std::string& path) {
  json err = {{"kind", exit_kind(code)}, {"message", message}, {"path", nullptr}};
  if (!path.empty()) err["path"] = path;
  return {{"ok", false}, {"exit_code", code}, {"error", std::move(err)}};
}

namespace {

// A diff's entries per encoding it writes (those a delta may be written in):
// every one, by its name.
json diff_entries_json(const EncodingCounts& n) {
  json j = json::object();
  for (const EncodingInfo& e : kEncodings)
    if (e.whole_delta) j[std::string(e.name)] = n[e.encoding];
  return j;
}

}  // namespace

json diff_json(const std::string& out, const std::string& encoding, const DiffSummary& s) {
  const double density = density_of(s);
  return {{"out", out},
          {"version", format_version(s.version)},
          {"base_version", format_version(s.base_version)},
          {"encoding", encoding},
          {"tensors", s.tensors},
          {"tensors_changed", s.tensors_changed},
          {"elements", s.elements},
          {"elements_changed", s.elements_changed},
          {"density", density},
          {"tensor_bytes", s.tensor_bytes},
          {"bytes_changed", s.bytes_changed},
          {"full_bytes", s.full_bytes},
          {"delta_bytes", s.delta_bytes},
          {"files_changed", s.files_changed},
          {"files_removed", s.files_removed},
          {"entries", diff_entries_json(s.entries)},
          {"structure",
           {{"weight_files_built", s.shards_built},
            {"headers_rewritten", s.shards_rewritten},
            {"weight_files_removed", s.shards_removed},
            {"tensors_new", s.tensors_new}}},
          {"seconds", s.seconds}};
}

json squash_json(const std::string& out, const SquashSummary& s) {
  return {{"out", out},
          {"version", format_version(s.version)},
          {"base_version", format_version(s.base_version)},
          {"deltas", s.deltas},
          {"entries", s.entries},
          {"entries_composed", s.entries_composed},
          {"entries_dropped", s.entries_dropped},
          {"entries_stacked", s.entries_stacked},
          {"structure",
           {{"weight_files_built", s.shards_built},
            {"headers_rewritten", s.shards_rewritten},
            {"weight_files_removed", s.shards_removed}}},
          {"files_changed", s.files_changed},
          {"files_removed", s.files_removed},
          {"input_bytes", s.input_bytes},
          {"delta_bytes", s.delta_bytes},
          {"seconds", s.seconds}};
}

json full_json(const std::string& out, const FullSummary& f, const DiffSummary* sidecar,
               const std::string& sidecar_out) {
  json j = {{"out", out},        {"version", format_version(f.version)},
            {"full", true},      {"files", f.files},
            {"bytes", f.bytes},  {"seconds", f.seconds},
            {"sidecar", nullptr}};
  if (sidecar)
    j["sidecar"] = {{"out", sidecar_out},
                    {"base_version", format_version(sidecar->base_version)},
                    {"delta_bytes", sidecar->delta_bytes},
                    {"tensors_changed", sidecar->tensors_changed},
                    {"elements", sidecar->elements},
                    {"elements_changed", sidecar->elements_changed},
                    {"density", density_of(*sidecar)},
                    {"seconds", sidecar->seconds}};
  return j;
}

json change_json(const std::string& local, const ApplyResult& r) {
  json applied = json::array();
  for (auto a : r.applied) applied.push_back(format_version(a));
  json j = {{"local", absolute_local(local)},
            {"from_version", version_json(r.from_version)},
            {"to_version", format_version(r.to_version)},
            {"applied", applied},
            {"noop", r.noop},
            {"record_rewritten", r.record_rewritten},
            {"rolled_back", version_json(r.rolled_back)},
            {"tensors_patched", r.tensors_patched},
            {"delta_bytes", r.delta_bytes},
            {"files_written", r.files_written},
            {"files_removed", r.files_removed},
            {"seconds", r.seconds},
            {"phases", phases_json(r)}};
  if (r.no_version) j["to_version"] = nullptr;
  if (r.then_error)  // applied, then the `then` hook failed (exit 9, or 15: --peers), said here, in the one object
    j.update({{"ok", false},
              {"exit_code", static_cast<int>(r.then_code)},
              {"error",
               {{"kind", exit_kind(static_cast<int>(r.then_code))},
                {"message", *r.then_error},
                {"path", boost::filesystem::absolute(local).string()}}}});
  if (r.published) {  // --root: what ROOT publishes, and how far LOCAL is behind its newest
    j["versions_published"] = *r.published;
    j["newest_version"] = version_json(r.newest);
    j["behind"] = r.newest && !r.no_version ? *r.newest - std::min(*r.newest, r.to_version) : 0;
    j["behind_complete"] = behind_complete(r);
    j["was_behind"] = !r.from_version ? json()
                      : r.newest      ? json(*r.newest - std::min(*r.newest, *r.from_version))
                                      : json(0);
    j["not_published_yet"] = version_json(r.not_published_yet);
    j["waiting_for"] = r.not_published_yet ? json(r.waiting_for) : json();
    j["full_copied"] = version_json(r.full_copied);
    j["sidecars_applied"] = r.sidecars_applied;
    j["root_bytes"] = r.root_bytes;
    j["fallback"] = r.fallback.empty() ? json() : json(r.fallback);
    json newer = json::array();
    for (const auto v : r.newer_complete) newer.push_back(format_version(v));
    j["newer_complete"] = newer;
  }
  return j;
}

const char* status_state_name(const LocalStatus& s) {
  return s.pending ? "interrupted" : s.version ? "clean" : "uninitialised";
}

Exit status_exit(const LocalStatus& s) {
  return s.pending ? Exit::interrupted : s.version ? Exit::ok : Exit::uninitialised;
}

json status_json(const std::string& local, const LocalStatus& s) {
  json j{{"local", absolute_local(local)},
         {"state", status_state_name(s)},
         {"version", version_json(s.version)},
         {"pending", version_json(s.pending)}};
  j.update(state_outcome(status_exit(s)));
  return j;
}

const char* verify_state_name(VerifyReport::State s) {
  return s == VerifyReport::State::clean           ? "clean"
         : s == VerifyReport::State::interrupted   ? "interrupted"
         : s == VerifyReport::State::uninitialised ? "uninitialised"
                                                   : "corrupt";
}

Exit verify_exit(const VerifyReport& v) {
  return v.state == VerifyReport::State::clean           ? Exit::ok
         : v.state == VerifyReport::State::interrupted   ? Exit::interrupted
         : v.state == VerifyReport::State::uninitialised ? Exit::uninitialised
                                                         : Exit::corrupt;
}

json verify_json(const std::string& local, const VerifyReport& v) {
  json j{{"local", absolute_local(local)},
         {"state", verify_state_name(v.state)},
         {"version", version_json(v.version)},
         {"pending", version_json(v.pending)},
         {"weight_files", v.weight_files},
         {"tensors", v.tensors},
         {"files", v.files},
         {"bytes", v.bytes},
         {"problems", v.problems}};
  j.update(state_outcome(verify_exit(v)));
  return j;
}

}  // namespace hfdelta
