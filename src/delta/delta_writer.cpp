#include "delta/delta_writer.hpp"

#include <algorithm>
#include <numeric>

#include <boost/filesystem/operations.hpp>

#include "delta/delta_format_internal.hpp"
#include "hfdelta/error.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Entries in file order: by target weight file, then by name, so that the
// output does not depend on the order they were made in.
std::vector<std::size_t> file_order(const std::vector<NewDeltaEntry>& entries) {
  std::vector<std::size_t> order(entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const NewDeltaEntry& x = entries[a];
    const NewDeltaEntry& y = entries[b];
    return x.target != y.target ? x.target < y.target : x.name < y.name;
  });
  return order;
}

// [begin, end) into `order` of each target's entries.
std::vector<std::pair<std::size_t, std::size_t>> groups_of(const std::vector<NewDeltaEntry>& entries,
                                                           const std::vector<std::size_t>& order) {
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  for (std::size_t i = 0; i < order.size();) {
    std::size_t k = i;
    while (k < order.size() && entries[order[k]].target == entries[order[i]].target) ++k;
    groups.emplace_back(i, k);
    i = k;
  }
  return groups;
}

}  // namespace

void check_delta_out(const fs::path& out) {
  boost::system::error_code ec;
  if (fs::exists(fs::symlink_status(out, ec))) fail(Exit::exists, out, "already exists; refusing to overwrite");
  require_dir(out.parent_path(), "create it first (mkdir -p " + out.parent_path().string() + ")");
}

DeltaWriter::DeltaWriter(const fs::path& out_path, bool sync_writes)
    : out(out_path), tmp(temp_path_beside(out_path)), sync(sync_writes) {
  boost::system::error_code ec;
  if (!fs::create_directory(tmp, ec) || ec) fail(Exit::failure, tmp, "cannot create: " + ec.message());
  dirs.insert(tmp);
}

void DeltaWriter::write_entries(DeltaIndex& idx, const std::vector<NewDeltaEntry>& entries, const EntryBody& body) {
  const std::vector<std::size_t> order = file_order(entries);
  const auto groups = groups_of(entries, order);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string name = delta_file_name(g, groups.size());
    std::vector<DeltaFileEntry> des;
    for (std::size_t i = groups[g].first; i < groups[g].second; ++i) {
      const NewDeltaEntry& e = entries[order[i]];
      des.push_back({e.name, e.size, e.new_hash});
      idx.weight_map[e.name] = name;
      if (!e.target.empty()) idx.targets[name] = e.target;
      if (e.base_hash) idx.base_checksums[e.name] = *e.base_hash;
      if (idx.per_tensor) idx.encodings[e.name] = e.encoding;
      total += e.size;
    }
    write_delta_file(
        tmp / name, des, [&](std::size_t k, File& f, std::uint64_t at) { body(order[groups[g].first + k], f, at); },
        sync);
  }
}

fs::path DeltaWriter::place(const char* sub, const std::string& rel) {
  const fs::path dst = tmp / sub / rel;
  fs::create_directories(dst.parent_path());
  for (fs::path d = dst.parent_path(); d != tmp; d = d.parent_path()) dirs.insert(d);
  return dst;
}

void DeltaWriter::put_header(const std::string& file, std::string_view bytes) {
  write_file_atomic(place(kHeadersDir, file), bytes, sync);
}

void DeltaWriter::copy_header(const std::string& file, const fs::path& from) {
  copy_file_atomic(from, place(kHeadersDir, file), sync);
}

void DeltaWriter::copy_file(const std::string& path, const fs::path& from) {
  copy_file_atomic(from, place(kFilesDir, path), sync);
}

DeltaWriter::~DeltaWriter() {
  if (done_) return;
  try {
    abandon();
  } catch (...) {}  // a destructor reports nothing
}

std::uint64_t DeltaWriter::publish(const DeltaIndex& idx) {
  const std::uint64_t bytes =
      publish_delta(tmp, out, write_delta_index_json(idx, total), idx.version, dirs, sync, expect);
  done_ = true;
  return bytes;
}

void DeltaWriter::abandon() {
  done_ = true;
  boost::system::error_code ec;
  fs::remove_all(tmp, ec);
}

}  // namespace hfdelta
