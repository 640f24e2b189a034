// hfdelta._core._Publisher: hfdelta::MemoryPublisher for hfdelta.Publisher
// (hfdelta/publisher.py), which turns numpy arrays and torch tensors into
// (name, array, dtype, shape) items. Tensors arrive as nanobind ndarrays:
// from DLPack (torch CPU tensors, any __dlpack__ object) or the buffer
// protocol; an ndarray is read in place, with the GIL released, and never
// kept past the call that encodes it. A tensor on a CUDA device (torch, or
// any DLPack capsule whose device is CUDA) goes to the device path
// (hfdelta::gpu::DevicePublisher: its changes found on the device, only they
// copied to the host) where the package is built with CUDA (HFDELTA_CUDA),
// and is refused, saying so, where it is not.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/publisher.hpp"
#include "hfdelta/report_json.hpp"
#include "progress_callback.hpp"
#include "tensor_arrays.hpp"
#ifdef HFDELTA_CUDA
#include "device_publisher.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using hfdelta::Exit;
using hfdelta::fail;
using hfdelta::python::Array;
using hfdelta::python::Tensor;
using hfdelta::python::tensor_of;

nlohmann::json opening_json(const hfdelta::PublisherOpening& o) {
  return {{"version", o.version},
          {"rolled_back", o.rolled_back ? nlohmann::json(*o.rolled_back) : nlohmann::json()},
          {"caught_up", o.caught_up}};
}

// delta-diff's --json object for the version published, and what the
// publisher adds: how the tensors came, and the mirror's apply (null while
// it runs in the background).
std::string publish_report(const hfdelta::PublishSummary& s, const std::string& encoding,
                           const std::optional<hfdelta::ApplyResult>& mirror, const std::string& mirror_path) {
  nlohmann::json j = hfdelta::diff_json(s.out.string(), encoding, s.diff);
  j["tensors_given"] = s.tensors_given;
  j["tensors_declared_unchanged"] = s.tensors_declared_unchanged;
  j["mirror"] = mirror ? hfdelta::json_report(hfdelta::change_json(mirror_path, *mirror)) : nlohmann::json();
  return hfdelta::json_report(std::move(j)).dump();
}

struct Publisher {
  std::unique_ptr<hfdelta::MemoryPublisher> p;
  std::string encoding, mirror;
#ifdef HFDELTA_CUDA
  std::unique_ptr<hfdelta::gpu::DevicePublisher> dev;  // made by the first tensor on a CUDA device
#endif
  // One call at a time: a call releases the GIL while it works, and the
  // library's publisher is not for several threads at once.
  std::atomic<bool> busy{false};

  hfdelta::MemoryPublisher& get() {
    if (!p) fail(Exit::usage, "the publisher is closed");
    return *p;
  }

  // One tensor, from host memory or from a CUDA device; called with the GIL released.
  void put_one(const Tensor& t) {
    if (!t.on_cuda()) return get().put(t.view());
#ifdef HFDELTA_CUDA
    if (!dev) dev = std::make_unique<hfdelta::gpu::DevicePublisher>(get(), t.device_id);
    dev->put({t.name, t.dtype, t.shape, t.data, t.nbytes});
#endif
  }

  // Encodes items (name, array, dtype or None, shape or None) of an
  // iterable as they come, in batches of up to kBatchBytes (or kBatchItems)
  // encoded side by side with the GIL released: small tensors one by one
  // would leave cores idle. A batch keeps its arrays alive until encoded, so
  // at most a batch (or one larger tensor) of the caller's arrays is held.
  static constexpr std::size_t kBatchBytes = 32u << 20, kBatchItems = 64;
  void put_all(nb::handle items) {
    std::vector<Array> arrays;  // kept (and let go) with the GIL held
    std::vector<Tensor> batch;
    std::size_t bytes = 0;
    auto flush = [&] {
      std::vector<hfdelta::TensorBytes> views;
      for (const Tensor& t : batch) views.push_back(t.view());
      {
        nb::gil_scoped_release release;
        get().put(views);
      }
      batch.clear(), arrays.clear(), bytes = 0;
    };
    for (nb::handle item : items) {
      const nb::tuple tup = nb::cast<nb::tuple>(item);
      if (tup.size() != 4) fail(Exit::usage, "publisher items are (name, array, dtype, shape)");
      const Array a = nb::cast<Array>(tup[1]);
      Tensor t = tensor_of(nb::cast<std::string>(tup[0]), a, nb::cast<std::optional<std::string>>(tup[2]),
                           nb::cast<std::optional<std::vector<std::uint64_t>>>(tup[3]));
      if (t.on_cuda()) {  // found on its device, alone: only its changes come to the host
        nb::gil_scoped_release release;
        put_one(t);
        continue;
      }
      arrays.push_back(a);
      batch.push_back(std::move(t));
      bytes += batch.back().nbytes;
      if (bytes >= kBatchBytes || batch.size() >= kBatchItems) flush();
    }
    if (!batch.empty()) flush();
  }
};

// Held by every method for its whole call (taken with the GIL held).
class Busy {
 public:
  explicit Busy(Publisher& p) : p_(p) {
    if (p_.busy.exchange(true)) fail(Exit::usage, "the publisher is in use by another thread");
  }
  ~Busy() { p_.busy = false; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  Publisher& p_;
};

}  // namespace

void bind_publisher(nb::module_& m) {
#ifdef HFDELTA_CUDA
  m.attr("cuda") = true;
#else
  m.attr("cuda") = false;
#endif
  nb::class_<Publisher>(m, "_Publisher")
      .def(
          "__init__",
          [](Publisher* self, const std::string& root, const std::string& mirror, const std::string& encoding,
             std::optional<int> level, int threads, bool sync, std::optional<double> lock_timeout, bool background) {
            hfdelta::PublisherOptions o;
            o.level = hfdelta::python::check_level(level);
            hfdelta::python::check_threads(threads);
            o.encoding = hfdelta::python::encoding_of(encoding);
            o.threads = threads;
            o.sync = sync;
            o.lock_timeout = hfdelta::python::lock_seconds(lock_timeout);  // -1 is no "wait forever" here
            o.background = background;
            std::unique_ptr<hfdelta::MemoryPublisher> p;
            {
              nb::gil_scoped_release release;
              p = std::make_unique<hfdelta::MemoryPublisher>(root, mirror, o);
            }
            new (self) Publisher{std::move(p), encoding, mirror};
          },
          "root"_a, "mirror"_a, "encoding"_a, "level"_a.none(), "threads"_a, "sync"_a, "lock_timeout"_a.none(),
          "background"_a)
      .def_prop_ro("version",
                   [](Publisher& self) {
                     const Busy busy(self);
                     return self.get().version();
                   })
      .def_prop_ro("in_progress",
                   [](Publisher& self) {
                     const Busy busy(self);
                     return self.get().in_progress();
                   })
      .def("device_stats",
           [](Publisher& self) -> std::optional<std::string> {
             const Busy busy(self);
#ifdef HFDELTA_CUDA
             if (self.dev) {
               const hfdelta::gpu::DevicePublishStats& d = self.dev->stats();
               return nlohmann::json{
                   {"device", self.dev->device()},        {"tensors", d.tensors}, {"tensor_bytes", d.tensor_bytes},
                   {"host_bytes", d.host_bytes},          {"loads", d.loads},     {"load_bytes", d.load_bytes},
                   {"base_bytes", self.dev->base_bytes()}}
                   .dump();
             }
#endif
             return std::nullopt;
           })
      .def("opening",
           [](Publisher& self) {
             const Busy busy(self);
             return opening_json(self.get().opening()).dump();
           })
      .def("begin",
           [](Publisher& self) {
             const Busy busy(self);
             nb::gil_scoped_release release;
             self.get().begin();
           })
      .def(
          "put",
          [](Publisher& self, const std::string& name, const Array& a, std::optional<std::string> dtype,
             std::optional<std::vector<std::uint64_t>> shape) {
            const Busy busy(self);
            const Tensor t = tensor_of(name, a, dtype, shape);
            nb::gil_scoped_release release;
            self.put_one(t);
          },
          "name"_a, "array"_a, "dtype"_a.none(), "shape"_a.none())
      .def(
          "put_all",
          [](Publisher& self, nb::handle items, nb::handle progress) {
            const Busy busy(self);
            nb::gil_scoped_release release;
            // The mirror's advance waited for first, so that the feed reports
            // this call's phases, not the advance's.
            self.get().wait();
            const hfdelta::python::ProgressCallback feed(progress);
            nb::gil_scoped_acquire gil;
            self.put_all(items);
          },
          "items"_a, "progress"_a.none())
      .def(
          "unchanged",
          [](Publisher& self, const std::string& name) {
            const Busy busy(self);
            self.get().unchanged(name);
          },
          "name"_a)
      .def(
          "publish",
          [](Publisher& self, bool rest_unchanged, bool wait) {
            const Busy busy(self);
            hfdelta::PublishSummary s;
            std::optional<hfdelta::ApplyResult> mirror;
            {
              nb::gil_scoped_release release;
              s = self.get().publish(rest_unchanged);
              if (wait) mirror = self.get().wait();
            }
            return publish_report(s, self.encoding, mirror, self.mirror);
          },
          "rest_unchanged"_a, "wait"_a)
      .def("abort",
           [](Publisher& self) {
             const Busy busy(self);
             nb::gil_scoped_release release;
             if (self.p) self.p->abort();
           })
      .def("wait",
           [](Publisher& self) -> std::optional<std::string> {
             const Busy busy(self);
             std::optional<hfdelta::ApplyResult> r;
             {
               nb::gil_scoped_release release;
               r = self.get().wait();
             }
             if (!r) return std::nullopt;
             return hfdelta::json_report(hfdelta::change_json(self.mirror, *r)).dump();
           })
      .def("close", [](Publisher& self) {
        const Busy busy(self);
        nb::gil_scoped_release release;
#ifdef HFDELTA_CUDA
        self.dev.reset();  // the bases' device memory, before the publisher it refers to
#endif
        std::unique_ptr<hfdelta::MemoryPublisher> p = std::move(self.p);
        if (!p) return;
        p->abort();
        p->wait();  // its failure raised; the destructor then has nothing left to wait for
      });
}
