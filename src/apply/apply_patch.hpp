// Laying one entry over a tensor: decoded against the bytes in place, each
// change journaled with its old byte, both checksums checked; and replaying
// a journal onto LOCAL window by window.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "apply/apply_plan.hpp"
#include "hfdelta/hash.hpp"
#include "store/journal.hpp"
#include "util/io.hpp"

namespace hfdelta {

// Bytes of LOCAL read and written at a time.
inline constexpr std::size_t kWindow = 1 << 20;

// Writes one tensor of LOCAL from its journal record: window by window,
// front to back, hashing every window as it is written (or left alone).
class TensorWriter {
 public:
  TensorWriter(std::vector<File>& files, std::string what) : files_(files), what_(std::move(what)) {}
  void begin(const Patch& p);
  const Patch& patch() const { return *p_; }
  void change(std::span<const std::uint64_t> offs, std::span<const std::uint8_t> bytes);
  // The checksum of the tensor as written (not for a split entry, whose
  // windows are shared out between parts).
  Hash128 end();

 private:
  void close_window();
  void next_window(std::uint64_t rel);

  std::vector<File>& files_;
  std::string what_;
  const Patch* p_ = nullptr;
  std::vector<std::uint8_t> buf_;
  std::uint64_t ws_ = 0, we_ = 0;
  bool dirty_ = false;
  Hasher h_;
};

// Decodes one entry against `f`'s current bytes: journals every change (with
// `jw`) and checks both checksums. Without `out`, nothing is written, so a
// wrong base, a damaged frame or a wrong checksum is refused before anything
// is changed; with `out` (one pass), each window is written once its records
// are in the journal, and a refusal is undone by the rollback that follows.
// Without `jw` it patches a file being built beside LOCAL (`out` is `f`).
// `local_file` and `version` name the tensor's file and the delta in errors.
void journal_patch(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf,
                   const std::string& local_file, std::uint64_t version, File* out);

// Lays the layers of a stacked entry over [p.offset, p.offset + p.nbytes) of
// `f` in order, nothing journaled (a file being built, or a scratch copy);
// each part is checked against the checksum it records. A parts layer is laid
// region by region through the scratch file `region_scratch` (see
// journal_copy; none is given for a file being built, where the plan refuses
// parts).
void lay_stack(const Patch& p, File& f, const boost::filesystem::path& region_scratch, std::vector<std::uint8_t>& buf,
               const std::string& local_file, std::uint64_t version);

// A stacked or parts entry in place: laid over a copy of the tensor in
// `scratch` (inside the transaction's step, so nothing outlives it), and the
// copy journaled against LOCAL like any other entry, which checks LOCAL's
// whole base: the journal holds one record per byte that ends up changed,
// whatever the parts did in between. A parts entry's regions (also as a
// stacked layer) are each gathered into `scratch`.region, decoded, checked
// against the part's checksum and scattered back. Where the entry's checksum
// is not the tensor's (it ends with a parts entry), the copy's checksum is
// the tensor's new one, left in *p.computed for the record.
void journal_copy(const Patch& p, const File& f, const boost::filesystem::path& scratch, JournalWriter* jw,
                  std::vector<std::uint8_t>& buf, const std::string& local_file, std::uint64_t version, File* out);

// Journals (and with `out` writes) chunks [c0, c1) of a split sparse or
// context entry.
void journal_range(const Patch& p, std::uint64_t c0, std::uint64_t c1, const File& f, JournalWriter& jw,
                   std::vector<std::uint8_t>& buf, File* out);

}  // namespace hfdelta
