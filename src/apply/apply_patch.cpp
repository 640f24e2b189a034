// Laying entries over tensors and replaying journals (see apply_patch.hpp).
#include "apply/apply_patch.hpp"

#include <algorithm>
#include <cstring>

#include <boost/filesystem/operations.hpp>

#include "codec/codec.hpp"
#include "codec/codec_internal.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/version.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// Walks a tensor of LOCAL front to back in windows while sparse changes are
// laid over it: hashes the old and the new bytes and journals each change.
class Walker {
 public:
  // With `out`, each window that changes is written there as soon as its
  // journal records are in the journal file (the one-pass apply).
  // A range walker ([lo, hi) of a split entry) only patches: it reads the
  // windows that change and hashes nothing.
  // Without a journal (`jw` null) it patches a file being built, which has
  // nothing to undo.
  Walker(const File& f, const Patch& p, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out)
      : f_(f), p_(p), jw_(jw), buf_(buf), out_(out), hi_(p.nbytes) {}
  Walker(const File& f, const Patch& p, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out, std::uint64_t lo,
         std::uint64_t hi)
      : f_(f), p_(p), jw_(jw), buf_(buf), out_(out), hash_(false), hi_(hi), ws_(lo), we_(lo), done_(lo) {}
  void set(std::uint64_t pos, std::uint8_t v) {
    if (pos >= we_) load(pos);
    std::uint8_t& b = buf_[pos - ws_];
    if (b == v) return;
    if (jw_) jw_->change(pos, b, v);
    b = v;
    dirty_ = true;
  }
  // `n` new bytes from `pos` on (calls ascending): only those that differ
  // are journaled and written; equal runs are skipped eight bytes at a time.
  void overlay(std::uint64_t pos, const std::uint8_t* src, std::size_t n) {
    while (n) {
      if (pos >= we_) load(pos);
      const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(n, we_ - pos));
      std::uint8_t* b = buf_.data() + (pos - ws_);
      for (std::size_t k = 0; k < m; ++k) {
        if (k + 8 <= m && std::memcmp(b + k, src + k, 8) == 0) {
          k += 7;
          continue;
        }
        if (b[k] == src[k]) continue;
        if (jw_) jw_->change(pos + k, b[k], src[k]);
        b[k] = src[k];
        dirty_ = true;
      }
      pos += m, src += m, n -= m;
    }
  }
  // One element of `es` bytes (windows hold whole elements).
  template <std::size_t ES>
  void element(std::uint64_t pos, const std::uint8_t* v, SparseOp op) {
    if (pos >= we_) load(pos);
    std::uint8_t* b = buf_.data() + (pos - ws_);
    std::uint8_t t[ES];
    std::memcpy(t, b, ES);
    sparse_apply_value_t<ES>(t, v, op);
    for (std::size_t k = 0; k < ES; ++k)
      if (t[k] != b[k]) {
        if (jw_) jw_->change(pos + k, b[k], t[k]);
        b[k] = t[k], dirty_ = true;
      }
  }
  // The base bytes [pos, pos + n) of the window holding them, loaded as the
  // changes' windows are (the context decoder asks for them front to back,
  // one window at most, and patches each before it asks for the next).
  std::span<const std::uint8_t> base(std::uint64_t pos, std::size_t n) {
    if (pos >= we_) load(pos);
    if (pos < ws_ || pos + n > we_) fail(Exit::failure, "context base view outside the window");
    return {buf_.data() + (pos - ws_), n};
  }
  void finish() {
    close();
    if (hash_)
      while (done_ < p_.nbytes) read_both(std::min<std::uint64_t>(kWindow, p_.nbytes - done_));
  }
  Hash128 old_hash() const { return hb_.digest(); }
  Hash128 new_hash() const { return hn_.digest(); }
  std::uint32_t new_adler32() const { return an_.value(); }

 private:
  void close() {
    if (we_ > ws_) {
      if (out_ && dirty_) {
        if (jw_) jw_->flush();
        out_->pwrite_all(buf_.data(), static_cast<std::size_t>(we_ - ws_), p_.offset + ws_);
      }
      if (hash_) hash_new({buf_.data(), static_cast<std::size_t>(we_ - ws_)});
    }
    dirty_ = false;
    done_ = ws_ = we_;
  }
  void read_both(std::uint64_t n) {
    buf_.resize(static_cast<std::size_t>(n));
    f_.pread_exact(buf_.data(), buf_.size(), p_.offset + done_);
    hb_.update(buf_);
    hash_new(buf_);
    done_ += n;
    ws_ = we_ = done_;
  }
  void hash_new(std::span<const std::uint8_t> b) {
    hn_.update(b);
    if (p_.adler32) an_.update(b);
  }
  void load(std::uint64_t pos) {
    close();
    if (hash_)
      while (done_ + kWindow <= pos) read_both(kWindow);
    ws_ = done_ + (pos - done_) / kWindow * kWindow;  // windows stay aligned to the range start
    we_ = std::min<std::uint64_t>(ws_ + kWindow, hi_);
    buf_.resize(static_cast<std::size_t>(we_ - ws_));
    f_.pread_exact(buf_.data(), buf_.size(), p_.offset + ws_);
    if (hash_) hb_.update(buf_);
  }

  const File& f_;
  const Patch& p_;
  JournalWriter* jw_;
  std::vector<std::uint8_t>& buf_;
  File* out_;
  bool hash_ = true;
  std::uint64_t hi_;
  bool dirty_ = false;
  Hasher hb_, hn_;
  Adler32 an_;  // of the new bytes too, for an entry of an adler32 delta
  std::uint64_t ws_ = 0, we_ = 0, done_ = 0;
};

// LOCAL's bytes as the context decoder's base: the windows `w` walks.
BaseView base_view(Walker& w) {
  return [&w](std::uint64_t off, std::size_t n) { return w.base(off, n); };
}

// The decoder's batches of sparse changes, laid over LOCAL by `w` (one
// element size per entry, so the loop is specialised for it).
SparsePatch sparse_sink(Walker& w) {
  return [&w](std::span<const std::uint64_t> offs, std::span<const std::uint8_t> x, std::size_t es, SparseOp op) {
    auto each = [&]<std::size_t ES>() {
      for (std::size_t i = 0; i < offs.size(); ++i) w.element<ES>(offs[i], x.data() + i * ES, op);
    };
    switch (es) {
      case 1:
        return each.template operator()<1>();
      case 2:
        return each.template operator()<2>();
      case 4:
        return each.template operator()<4>();
      default:
        return each.template operator()<8>();
    }
  };
}

}  // namespace

void TensorWriter::begin(const Patch& p) {
  p_ = &p;
  ws_ = we_ = 0;
  dirty_ = false;
  h_.reset();
}

void TensorWriter::change(std::span<const std::uint64_t> offs, std::span<const std::uint8_t> bytes) {
  for (std::size_t k = 0; k < offs.size(); ++k) {
    const std::uint64_t rel = offs[k] - p_->offset;
    if (offs[k] < p_->offset || rel >= p_->nbytes || rel < ws_)
      fail(Exit::failure, what_ + ": journal change outside tensor '" + p_->tensor + "' or out of order");
    while (rel >= we_) next_window(rel);
    buf_[rel - ws_] = bytes[k];
    dirty_ = true;
  }
}

Hash128 TensorWriter::end() {
  if (!p_->split)
    while (we_ < p_->nbytes) next_window(we_);
  close_window();
  return h_.digest();
}

void TensorWriter::close_window() {
  if (we_ == ws_) return;
  if (dirty_) files_[p_->local_shard].pwrite_all(buf_.data(), buf_.size(), p_->offset + ws_);
  if (!p_->split) h_.update(buf_);
  dirty_ = false;
}

// Moves to the next window, or for a split entry straight to the window
// holding `rel` (windows are aligned to the tensor's start either way).
void TensorWriter::next_window(std::uint64_t rel) {
  close_window();
  ws_ = p_->split ? rel / kWindow * kWindow : we_;
  we_ = std::min<std::uint64_t>(ws_ + kWindow, p_->nbytes);
  buf_.resize(static_cast<std::size_t>(we_ - ws_));
  files_[p_->local_shard].pread_exact(buf_.data(), buf_.size(), p_->offset + ws_);
}

namespace {

struct Checksums {
  Hash128 before, after;    // of the tensor's old and new bytes
  std::uint32_t adler = 1;  // of the new bytes, for an entry of an adler32 delta
};

Checksums checksums_of(const Walker& w) { return {w.old_hash(), w.new_hash(), w.new_adler32()}; }

// New bytes given whole (a rewritten header, a stacked entry laid over a
// copy): only the bytes that differ are journaled and written.
Checksums lay_bytes(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out) {
  Walker w(f, p, jw, buf, out);
  if (p.source) {
    std::vector<std::uint8_t> nb(static_cast<std::size_t>(std::min<std::uint64_t>(kWindow, p.nbytes)));
    for (std::uint64_t at = 0; at < p.nbytes; at += nb.size()) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(nb.size(), p.nbytes - at));
      p.source->pread_exact(nb.data(), n, at);
      w.overlay(at, nb.data(), n);
    }
  } else {
    w.overlay(0, p.replace.data(), p.replace.size());
  }
  w.finish();
  return checksums_of(w);
}

// An xor entry: decoded window by window, each window XORed in place.
Checksums lay_xor(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out,
                  Decompressor& dc, const std::string& what) {
  Hasher hb, hn;
  Adler32 an;
  decode_xor(dc, p.frame, p.nbytes, what, [&](std::uint64_t off, std::span<const std::uint8_t> x) {
    buf.resize(x.size());
    f.pread_exact(buf.data(), x.size(), p.offset + off);
    hb.update(buf);
    bool dirty = false;
    const std::uint8_t* xp = x.data();
    std::uint8_t* bp = buf.data();
    const std::size_t n = x.size();
    for (std::size_t k = 0; k < n; ++k) {
      if (k + 8 <= n) {  // mostly zero: skip eight at a time
        std::uint64_t word;
        std::memcpy(&word, xp + k, 8);
        if (word == 0) {
          k += 7;
          continue;
        }
      }
      if (!xp[k]) continue;
      const std::uint8_t nb = bp[k] ^ xp[k];
      if (jw) jw->change(off + k, bp[k], nb);
      bp[k] = nb;
      dirty = true;
    }
    if (out && dirty) {
      if (jw) jw->flush();
      out->pwrite_all(buf.data(), buf.size(), p.offset + off);
    }
    hn.update(buf);
    if (p.adler32) an.update(buf);
  });
  return {hb.digest(), hn.digest(), an.value()};
}

Checksums lay_sparse(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out,
                     const std::string& what) {
  Walker w(f, p, jw, buf, out);
  decode_sparse(p.frame, p.nbytes, what, sparse_sink(w));
  w.finish();
  return checksums_of(w);
}

Checksums lay_context(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out,
                      const std::string& what) {
  Walker w(f, p, jw, buf, out);
  decode_context(p.frame, p.nbytes, what, base_view(w), sparse_sink(w));
  w.finish();
  return checksums_of(w);
}

Checksums lay_overwrite(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out,
                        Decompressor& d1, Decompressor& d2, const std::string& what) {
  Walker w(f, p, jw, buf, out);
  decode_overwrite(d1, d2, p.frame, p.nbytes, what,
                   [&](std::span<const std::uint64_t> pos, std::span<const std::uint8_t> val) {
                     for (std::size_t k = 0; k < pos.size(); ++k) w.set(pos[k], val[k]);
                   });
  w.finish();
  return checksums_of(w);
}

// One entry of its encoding laid over the tensor. Stacked and parts entries
// are laid layer by layer or part by part into a copy first (journal_copy),
// which then arrives here as bytes.
Checksums lay_entry(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf, File* out,
                    Decompressor& d1, Decompressor& d2, const std::string& what) {
  switch (p.encoding) {
    case Encoding::xor_bytes:
      return lay_xor(p, f, jw, buf, out, d1, what);
    case Encoding::sparse:
      return lay_sparse(p, f, jw, buf, out, what);
    case Encoding::context:
      return lay_context(p, f, jw, buf, out, what);
    case Encoding::overwrite:
      return lay_overwrite(p, f, jw, buf, out, d1, d2, what);
    case Encoding::stack:
    case Encoding::parts:
      break;
  }
  fail(Exit::failure, what + ": a " + std::string(encoding_name(p.encoding)) + " entry reached the patcher whole");
}

}  // namespace

void journal_patch(const Patch& p, const File& f, JournalWriter* jw, std::vector<std::uint8_t>& buf,
                   const std::string& local_file, std::uint64_t version, File* out) {
  thread_local Decompressor d1, d2;  // per thread: cheaper than one per tensor
  const std::string what = p.delta_file + ": entry '" + p.tensor + "'";
  if (jw) jw->begin_tensor(p.local_shard, p.offset);
  const std::string outcome = p.live ? "LOCAL was rolled back" : "nothing was changed";
  Checksums c;
  try {
    c = !p.replace.empty() || p.source ? lay_bytes(p, f, jw, buf, out) : lay_entry(p, f, jw, buf, out, d1, d2, what);
  } catch (Error& e) {
    e.set_path_if_none(p.delta_path);  // the codecs know only the entry's bytes
    // A context entry counts base elements: other base bytes stop its
    // decoding before the base checksum is complete. Say what the
    // checksum would have said.
    if (e.code() != Exit::verify_failed) throw;
    fail(Exit::verify_failed, local_file,
         "tensor '" + p.tensor + "' is not the base of delta " + format_version(version) +
             ", or the delta is damaged: " + e.what() + "; " + outcome);
  }
  if (jw) jw->end_tensor();
  if (p.base_hash && c.before != *p.base_hash)
    fail(Exit::verify_failed, local_file,
         "tensor '" + p.tensor + "' is not the base of delta " + format_version(version) + " (checksum " +
             c.before.hex() + ", the delta expects " + p.base_hash->hex() + "); " + outcome);
  // An adler32 delta records no XXH3-128: its Adler-32 is checked, and the
  // XXH3-128 kept for the checksum record and the check after writing.
  const bool adler_ok = p.adler32 && c.adler == *p.adler32;
  if (p.adler32 && !adler_ok)
    fail(Exit::verify_failed, local_file,
         "tensor '" + p.tensor + "' patched by " + what + " would have adler32 " + adler32_hex(c.adler) +
             ", the delta records " + adler32_hex(*p.adler32) +
             " (LOCAL is not this delta's base, or the delta is damaged); " + outcome);
  if (!p.adler32 && c.after != p.new_hash)
    fail(Exit::verify_failed, local_file,
         "tensor '" + p.tensor + "' patched by " + what + " would have checksum " + c.after.hex() +
             ", the delta records " + p.new_hash.hex() +
             " (LOCAL is not this delta's base, or the delta is damaged); " + outcome);
  if (adler_ok && p.computed) *p.computed = c.after;
}

namespace {

// Copies region `g` of the matrix at `base` in `from` to a contiguous range
// at 0 in `to` (gather), or back (scatter), a row at a time.
void move_region(const File& from, File& to, std::uint64_t base, const MatrixShape& m, const Region& g, bool gather,
                 std::vector<std::uint8_t>& buf) {
  const std::uint64_t row_bytes = g.cols * m.es;
  if (g.contiguous(m)) {
    const std::uint64_t off = base + (g.row0 * m.cols + g.col0) * m.es;
    if (gather)
      copy_range(from, off, g.rows * row_bytes, to, 0);
    else
      copy_range(from, 0, g.rows * row_bytes, to, off);
    return;
  }
  buf.resize(static_cast<std::size_t>(std::min<std::uint64_t>(row_bytes, kWindow)));
  for (std::uint64_t r = 0; r < g.rows; ++r) {
    const std::uint64_t toff = base + ((g.row0 + r) * m.cols + g.col0) * m.es, roff = r * row_bytes;
    for (std::uint64_t k = 0; k < row_bytes; k += buf.size()) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), row_bytes - k));
      from.pread_exact(buf.data(), n, gather ? toff + k : roff + k);
      to.pwrite_all(buf.data(), n, gather ? roff + k : toff + k);
    }
  }
}

// Lays the parts of `pe` over [p.offset, p.offset + p.nbytes) of `f` (a
// scratch copy), each region gathered into `region_path`, decoded there,
// checked against the part's checksum and scattered back. `label` names the
// delta file (and the stacked layer) in errors.
void lay_parts(const Patch& p, const PartsEntry& pe, File& f, const fs::path& region_path, const std::string& label,
               std::vector<std::uint8_t>& buf, const std::string& local_file, std::uint64_t version) {
  if (region_path.empty()) fail(Exit::failure, label + ": a parts entry laid without a scratch file");
  const OnFailure remove_region([&] {
    boost::system::error_code ec;
    fs::remove(region_path, ec);
  });
  for (std::size_t i = 0; i < pe.parts.size(); ++i) {
    const PartRecord& pr = pe.parts[i];
    boost::system::error_code ec;
    fs::remove(region_path, ec);
    File g(region_path, File::Mode::create_exclusive);
    move_region(f, g, p.offset, pe.m, pr.region, true, buf);
    Patch q;
    q.tensor = p.tensor;
    q.delta_file = label + " (part " + std::to_string(i + 1) + " of " + std::to_string(pe.parts.size()) + ")";
    q.delta_path = p.delta_path;
    q.frame = pr.bytes;
    q.encoding = pr.enc;
    q.new_hash = pr.hash;
    q.live = p.live;
    q.offset = 0;
    q.nbytes = pr.region.elements() * pe.m.es;
    journal_patch(q, g, nullptr, buf, local_file, version, &g);
    move_region(g, f, p.offset, pe.m, pr.region, false, buf);
  }
  fs::remove(region_path);
}

// Removes `path` on the way out, whatever happens.
struct RemoveAfter {
  fs::path path;
  ~RemoveAfter() {
    boost::system::error_code ec;
    fs::remove(path, ec);
  }
};

}  // namespace

void lay_stack(const Patch& p, File& f, const fs::path& region_scratch, std::vector<std::uint8_t>& buf,
               const std::string& local_file, std::uint64_t version) {
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    const std::string label =
        p.delta_file + " (stacked layer " + std::to_string(i + 1) + " of " + std::to_string(p.layers.size()) + ")";
    if (i < p.layer_parts.size() && p.layer_parts[i]) {
      // Its regions are checked; the whole base is checked by the caller
      // (journal_copy), which computes the tensor's new checksum.
      lay_parts(p, *p.layer_parts[i], f, region_scratch, label, buf, local_file, version);
      continue;
    }
    Patch q;
    q.tensor = p.tensor;
    q.delta_file = label;
    q.delta_path = p.delta_path;
    q.frame = p.layers[i].bytes;
    q.encoding = p.layers[i].enc;
    q.new_hash = p.layers[i].hash;
    if (i == 0) q.base_hash = p.base_hash;  // later bases are the parts' own checked results
    q.live = p.live;
    q.offset = p.offset;
    q.nbytes = p.nbytes;
    journal_patch(q, f, nullptr, buf, local_file, version, &f);
  }
}

void journal_copy(const Patch& p, const File& f, const fs::path& scratch, JournalWriter* jw,
                  std::vector<std::uint8_t>& buf, const std::string& local_file, std::uint64_t version, File* out) {
  const RemoveAfter remove_scratch{scratch};
  File s(scratch, File::Mode::create_exclusive);
  copy_range(f, p.offset, p.nbytes, s, 0);
  Patch q = p;
  q.offset = 0;
  const fs::path region = scratch.string() + ".region";
  if (p.parts)
    lay_parts(q, *p.parts, s, region, p.delta_file, buf, local_file, version);
  else
    lay_stack(q, s, region, buf, local_file, version);
  Patch r = p;
  r.parts.reset();
  r.layers.clear();
  r.source = &s;
  if (p.computed) r.new_hash = hash_file_range(s, 0, p.nbytes, buf);
  journal_patch(r, f, jw, buf, local_file, version, out);  // checks the whole base checksum
  if (p.computed) *p.computed = r.new_hash;
  s.close();
}

void journal_range(const Patch& p, std::uint64_t c0, std::uint64_t c1, const File& f, JournalWriter& jw,
                   std::vector<std::uint8_t>& buf, File* out) {
  const std::string what = p.delta_file + ": entry '" + p.tensor + "'";
  jw.begin_tensor(p.local_shard, p.offset);
  Walker w(f, p, &jw, buf, out, c0 * p.chunk_bytes, std::min(p.nbytes, c1 * p.chunk_bytes));
  about_file(p.delta_path, [&] {
    if (p.encoding == Encoding::context)
      decode_context_chunks(p.frame, p.nbytes, c0, c1, what, base_view(w), sparse_sink(w));
    else
      decode_sparse_chunks(p.frame, p.nbytes, c0, c1, what, sparse_sink(w));
  });
  w.finish();
  jw.end_tensor();
}

}  // namespace hfdelta
