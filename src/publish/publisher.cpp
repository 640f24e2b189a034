#include "hfdelta/publisher.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <set>
#include <thread>

#include <boost/filesystem/operations.hpp>

#include "delta/delta_reader.hpp"
#include "delta/delta_writer.hpp"
#include "diff/diff_engine.hpp"
#include "format/root_commit.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/delta_format.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/progress.hpp"
#include "hfdelta/publisher_mirror.hpp"
#include "hfdelta/safetensors.hpp"
#include "hfdelta/version.hpp"
#include "store/checksum_record.hpp"
#include "store/local_store.hpp"
#include "util/io.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

// The version being written: the mirror's layout, one Work per tensor, the
// delta's temporary directory and the encoder spooling into it.
struct Step {
  std::uint64_t version = 0, base_version = 0;  // base: the mirror's
  fs::path out;
  Checkpoint layout;  // the mirror's, at the step's base version
  std::vector<File> files;
  std::vector<MappedFile> maps;  // the whole-tensor encodings only
  std::vector<Source> srcs;
  std::vector<Work> works;
  std::map<std::string, std::size_t, std::less<>> by_name;
  std::string base_what;              // the mirror at the step's base version, for errors
  std::vector<char> given, declared;  // per work
  // The writer removes its directory unless published; declared before the
  // encoder, whose spools are in that directory, it is destroyed after it.
  std::unique_ptr<DeltaWriter> writer;
  std::unique_ptr<Encoder> encoder;
  std::chrono::steady_clock::time_point t0;
};

}  // namespace

struct MemoryPublisher::State {
  State(const fs::path& root, const fs::path& mirror, const PublisherOptions& opts)
      : m(root, mirror, opts, " (Publisher(root, mirror))") {}
  PublisherMirror m;
  std::unique_ptr<Step> step;
  // A version abandoned after an error inside put() or publish(): the
  // tensors given to it are gone, so nothing may silently go on in a new
  // one; only begin() or abort() clears this.
  std::string lost;
  // The mirror's advance in the background, and what it left.
  std::thread advance;
  std::optional<ApplyResult> advanced;
  std::exception_ptr advance_error;
};

namespace {

// The works of a step: every tensor of the mirror paired with itself (the
// new bytes come from memory, one tensor at a time). The base checksums come
// from the mirror's record of its version; the mirror's bytes are hashed as
// they are compared and must match it, so a mirror altered since is caught
// before the version is published, not when the mirror is advanced.
void plan_step(Step& st, const PublisherOptions& opts, const std::optional<ChecksumRecord>& record) {
  const bool frames = opts.encoding && !chunked(*opts.encoding);
  for (const Shard& sh : st.layout.shards) {
    st.files.emplace_back(st.layout.dir / sh.file, File::Mode::read);
    if (frames) st.maps.emplace_back(st.layout.dir / sh.file);
  }
  for (std::size_t i = 0; i < st.files.size(); ++i)
    st.srcs.push_back({&st.files[i], frames ? &st.maps[i] : nullptr, nullptr});
  for (std::size_t s = 0; s < st.layout.shards.size(); ++s) {
    const SafetensorsHeader& h = st.layout.shards[s].header;
    for (const TensorInfo& t : h.tensors) {
      Work w = make_work(s, t);
      w.bfile = s;
      w.bsrc = &st.srcs[s];
      w.boff = h.file_offset(t);
      w.from = &t.name;
      if (record)
        if (const auto f = record->weights.find(st.layout.shards[s].file); f != record->weights.end())
          if (const auto known = f->second.tensors.find(t.name); known != f->second.tensors.end())
            w.base_hash = known->second, w.base_hash_known = true;
      w.base_what = &st.base_what;
      st.by_name.emplace(t.name, st.works.size());
      st.works.push_back(std::move(w));
    }
  }
  st.given.assign(st.works.size(), 0);
  st.declared.assign(st.works.size(), 0);
}

std::size_t find_tensor(const Step& st, std::string_view name, const fs::path& mirror) {
  const auto it = st.by_name.find(name);
  if (it == st.by_name.end())
    fail(Exit::unsupported,
         "tensor '" + std::string(name) + "': not in mirror " + mirror.string() + " (version " +
             format_version(st.base_version) +
             "); a publisher from memory patches the mirror's tensors only: publish a new tensor set "
             "as a full version (delta-diff --full) and re-create the mirror from it");
  return it->second;
}

void check_tensor(const Step& st, const Work& w, std::string_view name, std::string_view dtype,
                  std::span<const std::uint64_t> shape, std::uint64_t nbytes, const fs::path& mirror) {
  const std::string where = "tensor '" + std::string(name) + "'";
  const bool same_shape = std::equal(shape.begin(), shape.end(), w.t->shape.begin(), w.t->shape.end());
  if (dtype != w.t->dtype || !same_shape)
    fail(Exit::unsupported, where + ": " + std::string(dtype) + " " + shape_string({shape.begin(), shape.end()}) +
                                ", but mirror " + mirror.string() + " (version " + format_version(st.base_version) +
                                ") holds it as " + w.t->dtype + " " + shape_string(w.t->shape) +
                                "; a publisher from memory keeps every dtype and shape: publish a changed layout as a "
                                "full version (delta-diff --full) and re-create the mirror from it");
  if (nbytes != w.nbytes)
    fail(Exit::bad_input, where + ": " + std::to_string(nbytes) + " bytes given, but " + w.t->dtype + " " +
                              shape_string(w.t->shape) + " takes " + std::to_string(w.nbytes));
}
void check_tensor(const Step& st, const Work& w, const TensorBytes& t, const fs::path& mirror) {
  check_tensor(st, w, t.name, t.dtype, t.shape, t.bytes.size(), mirror);
}

// The delta's index: as delta-diff writes it for a NEW of the mirror's layout.
DeltaIndex step_index(const Step& st, const PublisherOptions& opts) {
  DeltaIndex idx;
  idx.version = st.version;
  idx.base_version = st.base_version;
  idx.per_tensor = !opts.encoding;
  idx.encoding = opts.encoding.value_or(Encoding::xor_bytes);
  return idx;
}

// Every tensor not given must be declared unchanged.
void check_all_given(const Step& st, bool rest_unchanged) {
  if (rest_unchanged) return;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < st.works.size(); ++i)
    if (!st.given[i] && !st.declared[i]) missing.push_back(st.works[i].t->name);
  if (missing.empty()) return;
  std::string list;
  for (std::size_t i = 0; i < std::min<std::size_t>(missing.size(), 5); ++i)
    list += (i ? ", '" : "'") + missing[i] + "'";
  if (missing.size() > 5) list += ", ...";
  fail(Exit::usage, std::to_string(missing.size()) +
                        " tensor(s) of the mirror were neither given nor declared unchanged (" + list +
                        "); give every tensor, or declare the others unchanged; version " + format_version(st.version) +
                        " was not published");
}

// The summary delta-diff would print, counted over the mirror's tensors.
void count_step(const Step& st, const std::vector<const Work*>& changed, PublishSummary& ps) {
  DiffSummary& s = ps.diff;
  s.version = st.version;
  s.base_version = st.base_version;
  for (std::size_t i = 0; i < st.works.size(); ++i) {
    const Work& w = st.works[i];
    s.tensors += 1;
    s.elements += w.t->counted_elements();
    s.tensor_bytes += w.nbytes;
    ps.tensors_given += st.given[i] != 0;
    ps.tensors_declared_unchanged += !st.given[i];
  }
  for (const Work* w : changed) {
    s.count_entry(w->encoding);
    s.tensors_changed += 1, s.elements_changed += w->elements_changed, s.bytes_changed += w->bytes_changed;
  }
  for (const File& f : st.files) s.full_bytes += f.size();
  for (const auto& f : st.layout.other_files) s.full_bytes += fs::file_size(st.layout.dir / f);
}

// The mirror is at `held`, the version published last; ROOT's newest is
// `newest`, published by another publisher since this one last looked.
[[noreturn]] void overtaken(const fs::path& root, const fs::path& mirror, std::uint64_t held, std::uint64_t newest) {
  const fs::path dir = root / version_dirname(newest);
  fail(Exit::exists, dir,
       "version " + format_version(newest) +
           " was published by another publisher (a Publisher, a ShardedPublisher or delta-diff; " +
           published_when(dir) + ") while this publisher's mirror " + mirror.string() + " is at " +
           format_version(held) +
           "; nothing was published. One publisher per root: stop the other (often a job restarted "
           "while its old one still runs), then close this Publisher and open it again (opening "
           "catches the mirror up from ROOT) to publish on top of version " +
           format_version(newest));
}

// The version after `base` (the mirror's) begun: the mirror's layout and record, the delta's temporary
// directory in ROOT and the encoder spooling into it.
std::unique_ptr<Step> new_step(const fs::path& root, const fs::path& mirror, const PublisherOptions& opts,
                               std::uint64_t base) {
  auto st = std::make_unique<Step>();
  st->t0 = std::chrono::steady_clock::now();
  // The next number ROOT gives (past any withdrawn one), on the mirror's
  // version, which must be ROOT's newest.
  const PublishTarget t = publish_target(root, std::nullopt);
  if (t.newest.value_or(0) > base) overtaken(root, mirror, base, *t.newest);
  if (t.newest.value_or(0) != base)
    fail(Exit::out_of_order, root,
         "its newest version is " + format_version(t.newest.value_or(0)) + ", not the mirror's (" +
             format_version(base) +
             "); another publisher, or a version "
             "withdrawn since: open the publisher again");
  st->version = t.version;
  st->base_version = base;
  st->out = t.out;
  check_delta_out(st->out);
  st->layout = open_checkpoint(mirror);
  st->base_what = "mirror " + mirror.string() + " (version " + format_version(base) +
                  "; delta-apply --verify checks it, delta-apply --init re-creates it)";
  plan_step(*st, opts, read_record(mirror, base));
  std::uint64_t total = 0;
  for (const Work& w : st->works) total += w.nbytes;
  progress::begin("publish", total);
  st->writer = std::make_unique<DeltaWriter>(st->out, opts.sync);
  st->writer->expect = {root, st->version, base};  // checked again at the rename
  st->encoder = std::make_unique<Encoder>(st->writer->tmp, opts.encoding, opts.level, opts.threads);
  return st;
}

}  // namespace

MemoryPublisher::MemoryPublisher(const fs::path& root, const fs::path& mirror, const PublisherOptions& opts)
    : s_(std::make_unique<State>(root, mirror, opts)) {}

MemoryPublisher::~MemoryPublisher() {
  abort_step();
  if (s_->advance.joinable()) s_->advance.join();
}

const PublisherOpening& MemoryPublisher::opening() const { return s_->m.opening(); }

std::uint64_t MemoryPublisher::version() const { return s_->m.version(); }

bool MemoryPublisher::in_progress() const { return s_->step != nullptr; }

std::optional<ApplyResult> MemoryPublisher::wait() {
  if (s_->advance.joinable()) s_->advance.join();
  std::optional<ApplyResult> r = std::move(s_->advanced);
  s_->advanced.reset();
  if (std::exception_ptr e = std::exchange(s_->advance_error, nullptr)) std::rethrow_exception(e);
  return r;
}

void MemoryPublisher::begin() {
  s_->lost.clear();
  open_step();
}

// The version under way, begun if there is none (put, unchanged, publish);
// refused after a version was lost.
void MemoryPublisher::open_step() {
  if (s_->step) return;
  if (!s_->lost.empty())
    fail(Exit::usage, s_->lost + "; the tensors given to it are gone: begin() the version anew (or abort())");
  wait();
  // The mirror must be at the version published last: after a failed or
  // never started advance, or a change by another process, reconcile first.
  const std::uint64_t base = s_->m.reconcile();
  s_->step = new_step(s_->m.root(), s_->m.mirror(), s_->m.options(), base);
}

// Abandons the version under way after an error, remembering it as lost.
void MemoryPublisher::lose_step(const std::string& why) {
  if (!s_->step) return;
  s_->lost = "version " + format_version(s_->step->version) + " was abandoned after an error (" + why + ")";
  abort_step();
}

void MemoryPublisher::put(const TensorBytes& t) { put(std::span<const TensorBytes>(&t, 1)); }

void MemoryPublisher::put(std::span<const TensorBytes> batch) {
  open_step();
  Step& st = *s_->step;
  std::vector<Work*> works;
  std::vector<Source> memory(batch.size());
  for (std::size_t k = 0; k < batch.size(); ++k) {
    const TensorBytes& t = batch[k];
    const std::size_t i = find_tensor(st, t.name, s_->m.mirror());
    Work& w = st.works[i];
    if (st.given[i] || st.declared[i] || std::find(works.begin(), works.end(), &w) != works.end())
      fail(Exit::usage, "tensor '" + std::string(t.name) + "': given twice for version " + format_version(st.version));
    check_tensor(st, w, t, s_->m.mirror());  // a mistake: no source was set yet for any
    memory[k].memory = t.bytes.data();
    works.push_back(&w);
  }
  for (std::size_t k = 0; k < works.size(); ++k) works[k]->nsrc = &memory[k], works[k]->noff = 0;
  try {
    st.encoder->encode(works);
  } catch (const std::exception& e) {
    for (Work* w : works) w->nsrc = nullptr;
    lose_step(e.what());  // the spools may hold half an entry
    throw;
  }
  for (Work* w : works) {
    w->nsrc = nullptr;  // the caller's bytes are not kept
    st.given[static_cast<std::size_t>(w - st.works.data())] = 1;
  }
}

void MemoryPublisher::put_found(const TensorFound& t) {
  open_step();
  Step& st = *s_->step;
  const std::size_t i = find_tensor(st, t.name, s_->m.mirror());
  Work& w = st.works[i];
  if (st.given[i] || st.declared[i])
    fail(Exit::usage, "tensor '" + std::string(t.name) + "': given twice for version " + format_version(st.version));
  if (!s_->m.options().encoding || !chunked(*s_->m.options().encoding))
    fail(Exit::usage,
         "tensor '" + std::string(t.name) + "': changes found elsewhere are encoded as sparse or context, not " +
             (s_->m.options().encoding ? std::string(encoding_name(*s_->m.options().encoding)) : std::string("auto")) +
             ": give the tensor's bytes");
  check_tensor(st, w, t.name, t.dtype, t.shape, t.nbytes, s_->m.mirror());
  try {
    st.encoder->encode_found(w, t.chunks, t.groups);
  } catch (const std::exception& e) {
    lose_step(e.what());  // the spools may hold half an entry
    throw;
  }
  st.given[i] = 1;
}

std::optional<Hash128> MemoryPublisher::found_base(std::string_view name, std::string_view dtype,
                                                   std::span<const std::uint64_t> shape, std::uint64_t nbytes) {
  open_step();
  Step& st = *s_->step;
  const std::size_t i = find_tensor(st, name, s_->m.mirror());
  const Work& w = st.works[i];
  if (st.given[i] || st.declared[i])
    fail(Exit::usage, "tensor '" + std::string(name) + "': given twice for version " + format_version(st.version));
  if (!s_->m.options().encoding || !chunked(*s_->m.options().encoding))
    fail(Exit::usage,
         "tensor '" + std::string(name) + "': changes found elsewhere are encoded as sparse or context, not " +
             (s_->m.options().encoding ? std::string(encoding_name(*s_->m.options().encoding)) : std::string("auto")) +
             ": give the tensor's bytes");
  check_tensor(st, w, name, dtype, shape, nbytes, s_->m.mirror());
  if (!w.base_hash_known) return std::nullopt;
  return w.base_hash;
}

std::optional<Hash128> MemoryPublisher::given_checksum(std::string_view name) const {
  if (!s_->step) return std::nullopt;
  const auto it = s_->step->by_name.find(name);
  if (it == s_->step->by_name.end() || !s_->step->given[it->second]) return std::nullopt;
  return s_->step->works[it->second].new_hash;
}

const fs::path& MemoryPublisher::mirror() const { return s_->m.mirror(); }

const PublisherOptions& MemoryPublisher::options() const { return s_->m.options(); }

void MemoryPublisher::unchanged(std::string_view name) {
  open_step();
  Step& st = *s_->step;
  const std::size_t i = find_tensor(st, name, s_->m.mirror());
  if (st.given[i]) fail(Exit::usage, "tensor '" + std::string(name) + "': given, then declared unchanged");
  st.declared[i] = 1;
}

PublishSummary MemoryPublisher::publish(bool rest_unchanged) {
  open_step();
  Step& st = *s_->step;
  check_all_given(st, rest_unchanged);
  PublishSummary ps;
  ps.out = st.out;
  std::vector<NewDeltaEntry> entries;
  std::vector<const Work*> changed;
  for (std::size_t i = 0; i < st.works.size(); ++i) {
    const Work& w = st.works[i];
    if (!st.given[i] || !w.changed()) continue;
    entries.push_back(
        {w.t->name, st.layout.shards[w.nfile].file, st.encoder->entry_size(w), w.new_hash, w.base_hash, w.encoding});
    changed.push_back(&w);
  }
  count_step(st, changed, ps);
  DeltaIndex idx = step_index(st, s_->m.options());
  idx.elements = DeltaIndex::Elements{ps.diff.elements, ps.diff.elements_changed};
  try {
    st.writer->write_entries(
        idx, entries, [&](std::size_t i, File& f, std::uint64_t at) { st.encoder->write_entry(*changed[i], f, at); });
    st.encoder->close();
    ps.diff.delta_bytes = st.writer->publish(idx);
  } catch (const std::exception& e) {
    boost::system::error_code ec;
    if (fs::exists(st.writer->tmp, ec) || !fs::exists(st.out, ec)) {  // not renamed into place
      lose_step(e.what());
      throw;
    }
    // Renamed into place, then a later step failed (flushing ROOT): the
    // version is published all the same.
    s_->m.published(st.version);
    const fs::path out = st.out;  // `st` lives in the step reset next
    s_->step.reset();
    fail(Exit::failure, out,
         std::string("published, but ") + e.what() + "; the next publish advances the mirror to it first");
  }
  ps.diff.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.t0).count();
  // Published: from here on the mirror is behind until advanced (a thread
  // that never starts leaves it so). It follows through delta-apply's own
  // path: journalled, checked against the checksums the delta carries, recorded.
  s_->m.published(st.version);
  s_->step.reset();
  const fs::path delta = ps.out, mirror = s_->m.mirror();
  auto advance = [this, delta, mirror] {
    try {
      s_->advanced = s_->m.advance(delta);
    } catch (const Error& e) {
      s_->advance_error = std::make_exception_ptr(Error(e.code(),
                                                        delta.string() + ": published, but advancing mirror " +
                                                            mirror.string() + " to it failed: " + e.what() +
                                                            "; the next publish catches the mirror up from the root",
                                                        delta.string()));
    } catch (...) {
      s_->advance_error = std::current_exception();
    }
  };
  if (s_->m.options().background)
    s_->advance = std::thread(advance);
  else {
    advance();
    wait();
  }
  return ps;
}

void MemoryPublisher::abort() {
  s_->lost.clear();
  abort_step();
}

void MemoryPublisher::abort_step() {
  if (!s_->step) return;
  std::unique_ptr<Step> st = std::move(s_->step);
  st->encoder.reset();  // the spools closed before the writer, going with st, removes their directory
}

}  // namespace hfdelta
