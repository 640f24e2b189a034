// delta-fleet: thin command over hfdelta's fleet view (hfdelta/fleet.hpp):
// every version of a publication root and what each host reports holding.
// It reads only; delta-apply is what brings a host to a version.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "forms.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/fleet.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/version.hpp"

using namespace hfdelta;

namespace {

// What the command line asks for.
struct FleetCommandLine {
  std::vector<std::string> paths;
  std::string reports;
  std::optional<std::uint64_t> fail_behind;
  std::optional<double> fail_stale;
  bool require_marker = false, json_out = false, quiet = false;
};

void add_options(CLI::App& app, FleetCommandLine& o) {
  app.add_option("ROOT", o.paths, "The publication root")->group("");
  app.add_option("--reports", o.reports,
                 "The directory the hosts write their reports to (delta-apply --report-to DIR); "
                 "without it, only ROOT's versions are shown")
      ->type_name("DIR");
  app.add_option("--fail-behind", o.fail_behind,
                 "With --reports: exit 16 if a host is more than N versions behind the newest complete one")
      ->type_name("N")
      ->transform(cli::whole_number());
  app.add_option("--fail-stale", o.fail_stale, "With --reports: exit 16 if a report is older than SECONDS")
      ->type_name("SECONDS")
      ->check(cli::seconds());
  app.add_flag("--require-marker", o.require_marker,
               "Count a version as complete only once its completion marker (hfdelta_complete.json) and every file "
               "it lists are there, as a delta-apply --root --require-marker pull does");
  app.add_flag("--json", o.json_out, "Print the view as one JSON object on stdout");
  app.add_flag("-q,--quiet", o.quiet, "Print nothing; only the exit code tells (16: an alert)");
}

// Its one form, as a table all the same: the command line is checked
// against it, and --help's usage and the completion are made from it.
const cli::Command& fleet_command() {
  static const cli::Command c{
      "delta-fleet",
      "Show every version of a publication root and, with --reports, what each host holds; alert (exit 16) on "
      "hosts behind or silent. Reads only. See delta-fleet(1).",
      {{"",
        {"ROOT"},
        {"--reports", "--fail-behind", "--fail-stale", "--require-marker"},
        "the versions of ROOT and the hosts' reports in DIR"}},
      {"--json", "-q"},
      {{"--fail-behind", {"--reports"}, {}}, {"--fail-stale", {"--reports"}, {}}}};
  return c;
}

// Shows ROOT's versions and the hosts' reports; exit 16 for a host past
// --fail-behind or --fail-stale.
void run_fleet(const CLI::App& app, const FleetCommandLine& o) {
  cli::check_form(app, fleet_command(), cli::select_form(app, fleet_command()), o.paths);
  std::optional<boost::filesystem::path> reports;
  if (!o.reports.empty()) reports = strip_trailing_slashes(o.reports);
  const FleetView v = fleet_view(strip_trailing_slashes(o.paths[0]), reports, o.require_marker);
  const std::vector<std::string> alerts = fleet_alerts(v, o.fail_behind, o.fail_stale);
  std::string msg;
  for (const std::string& a : alerts) msg += (msg.empty() ? "" : "; ") + a;
  if (!alerts.empty()) msg = std::to_string(alerts.size()) + " alert(s): " + msg;
  if (o.json_out) {
    nlohmann::json j = fleet_json(v);
    if (!alerts.empty()) j.update(error_json(static_cast<int>(Exit::fleet_alert), msg));
    cli::print_json(j);
  } else if (!o.quiet) {
    std::fputs(fleet_text(v).c_str(), stdout);
  }
  if (!alerts.empty()) throw Error(Exit::fleet_alert, msg);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{fleet_command().about, "delta-fleet"};
  FleetCommandLine o;
  add_options(app, o);
  cli::set_forms(app, fleet_command());
  return cli::run(
      app, argc, argv, [&] { run_fleet(app, o); }, &o.json_out);
}
