// The tensor encoder shared by delta-diff and the publisher fed from memory:
// each tensor of the new version paired with its base bytes is hashed,
// compared and encoded into per-thread spool files, in parallel over tensors
// and over chunk ranges of large ones; the entries are then gathered from
// the spools into the delta files. Private to the library.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/filesystem/path.hpp>

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "hfdelta/hash.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace hfdelta {

// Where a tensor's bytes are read from: a file (read in blocks, or through
// its mapping for the whole-tensor encodings), or memory its owner keeps
// alive and unchanged while the tensor is encoded.
struct Source {
  const File* file = nullptr;
  const MappedFile* map = nullptr;  // the whole-tensor encodings of a file
  const std::uint8_t* memory = nullptr;

  // n bytes at `offset`, read (or copied) into `buf`: whatever is hashed
  // and encoded of them is one snapshot, even of memory its owner writes
  // meanwhile (a live parameter), so an entry always gives the bytes whose
  // checksum it records.
  const std::uint8_t* read(std::uint8_t* buf, std::size_t n, std::uint64_t offset) const {
    if (memory)
      std::memcpy(buf, memory + offset, n);
    else
      file->pread_exact(buf, n, offset);
    return buf;
  }
  std::span<const std::uint8_t> view(std::uint64_t offset, std::uint64_t n) const {
    if (memory) return {memory + offset, static_cast<std::size_t>(n)};
    return map->bytes(offset, n);
  }
};

// A piece of a frame or entry body in a thread's spool file.
struct Seg {
  int spool = -1;
  std::uint64_t offset = 0, size = 0;
  bool in_xspool = false;
};

// What one unit of work found in its range of a tensor.
struct RangeOut {
  Seg body;
  std::uint64_t elements_changed = 0, bytes_changed = 0;
  Hash128 new_sum;  // XXH3-128 of the new bytes the range encoded
};

// One tensor of the new version, where its base bytes are, and everything
// the units working on it produce.
struct Work {
  std::size_t nfile = 0, bfile = 0;  // weight file of the new version, of the base
  const TensorInfo* t = nullptr;
  const Source* nsrc = nullptr;  // where its new bytes are read (at noff)
  const Source* bsrc = nullptr;  // where its base bytes are read (at boff); not fresh
  std::uint64_t noff = 0, boff = 0;
  std::uint64_t nbytes = 0;
  bool fresh = false;                 // no base bytes: its entry is its bytes (xor with zeros)
  const std::string* from = nullptr;  // the base tensor its bytes come from (not fresh)
  std::size_t es = 1;                 // the chunked encodings' element size
  ContextField field;                 // the context encoding's field (its dtype's exponent)
  std::uint64_t chunks = 0;
  std::vector<RangeOut> ranges;  // one per unit scanning it, in tensor order
  // A split tensor: the first chunk of each range, and the XXH3-128 of each
  // range's new bytes as the hash unit read them. Each range's encoder
  // reads them again: the sums must agree, else the bytes changed in
  // between and the entry would not give its recorded checksum.
  std::vector<std::uint64_t> range_c0;
  std::vector<Hash128> range_sum;
  Hash128 base_hash, new_hash;
  bool base_hashed = false;  // base_hash is of the base bytes as read here
  // base_hash is known already (the publisher's mirror records it): the
  // base bytes are hashed all the same and must match it (Error(verify_failed)
  // naming `base_what`), so that a mirror altered since it was recorded is
  // caught before anything is published.
  bool base_hash_known = false;
  const std::string* base_what = nullptr;
  Encoding encoding = Encoding::sparse;  // sparse or context: chunked, its ranges hold the chunks
  Seg frame;                             // the entry, when it is not chunked
  // "auto", a large tensor: its xor frame's size estimated from a sample of
  // its blocks; set until the choice is made (try_xor, after the pass).
  std::optional<std::uint64_t> xor_estimate;
  std::uint64_t elements_changed = 0, bytes_changed = 0;
  bool changed() const { return elements_changed != 0; }
};

// A Work for tensor `t`: its sizes and sparse layout (sources, offsets and
// base are the caller's to set).
Work make_work(std::size_t nfile, const TensorInfo& t);

struct Worker;

// The spools and compressors of one delta being written: encode() may be
// called any number of times (delta-diff: once for every tensor; the
// publisher: once per tensor as it is given), then write_entry() gathers
// each changed tensor's entry. The spools live in `tmp` (the delta's
// temporary directory) and are removed by close() or the destructor.
class Encoder {
 public:
  // `encoding`: none is "auto" (context or xor per tensor, the smaller).
  Encoder(boost::filesystem::path tmp, std::optional<Encoding> encoding, int level, int threads);
  ~Encoder();
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  // Hashes, compares and encodes `works` (their sources must be readable
  // until it returns); progress::add()s each one's bytes (nbytes) as they
  // are done.
  void encode(std::span<Work* const> works);
  // A tensor whose changes were found elsewhere (the CUDA path: found on
  // the device, only they copied here), one FoundChunk per chunk (context:
  // ranked among `groups`, one per chunk). Its entry is the one encode()
  // writes for the same bytes, for an encoder of sparse or context
  // (Error(usage) otherwise). The base bytes are read a block at a time and
  // hashed (checked against a known base_hash, as encode() does); the new
  // bytes are those base bytes with the changes applied, hashed as the
  // new checksum: the entry gives the bytes its checksum is of.
  void encode_found(Work& w, std::span<const FoundChunk> chunks, std::span<const ContextGroups> groups);
  // The size of a changed tensor's entry, and its bytes into `f` at `at`.
  std::uint64_t entry_size(const Work& w) const;
  void write_entry(const Work& w, File& f, std::uint64_t at) const;
  // Closes and removes the spools.
  void close();

 private:
  void chunk_pass(std::span<Work* const> works);
  void frame_pass(std::span<Work* const> works);
  boost::filesystem::path tmp_;
  std::optional<Encoding> encoding_;
  Encoding chunked_;  // the chunked encoding of the chunk engine: sparse, or context (also "auto")
  int level_, threads_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace hfdelta
