#include "hfdelta/fleet.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "format/completion_marker.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "root/root_view.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using json = nlohmann::json;

namespace {

using Status = FleetVersion::Status;

double mtime_of(const fs::path& p) {
  boost::system::error_code ec;
  const std::time_t t = fs::last_write_time(p, ec);
  return ec ? 0 : double(t);
}

// For the view only: an unreadable directory counts as nothing.
std::uint64_t bytes_of(const fs::path& dir) {
  try {
    return tree_bytes(dir);
  } catch (const Error&) {
    return 0;
  }
}

std::optional<double> density_of(const DeltaIndex& idx) {
  if (!idx.elements || !idx.elements->total) return std::nullopt;
  return double(idx.elements->changed) / double(idx.elements->total);
}

// A version directory as a reader sees it: delta or full, complete or not.
FleetVersion look_at(std::uint64_t version, const fs::path& dir, bool require_marker) {
  FleetVersion f;
  f.version = version;
  f.bytes = bytes_of(dir);
  const fs::path marker = dir / kCompleteFile;
  f.marker = exists_nofollow(marker);
  f.published = mtime_of(f.marker ? marker : dir);
  try {
    const std::optional<DeltaIndex> idx = read_index_if_delta(dir);
    f.full = !idx;
    if (idx) f.base = idx->base_version, f.density = density_of(*idx);
    const Completeness c = check_complete(dir, require_marker);
    if (!c.complete) f.status = Status::uploading, f.note = c.missing + " is not there yet";
  } catch (const Error& e) {  // shown, not thrown: the view lists what it can
    f.status = Status::damaged;
    f.note = e.what();
  }
  return f;
}

// A full version's delta beside it: its base and size.
void add_sidecar(FleetVersion& f, const fs::path& dir) {
  f.delta_beside = true;
  f.delta_beside_bytes = bytes_of(dir);
  try {
    if (const std::optional<DeltaIndex> idx = read_index_if_delta(dir))
      f.base = idx->base_version, f.density = density_of(*idx);
  } catch (const Error&) {  // a damaged sidecar: a pull copies the full version instead
  }
}

std::vector<FleetVersion> versions_of(const fs::path& root, bool require_marker, std::set<std::uint64_t>& withdrawn) {
  std::vector<FleetVersion> out;
  const RootListing listing = list_root(root);
  for (const VersionDir& d : listing.all) {
    out.push_back(look_at(d.version, d.path, require_marker));
    if (auto s = listing.sidecars.find(d.version); s != listing.sidecars.end() && out.back().full)
      add_sidecar(out.back(), s->second);
  }
  withdrawn = listing.withdrawn;
  for (const std::uint64_t v : withdrawn) {
    FleetVersion f = look_at(v, root / withdrawn_dirname(v), false);
    f.status = Status::withdrawn;
    f.note.clear();
    out.push_back(std::move(f));
  }
  std::sort(out.begin(), out.end(), [](const FleetVersion& a, const FleetVersion& b) { return a.version < b.version; });
  return out;
}

// Version numbers in (held, newest], withdrawn ones not counted.
std::uint64_t versions_between(std::uint64_t held, std::uint64_t newest, const std::set<std::uint64_t>& withdrawn) {
  if (held >= newest) return 0;
  std::uint64_t n = newest - held;
  for (auto it = withdrawn.upper_bound(held); it != withdrawn.end() && *it <= newest; ++it) --n;
  return n;
}

// How far ahead of this machine's clock a report may be dated before its
// host's clock is said to run ahead. Synchronised clocks (NTP) agree within
// milliseconds; a report dated further ahead would look fresh for that much
// longer, never stale while its date stays ahead. A few seconds: far above the
// skew of synchronised clocks, far below any --fail-stale worth setting.
constexpr double kClockAheadTolerance = 5;

std::string ahead_problem(const fs::path& file, double ahead) {
  char buf[96];
  std::snprintf(buf, sizeof buf, ": dated %.0f s in the future", ahead);
  return file.string() + buf +
         ": the host's clock runs ahead, so the report's age cannot be told; set its clock right (NTP)";
}

FleetHost host_of(const fs::path& file, const FleetView& v, const std::set<std::uint64_t>& withdrawn) {
  FleetHost h;
  h.name = file.stem().string();
  try {
    h.report = read_host_report(file);
  } catch (const Error& e) {
    h.problem = e.what();
    return h;
  }
  if (!h.report) {  // gone between the listing and the read
    h.problem = file.string() + ": no longer there";
    return h;
  }
  h.age = std::max(0.0, v.now - h.report->time);
  if (const double ahead = h.report->time - v.now; ahead > kClockAheadTolerance) h.problem = ahead_problem(file, ahead);
  if (const auto held = h.report->version) {
    h.holds_withdrawn = withdrawn.count(*held) > 0;
    h.behind = v.newest_complete ? versions_between(*held, *v.newest_complete, withdrawn) : 0;
  }
  return h;
}

std::vector<FleetHost> hosts_of(const fs::path& dir, const FleetView& v, const std::set<std::uint64_t>& withdrawn) {
  std::vector<fs::path> files;
  boost::system::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    // Hidden names are reports being written (write_file_atomic's temporary files).
    // Whatever else is named like a report is a row: one that is not a regular
    // file (a link, a FIFO, a directory) shows with its problem, not skipped.
    if (name.empty() || name[0] == '.' || it->path().extension() != ".json") continue;
    files.push_back(it->path());
  }
  if (ec) fail(Exit::failure, dir, "cannot list directory: " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<FleetHost> hosts;
  for (const fs::path& f : files) hosts.push_back(host_of(f, v, withdrawn));
  return hosts;
}

}  // namespace

FleetView fleet_view(const fs::path& root, const std::optional<fs::path>& reports, bool require_marker) {
  require_dir(root, "give the publication root (is the share mounted?)");
  if (exists_nofollow(root / ".weight_sync"))
    fail(Exit::bad_input, root, "has .weight_sync/, so it is a LOCAL checkpoint, not a publication root");
  if (reports) {
    check_reports_apart(*reports, root, "--reports");
    require_dir(*reports, "give the directory the hosts write their reports to (delta-apply --report-to DIR)");
  }
  FleetView v;
  v.root = root.string();
  v.reports = reports ? reports->string() : "";
  v.now = unix_now();
  std::set<std::uint64_t> withdrawn;
  v.versions = versions_of(root, require_marker, withdrawn);
  for (const FleetVersion& f : v.versions) {
    if (f.status == Status::withdrawn) continue;
    v.newest = f.version;
    if (f.status == Status::complete) v.newest_complete = f.version;
  }
  for (const FleetVersion& f : v.versions)
    if (f.status == Status::uploading && v.newest_complete && f.version < *v.newest_complete)
      v.stalled.push_back(f.version);
  if (reports) v.hosts = hosts_of(*reports, v, withdrawn);
  return v;
}

// ---- output ---------------------------------------------------------------------

namespace {

const char* status_name(Status s) {
  switch (s) {
    case Status::complete:
      return "complete";
    case Status::uploading:
      return "uploading";
    case Status::withdrawn:
      return "withdrawn";
    case Status::damaged:
      return "damaged";
  }
  return "damaged";
}

json seconds_json(double s) { return std::round(s * 10) / 10; }

json version_entry(const FleetVersion& f, double now) {
  return {{"version", format_version(f.version)},
          {"kind", f.full ? "full" : "delta"},
          {"base_version", version_json(f.base)},
          {"delta_beside", f.delta_beside},
          {"bytes", f.bytes},
          {"delta_beside_bytes", f.delta_beside_bytes},
          {"density", f.density ? json(*f.density) : json()},
          {"published", iso_time(f.published)},
          {"age_seconds", seconds_json(std::max(0.0, now - f.published))},
          {"marker", f.marker},
          {"status", status_name(f.status)},
          {"note", f.note.empty() ? json() : json(f.note)}};
}

json host_entry(const FleetHost& h) {
  json j = {{"host", h.name}, {"problem", h.problem.empty() ? json() : json(h.problem)}};
  if (!h.report) {
    for (const char* k : {"version", "behind", "state", "exit_code", "error", "report_age_seconds", "time", "local",
                          "root", "hfdelta_version"})
      j[k] = nullptr;
    j["holds_withdrawn"] = false;
    return j;
  }
  const json r = host_report_json(*h.report);
  for (const char* k : {"version", "state", "exit_code", "error", "time", "local", "root", "hfdelta_version"})
    j[k] = r[k];
  j["behind"] = h.behind ? json(*h.behind) : json();
  j["holds_withdrawn"] = h.holds_withdrawn;
  j["report_age_seconds"] = seconds_json(h.age);
  return j;
}

}  // namespace

json fleet_json(const FleetView& v) {
  json versions = json::array(), hosts = json::array(), stalled = json::array();
  for (const FleetVersion& f : v.versions) versions.push_back(version_entry(f, v.now));
  for (const FleetHost& h : v.hosts) hosts.push_back(host_entry(h));
  for (const std::uint64_t s : v.stalled) stalled.push_back(format_version(s));
  return {{"root", v.root},
          {"reports", v.reports.empty() ? json() : json(v.reports)},
          {"time", iso_time(v.now)},
          {"newest_version", version_json(v.newest)},
          {"newest_complete", version_json(v.newest_complete)},
          {"stalled", stalled},
          {"versions", versions},
          {"hosts", hosts}};
}

namespace {

std::string size_text(std::uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = double(n);
  int u = 0;
  while (x >= 1024 && u < 4) x /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", x, units[u]);
  return buf;
}

std::string age_text(double s) {
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.0fm", s / 60);
  else if (s < 172800)
    std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  else
    std::snprintf(buf, sizeof buf, "%.1fd", s / 86400);
  return buf;
}

std::string or_dash(const std::optional<std::uint64_t>& v) { return v ? format_version(*v) : "-"; }

// `s` padded to `w` columns, on the left (a number) or the right (text).
std::string right(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
}
std::string left(const std::string& s, std::size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

std::string version_line(const std::string& version, const std::string& kind, const std::string& base,
                         const std::string& size, const std::string& density, const std::string& age,
                         const std::string& status) {
  return left(version, 8) + " " + left(kind, 6) + " " + left(base, 8) + " " + right(size, 11) + " " +
         right(density, 8) + " " + right(age, 7) + (status.empty() ? "" : "  " + status) + "\n";
}

std::string host_line(const std::string& host, const std::string& version, const std::string& behind,
                      const std::string& age, const std::string& code, const std::string& note) {
  return left(host, 16) + " " + left(version, 8) + " " + right(behind, 6) + " " + right(age, 10) + " " +
         right(code, 5) + (note.empty() ? "" : "  " + note) + "\n";
}

std::string version_row(const FleetVersion& f, double now) {
  std::string status = status_name(f.status);
  if (f.status == Status::complete && !f.marker) status += ", no marker";
  if (f.delta_beside) status += ", delta beside (" + size_text(f.delta_beside_bytes) + ")";
  if (!f.note.empty()) status += ": " + f.note;
  char density[32] = "-";
  if (f.density) std::snprintf(density, sizeof density, "%.3g%%", 100 * *f.density);
  return version_line(format_version(f.version), f.full ? "full" : "delta", or_dash(f.base), size_text(f.bytes),
                      density, age_text(std::max(0.0, now - f.published)), status);
}

std::string host_row(const FleetHost& h) {
  if (!h.report) return host_line(h.name, "-", "-", "-", "-", h.problem);
  const HostReport& r = *h.report;
  std::string note = r.waiting_for_peers ? "waiting for its peers" : r.error;
  if (h.holds_withdrawn) note = "holds a withdrawn version" + (note.empty() ? "" : "; " + note);
  if (!h.problem.empty()) note = h.problem + (note.empty() ? "" : "; " + note);
  const std::string behind = h.behind ? std::to_string(*h.behind) : "-";
  const std::string code = r.waiting_for_peers ? "-" : std::to_string(r.exit_code);
  return host_line(h.name, or_dash(r.version), behind, age_text(h.age), code, note);
}

}  // namespace

std::string fleet_text(const FleetView& v) {
  std::string out =
      v.root + ": newest version " + or_dash(v.newest) + ", newest complete " + or_dash(v.newest_complete) + "\n";
  if (!v.stalled.empty())
    out += "  stalled: " + format_version(v.stalled.front()) +
           " is incomplete below complete versions; withdraw it if its publisher died\n";
  out += version_line("version", "kind", "base", "size", "density", "age", "status");
  for (const FleetVersion& f : v.versions) out += version_row(f, v.now);
  if (v.reports.empty()) return out;
  out += "\n" + v.reports + ": " + std::to_string(v.hosts.size()) + " host report" + (v.hosts.size() == 1 ? "" : "s") +
         "\n";
  out += host_line("host", "version", "behind", "report age", "exit", "note");
  for (const FleetHost& h : v.hosts) out += host_row(h);
  return out;
}

std::vector<std::string> fleet_alerts(const FleetView& v, std::optional<std::uint64_t> max_behind,
                                      std::optional<double> max_age) {
  std::vector<std::string> out;
  if (!max_behind && !max_age) return out;
  for (const FleetHost& h : v.hosts) {
    if (!h.report) {
      out.push_back(h.name + ": its report cannot be read (" + h.problem + ")");
      continue;
    }
    if (!h.problem.empty()) {  // dated in the future: counted as an unreadable report is
      out.push_back(h.name + ": its report cannot be trusted (" + h.problem + ")");
      continue;
    }
    if (max_behind && !h.report->version && v.newest_complete)
      out.push_back(h.name + ": holds no version (newest complete " + format_version(*v.newest_complete) + ")");
    else if (max_behind && h.holds_withdrawn)
      out.push_back(h.name + ": holds " + format_version(*h.report->version) + ", which was withdrawn");
    else if (max_behind && h.behind && *h.behind > *max_behind)
      out.push_back(h.name + ": " + std::to_string(*h.behind) + (*h.behind == 1 ? " version" : " versions") +
                    " behind " + format_version(*v.newest_complete) + " (more than --fail-behind " +
                    std::to_string(*max_behind) + ")");
    if (max_age && h.age > *max_age) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ": its report is %.0f s old (more than --fail-stale %g)", h.age, *max_age);
      out.push_back(h.name + buf);
    }
  }
  return out;
}

}  // namespace hfdelta
