// hfdelta._core's sharded publisher (hfdelta/sharded.py): the torch-free
// core of include/hfdelta/sharded_publisher.hpp and publisher_mirror.hpp. The
// Python side runs the collectives on the trainer's process group and moves
// only what these return (a plan, part records, a stage's name) between
// ranks; nothing here knows of torch or of other processes.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include "bindings.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher_mirror.hpp"
#include "hfdelta/report_json.hpp"
#include "hfdelta/sharded_publisher.hpp"
#include "tensor_arrays.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using hfdelta::Exit;
using hfdelta::fail;
using hfdelta::python::Array;
// (name, row0, rows, col0, cols, rank): a piece of the plan.
using PieceTuple = std::tuple<std::string, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t>;
// (name, dtype, shape): a tensor of the mirror.
using LayoutTuple = std::tuple<std::string, std::string, std::vector<std::uint64_t>>;

std::vector<LayoutTuple> mirror_layout(const std::string& mirror) {
  const hfdelta::Checkpoint c = hfdelta::open_checkpoint(mirror);
  std::vector<LayoutTuple> out;
  for (const auto& [name, ref] : c.tensors) {
    const hfdelta::TensorInfo& t = c.info(ref);
    out.emplace_back(name, t.dtype, t.shape);
  }
  return out;
}

void check_plan(const std::string& mirror, const std::vector<PieceTuple>& pieces) {
  nb::gil_scoped_release release;
  std::vector<hfdelta::ShardPiece> ps;
  for (const auto& [name, row0, rows, col0, cols, rank] : pieces) ps.push_back({name, {row0, rows, col0, cols}, rank});
  hfdelta::check_shard_plan(hfdelta::open_checkpoint(mirror), ps);
}

struct Writer {
  std::unique_ptr<hfdelta::ShardWriter> w;
  hfdelta::ShardWriter& get() {
    if (!w) fail(Exit::usage, "the shard writer is finished");
    return *w;
  }
};

struct Mirror {
  std::unique_ptr<hfdelta::PublisherMirror> m;
  std::string path;
  hfdelta::PublisherMirror& get() {
    if (!m) fail(Exit::usage, "the mirror is closed");
    return *m;
  }
};

}  // namespace

void bind_sharded(nb::module_& m) {
  m.def("_mirror_layout", &mirror_layout, "mirror"_a);
  m.def("_check_shard_plan", &check_plan, "mirror"_a, "pieces"_a);
  m.def(
      "_make_shard_stage",
      [](const std::string& root, std::uint64_t version) {
        nb::gil_scoped_release release;
        return hfdelta::make_shard_stage(root, version).string();
      },
      "root"_a, "version"_a);
  m.def(
      "_commit_sharded",
      [](const std::string& root, const std::string& mirror, const std::string& stage, std::uint64_t version,
         std::uint64_t base, const std::string& parts, bool sync) {
        nb::gil_scoped_release release;
        const hfdelta::ShardCommit c =
            hfdelta::commit_sharded(root, mirror, stage, version, base, hfdelta::parse_shard_parts(parts), sync);
        return nlohmann::json{
            {"out", c.out.string()}, {"tensors_changed", c.tensors_changed}, {"delta_bytes", c.delta_bytes}}
            .dump();
      },
      "root"_a, "mirror"_a, "stage"_a, "version"_a, "base"_a, "parts"_a, "sync"_a);

  nb::class_<Writer>(m, "_ShardWriter")
      .def(
          "__init__",
          [](Writer* self, const std::string& mirror, const std::string& stage, std::uint32_t rank,
             const std::string& encoding, std::optional<int> level) {
            const int lv = hfdelta::python::check_level(level);
            const std::optional<hfdelta::Encoding> enc = hfdelta::python::encoding_of(encoding);
            if (!enc) fail(Exit::usage, "a sharded publisher writes xor, sparse or context parts, not auto");
            new (self) Writer{std::make_unique<hfdelta::ShardWriter>(mirror, stage, rank, *enc, lv)};
          },
          "mirror"_a, "stage"_a, "rank"_a, "encoding"_a, "level"_a.none())
      .def(
          "put",
          [](Writer& self, const std::string& name, const Array& a, std::optional<std::string> dtype,
             const std::vector<std::uint64_t>& shape, std::uint64_t row0, std::uint64_t rows, std::uint64_t col0,
             std::uint64_t cols) {
            const hfdelta::python::Tensor t = hfdelta::python::tensor_of(name, a, dtype, std::nullopt);
            if (t.on_cuda())
              fail(Exit::usage, "tensor '" + name +
                                    "': a sharded publisher takes pieces in host memory; copy it to the host first "
                                    "(torch: .cpu())");
            nb::gil_scoped_release release;
            self.get().put(name, t.dtype, shape, {row0, rows, col0, cols}, {t.data, t.nbytes});
          },
          "name"_a, "array"_a, "dtype"_a.none(), "shape"_a, "row0"_a, "rows"_a, "col0"_a, "cols"_a)
      .def(
          "finish",
          [](Writer& self, bool sync) {
            std::vector<hfdelta::ShardPart> parts;
            {
              nb::gil_scoped_release release;
              parts = self.get().finish(sync);
            }
            return hfdelta::shard_parts_text(parts);
          },
          "sync"_a)
      .def_prop_ro("mirror_bytes_read", [](Writer& self) { return self.get().mirror_bytes_read(); })
      .def("close", [](Writer& self) { self.w.reset(); });

  nb::class_<Mirror>(m, "_ShardMirror")
      .def(
          "__init__",
          [](Mirror* self, const std::string& root, const std::string& mirror, int threads, bool sync,
             std::optional<double> lock_timeout) {
            hfdelta::python::check_threads(threads);
            hfdelta::PublisherOptions o;
            o.threads = threads;
            o.sync = sync;
            o.lock_timeout = hfdelta::python::lock_seconds(lock_timeout);
            std::unique_ptr<hfdelta::PublisherMirror> sm;
            {
              nb::gil_scoped_release release;
              sm = std::make_unique<hfdelta::PublisherMirror>(root, mirror, o, " (ShardedPublisher(root, mirror))");
            }
            new (self) Mirror{std::move(sm), mirror};
          },
          "root"_a, "mirror"_a, "threads"_a, "sync"_a, "lock_timeout"_a.none())
      .def("opening",
           [](Mirror& self) {
             const hfdelta::PublisherOpening& o = self.get().opening();
             return nlohmann::json{{"version", o.version},
                                   {"rolled_back", o.rolled_back ? nlohmann::json(*o.rolled_back) : nlohmann::json()},
                                   {"caught_up", o.caught_up}}
                 .dump();
           })
      .def("reconcile",
           [](Mirror& self) {
             nb::gil_scoped_release release;
             return self.get().reconcile();
           })
      .def("record_digest", [](Mirror& self) { return self.get().record_digest().hex(); })
      .def(
          "advance",
          [](Mirror& self, const std::string& delta) {
            hfdelta::ApplyResult r;
            {
              nb::gil_scoped_release release;
              r = self.get().advance(delta);
            }
            return hfdelta::json_report(hfdelta::change_json(self.path, r)).dump();
          },
          "delta"_a)
      .def("close", [](Mirror& self) { self.m.reset(); });
}
