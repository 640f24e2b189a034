// The records of a benchmark run: each measurement (measure.hpp) written as
// one JSON object, on stdout and appended as one line to the records file
// that scripts/bench/bench.sh keeps (OUT/raw/records.jsonl), with the labels
// the script gives it ("series", "lr", "pair", "tool", "mode", ...) and its
// "kind". The report (report.hpp) is made from that file alone.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "measure.hpp"

namespace bench {

// Where a record goes besides stdout, and the labels added to it.
struct RecordOut {
  std::string append;               // JSONL file to append to ("" = none)
  std::vector<std::string> labels;  // "key=value"
};

// Adds `kind` and the labels to REC, prints it on stdout and appends it to
// the records file.
void emit(nlohmann::json rec, const std::string& kind, const RecordOut& r);

// The record of each measurement (kinds bound, readfloor, warm, run, size, machine).
nlohmann::json to_record(const Bound& b);
nlohmann::json to_record(const ReadFloor& f);
nlohmann::json to_record(const Warm& w);
nlohmann::json to_record(const Run& r);
nlohmann::json to_record(const Size& s);
nlohmann::json to_record(const Layout& l);
nlohmann::json to_record(const Machine& m);

// Every record of a records file, in order.
std::vector<nlohmann::json> read_records(const std::string& records_file);

// The median of a list of seconds (0 for none): readfloor's median_s, and the report's.
double median(std::vector<double> v);

}  // namespace bench
