// The records of a benchmark run (records.hpp).

#include "records.hpp"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <stdexcept>

using nlohmann::json;

namespace bench {

void emit(json rec, const std::string& kind, const RecordOut& r) {
  rec["kind"] = kind;
  for (const auto& l : r.labels) {
    const auto eq = l.find('=');
    if (eq == std::string::npos || eq == 0) throw std::runtime_error("--label " + l + ": expected KEY=VALUE");
    rec[l.substr(0, eq)] = l.substr(eq + 1);
  }
  const std::string line = rec.dump();
  std::cout << line << '\n';
  if (!r.append.empty()) {
    std::ofstream f(r.append, std::ios::app);
    f << line << '\n';
    if (!f) throw std::runtime_error(r.append + ": cannot append");
  }
}

json to_record(const Bound& b) {
  json r = {{"base", b.base},
            {"new", b.target},
            {"tensors", b.tensors},
            {"tensors_changed", b.tensors_changed},
            {"elements", b.elements},
            {"elements_changed", b.elements_changed},
            {"density", b.elements ? static_cast<double>(b.elements_changed) / static_cast<double>(b.elements) : 0.0},
            {"tensor_bytes", b.tensor_bytes},
            {"shard_bytes", b.shard_bytes},
            {"full_bytes", b.full_bytes},
            {"position_bits", b.position_bits},
            {"value_bits", b.value_bits},
            {"bound_bytes", (b.position_bits + b.value_bits) / 8},
            {"conditioned_bound_bytes", b.conditioned_bits / 8},
            {"threads", b.threads},
            {"seconds", b.seconds}};
  if (b.per_tensor) {
    json tensors = json::array();
    for (const Bound::Tensor& t : *b.per_tensor)
      tensors.push_back({{"name", t.name},
                         {"dtype", t.dtype},
                         {"width", t.width},
                         {"elements", t.elements},
                         {"changed", t.changed},
                         {"distinct_xor", t.distinct_xor},
                         {"position_bits", t.position_bits},
                         {"value_bits", t.value_bits}});
    r["per_tensor"] = tensors;
  }
  return r;
}

json to_record(const ReadFloor& f) {
  const double best = f.best();
  return {{"paths", f.paths},
          {"files", f.files},
          {"bytes", f.bytes},
          {"hash", f.kind.hash},
          {"write_back", f.kind.write_back},
          {"threads", f.threads},
          {"warm_pass_s", f.warm_pass_s},
          {"seconds", f.seconds},
          {"min_s", best},
          {"median_s", median(f.seconds)},
          {"gb_per_s", best > 0 ? static_cast<double>(f.bytes) / best / 1e9 : 0.0},
          {"checksum", f.checksum}};
}

json to_record(const Layout& l) {
  return {{"paths", l.paths},           {"files", l.files},
          {"bytes", l.bytes},           {"safetensors_files", l.safetensors_files},
          {"tensors", l.tensors},       {"header_bytes", l.header_bytes},
          {"json_files", l.json_files}, {"json_bytes", l.json_bytes}};
}

json to_record(const Warm& w) { return {{"files", w.files}, {"bytes", w.bytes}, {"seconds", w.seconds}}; }

json to_record(const Run& r) {
  json j = {{"argv", r.argv},
            {"exit", r.exit},
            {"wall_s", r.wall_s},
            {"user_s", r.user_s},
            {"sys_s", r.sys_s},
            {"ru_maxrss_kib", r.ru_maxrss_kib},
            {"peak_vm_rss_kib", r.peak_vm_rss_kib},
            {"peak_rss_anon_kib", r.peak_rss_anon_kib},
            {"samples", r.samples},
            {"interval_ms", r.interval_ms}};
  if (r.time_max_rss_kib) j["time_max_rss_kib"] = *r.time_max_rss_kib;
  return j;
}

json to_record(const Size& s) { return {{"paths", s.paths}, {"bytes", s.bytes}, {"files", s.files}}; }

json to_record(const Machine& m) {
  json j;
  j["nproc"] = m.nproc;
  j["hardware_threads"] = m.hardware_threads;
  if (m.cpu_model) j["cpu_model"] = *m.cpu_model;
  if (m.mem_total_bytes) j["mem_total_bytes"] = *m.mem_total_bytes;
  if (m.mem_available_bytes) j["mem_available_bytes"] = *m.mem_available_bytes;
  if (m.kernel) j["kernel"] = *m.kernel;
  j["os"] = m.os;
  json d;
  d["path"] = m.disk.path;
  if (m.disk.fs_size_bytes) d["fs_size_bytes"] = *m.disk.fs_size_bytes;
  if (m.disk.fs_avail_bytes) d["fs_avail_bytes"] = *m.disk.fs_avail_bytes;
  if (const auto& mt = m.disk.mount) {
    d["device"] = mt->device;
    d["mount"] = mt->mount;
    d["fs_type"] = mt->fs_type;
  }
  if (const auto& b = m.disk.block) {
    d["block_device"] = b->name;
    d["rotational"] = b->rotational;
    d["model"] = b->model;
    d["vendor"] = b->vendor;
    d["size_bytes"] = b->size_bytes;
  }
  j["disk"] = d;
  return j;
}

std::vector<json> read_records(const std::string& records_file) {
  std::vector<json> recs;
  std::ifstream f(records_file);
  if (!f) throw std::runtime_error(records_file + ": cannot read");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) recs.push_back(json::parse(line));
  return recs;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace bench
