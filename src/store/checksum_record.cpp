#include "store/checksum_record.hpp"

#include <algorithm>
#include <vector>

#include <boost/filesystem/operations.hpp>
#include <nlohmann/json.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/version.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"
#include "util/parallel.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

// --init rewrites a damaged record even when LOCAL's bytes are in place.
constexpr const char* kRecordHint = "; delta-apply --init SRC LOCAL rewrites it";

fs::path records_dir(const fs::path& local) { return local / kStateDir / "checksums"; }
fs::path record_path(const fs::path& local, std::uint64_t v) {
  return records_dir(local) / (format_version(v) + ".json");
}

// One thing to hash: a weight file's header, one of its tensors, or a whole file.
struct Item {
  std::string file, tensor;  // tensor empty: the header (weights) or the whole file
  bool weight = false;
  std::uint64_t offset = 0, size = 0;
  Hash128 hash;
};

std::vector<Item> items_of(const Checkpoint& c) {
  std::vector<Item> items;
  for (const auto& s : c.shards) {
    items.push_back({s.file, "", true, 0, 8 + s.header.header_len, {}});
    for (const auto& t : s.header.tensors)
      items.push_back({s.file, t.name, true, s.header.file_offset(t), t.nbytes(), {}});
  }
  return items;
}

void hash_items(const fs::path& dir, std::vector<Item>& items, int threads) {
  std::vector<std::size_t> order(items.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return items[a].size > items[b].size; });
  std::uint64_t total = 0;
  for (const Item& it : items) total += it.size;
  progress::begin("hash", total);
  parallel_for(order.size(), default_threads(threads), [&](std::size_t k, std::size_t) {
    Item& it = items[order[k]];
    const File f(dir / it.file, File::Mode::read);
    std::vector<std::uint8_t> buf;
    it.hash = hash_file_range(f, it.offset, it.size, buf);
    progress::add(it.size);
  });
}

ChecksumRecord record_of(const Checkpoint& c, const std::vector<Item>& items) {
  ChecksumRecord r;
  for (const auto& s : c.shards) r.weights[s.file].size = s.header.file_size;
  for (const auto& it : items) {
    if (!it.weight)
      r.files[it.file] = {it.size, it.hash};
    else if (it.tensor.empty())
      r.weights[it.file].header = it.hash;
    else
      r.weights[it.file].tensors[it.tensor] = it.hash;
  }
  return r;
}

std::vector<Item> other_items(const fs::path& dir, const Checkpoint& c) {
  std::vector<Item> items;
  for (const auto& f : list_local_files(dir)) {
    if (c.find_shard(f)) continue;
    boost::system::error_code ec;
    const auto size = fs::file_size(dir / f, ec);
    if (ec) fail(Exit::failure, dir / f, ec.message());
    items.push_back({f, "", false, 0, size, {}});
  }
  return items;
}

}  // namespace

ChecksumRecord compute_record(const fs::path& dir, const Checkpoint& c, int threads, std::uint64_t* bytes_hashed) {
  std::vector<Item> items = items_of(c);
  for (auto& it : other_items(dir, c)) items.push_back(std::move(it));
  hash_items(dir, items, threads);
  if (bytes_hashed)
    for (const auto& it : items) *bytes_hashed += it.size;
  return record_of(c, items);
}

ChecksumRecord compute_record(const fs::path& dir, int threads) {
  return compute_record(dir, open_checkpoint(dir), threads);
}

fs::path record_file(const fs::path& local, std::uint64_t version) { return record_path(local, version); }

std::optional<ChecksumRecord> read_record(const fs::path& local, std::uint64_t version) {
  const fs::path p = record_path(local, version);
  if (!exists_nofollow(p)) return std::nullopt;
  const std::string w = p.string();
  try {
    const json j = parse_json_text(read_small_file(p, kIndexJson.bytes), w, "checksum record", kIndexJson);
    ChecksumRecord r;
    for (const auto& [file, wj] : j.at("weights").items()) {
      WeightRecord& wr = r.weights[file];
      wr.size = wj.at("size").get<std::uint64_t>();
      wr.header = parse_hash_hex(wj.at("header").get<std::string>(), w);
      for (const auto& [t, h] : wj.at("tensors").items()) wr.tensors[t] = parse_hash_hex(h.get<std::string>(), w);
    }
    for (const auto& [file, fj] : j.at("files").items())
      r.files[file] = {fj.at("size").get<std::uint64_t>(), parse_hash_hex(fj.at("hash").get<std::string>(), w)};
    return r;
  } catch (const json::exception& e) {
    fail(Exit::bad_input, w, std::string("damaged checksum record: ") + e.what() + kRecordHint);
  } catch (const Error& e) {
    if (e.code() != Exit::bad_input) throw;
    fail_again(e, e.what() + std::string(kRecordHint));
  }
}

void write_record(const fs::path& local, std::uint64_t version, const ChecksumRecord& r, bool sync) {
  json weights = json::object(), files = json::object();
  for (const auto& [file, wr] : r.weights) {
    json t = json::object();
    for (const auto& [name, h] : wr.tensors) t[name] = h.hex();
    weights[file] = {{"size", wr.size}, {"header", wr.header.hex()}, {"tensors", t}};
  }
  for (const auto& [file, fr] : r.files) files[file] = {{"size", fr.size}, {"hash", fr.hash.hex()}};
  const json j = {{"version", format_version(version)}, {"weights", weights}, {"files", files}};
  boost::system::error_code ec;
  fs::create_directories(records_dir(local), ec);
  if (ec) fail(Exit::failure, records_dir(local), "cannot create: " + ec.message());
  write_file_atomic(record_path(local, version), j.dump(1) + "\n", sync);
}

void remove_record(const fs::path& local, std::uint64_t version) {
  if (exists_nofollow(record_path(local, version))) remove_path(record_path(local, version));
}

void prune_records(const fs::path& local, std::uint64_t keep) {
  boost::system::error_code ec;
  const std::string name = format_version(keep) + ".json";
  for (fs::directory_iterator it(records_dir(local), ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != name) fs::remove(it->path(), ec);
}

}  // namespace hfdelta
