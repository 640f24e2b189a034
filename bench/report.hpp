// hfdelta-bench's report: OUT/results.md and OUT/results.json from the
// records of a run (records.hpp), sorted first into the plain structs below
// by what they describe (series, learning rate, pair, tool, mode).
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bench {

// The runs of one tool in one mode ("run" records): every wall and CPU time,
// the largest memory figures. NAN stands for "not measured".
struct Stat {
  std::vector<double> walls, cpus;  // wall and user+sys seconds of each run
  double max_rss_kib = NAN, peak_anon_kib = NAN, peak_vm_rss_kib = NAN;
  bool empty() const { return walls.empty(); }
  double min() const;  // the fastest run's wall
  double med() const;
  double cpu() const;  // CPU seconds of the fastest run
  void add(const nlohmann::json& run_record);
  nlohmann::json to_json() const;
};

// One tool (an hfdelta encoding or a peer) at one pair: its delta's size
// ("size" records) and its runs per mode.
struct ToolData {
  double wire = NAN;
  std::map<std::string, Stat> modes;             // diff, diff_1t, apply, apply_nosync, apply_nosync_1t
  const Stat* mode(const std::string& m) const;  // null when not measured
  double peak_anon() const;                      // over every mode
};

// One pair of consecutive saves of the main series.
struct PairData {
  std::string lr;
  int pair = 0;
  nlohmann::json bound;  // its "bound" record
  double floor_inputs = NAN, floor_local = NAN;
  // The floors of verified work: reading and hashing BASE+NEW (what any
  // checked diff reads), and reading, hashing and writing back LOCAL (what an
  // in-place apply does where every page holds a change).
  double floor_inputs_hashed = NAN, floor_local_rewrite = NAN;
  std::vector<std::string> tool_order;
  std::map<std::string, ToolData> tools;
  ToolData& tool(const std::string& t);  // added in order of first appearance
  const ToolData* find(const std::string& t) const;
};

using ToolMap = std::map<std::string, ToolData>;  // tool -> data

// What the records say, sorted by what they describe.
struct Records {
  std::vector<nlohmann::json> all;
  nlohmann::json machine, config = nlohmann::json::object(), marked_rec;
  std::vector<nlohmann::json> versions, loads, timings;
  std::vector<PairData> pairs;  // main series
  // Memory series: preset -> tool -> data.
  std::map<std::string, ToolMap> mem;
  std::map<std::string, double> mem_full;
  // Squash series: chain kind -> chain, squashed or direct -> data.
  std::map<std::string, ToolMap> squash;
  std::vector<std::string> squash_order;  // chain kinds in the order the script ran them

  PairData& pair_of(const std::string& lr, int pair);
};

Records sort_records(std::vector<nlohmann::json> records);

// Writes the Markdown report to MD_PATH and every figure, with the records, to JSON_PATH.
void write_report(const Records& rs, const std::string& md_path, const std::string& json_path);

}  // namespace bench
