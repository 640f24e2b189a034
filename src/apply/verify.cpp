#include "hfdelta/verify.hpp"

#include <boost/filesystem/path.hpp>

#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "store/checksum_record.hpp"
#include "store/journal.hpp"
#include "store/local_store.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

VerifyReport verify_local(const fs::path& local, double lock_timeout, int threads) {
  check_local_path(local, Exit::uninitialised);
  LocalLock lock(local, lock_timeout, LocalLock::Mode::shared);  // creates nothing; read-only LOCALs too
  VerifyReport rep;
  const LocalState st = read_state(local);
  rep.version = st.version;
  rep.pending = st.pending;
  if (const auto v = interrupted_version(local)) rep.pending = v;
  if (rep.pending) {
    rep.state = VerifyReport::State::interrupted;
    return rep;
  }
  if (!rep.version) {
    rep.state = VerifyReport::State::uninitialised;
    return rep;
  }
  const auto rec = read_record(local, *rep.version);
  if (!rec)
    fail(Exit::bad_input, local,
         "no checksums are recorded for version " + format_version(*rep.version) +
             " (it was set up without them); re-initialise it with --init to record them");

  auto problem = [&](std::string s) { rep.problems.push_back(std::move(s)); };
  Checkpoint c;
  try {
    c = open_checkpoint(local);
  } catch (const Error& e) {
    if (e.code() != Exit::bad_input) throw;
    rep.problems.push_back(e.what());
    rep.state = VerifyReport::State::corrupt;
    return rep;
  }
  const ChecksumRecord now = compute_record(local, c, threads, &rep.bytes);
  rep.weight_files = now.weights.size();
  rep.files = now.files.size();
  for (const auto& [f, w] : now.weights) rep.tensors += w.tensors.size();

  const std::string L = local.string() + "/";
  for (const auto& [f, w] : rec->weights) {
    auto it = now.weights.find(f);
    if (it == now.weights.end()) {
      problem(L + f + ": weight file of version " + format_version(*rep.version) + " is missing");
      continue;
    }
    const WeightRecord& n = it->second;
    if (n.size != w.size) problem(L + f + ": " + std::to_string(n.size) + " bytes, recorded " + std::to_string(w.size));
    if (n.header != w.header) problem(L + f + ": safetensors header differs from the recorded one");
    for (const auto& [t, h] : w.tensors) {
      auto nt = n.tensors.find(t);
      if (nt == n.tensors.end())
        problem(L + f + ": tensor '" + t + "' is missing");
      else if (nt->second != h)
        problem(L + f + ": tensor '" + t + "' has checksum " + nt->second.hex() + ", recorded " + h.hex());
    }
    for (const auto& [t, h] : n.tensors)
      if (!w.tensors.count(t)) problem(L + f + ": tensor '" + t + "' is not in the record");
  }
  for (const auto& [f, w] : now.weights)
    if (!rec->weights.count(f))
      problem(L + f + ": weight file not in the record of version " + format_version(*rep.version));
  for (const auto& [f, r] : rec->files) {
    auto it = now.files.find(f);
    if (it == now.files.end())
      problem(L + f + ": file of version " + format_version(*rep.version) + " is missing");
    else if (it->second.size != r.size || it->second.hash != r.hash)
      problem(L + f + ": contents differ from the record (" + std::to_string(it->second.size) + " bytes, checksum " +
              it->second.hash.hex() + "; recorded " + std::to_string(r.size) + " bytes, " + r.hash.hex() + ")");
  }
  for (const auto& [f, r] : now.files)
    if (!rec->files.count(f)) problem(L + f + ": file not in the record of version " + format_version(*rep.version));
  if (!rep.problems.empty()) rep.state = VerifyReport::State::corrupt;
  return rep;
}

}  // namespace hfdelta
