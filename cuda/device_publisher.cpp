// DevicePublisher (device_publisher.hpp): each tensor's base kept on the
// device, its changes found there and handed to MemoryPublisher::put_found.
#include "device_publisher.hpp"

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "change_finder.hpp"
#include "codec/codec.hpp"
#include "hfdelta/checkpoint.hpp"
#include "hfdelta/error.hpp"
#include "hfdelta/safetensors.hpp"
#include "util/io.hpp"

namespace hfdelta::gpu {

namespace {

void ck(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail(Exit::failure, "CUDA: " + what + ": " + cudaGetErrorString(e));
}

// Makes `d` the current device for a call, and the caller's again after it.
class OnDevice {
 public:
  explicit OnDevice(int d) {
    ck(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != d) ck(cudaSetDevice(d), "cudaSetDevice");
    set_ = prev_ != d;
  }
  ~OnDevice() {
    if (set_) cudaSetDevice(prev_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

}  // namespace

// A tensor's base on the device, and the checksum of its bytes (none: not
// known to be any version's).
struct DevicePublisher::Base {
  void* data = nullptr;
  std::uint64_t nbytes = 0;
  std::optional<Hash128> tag;
  Found found;  // the last changes copied to the host (its page-locked memory reused)
  ~Base() {
    if (data) cudaFree(data);
  }
};

DevicePublisher::DevicePublisher(MemoryPublisher& p, int device) : p_(p) {
  std::string why;
  const int n = ChangeFinder::devices(why);
  if (n == 0) fail(Exit::unsupported, "publishing from device memory: " + why);
  if (device >= n) fail(Exit::unsupported, "publishing from device memory: no CUDA device " + std::to_string(device));
  if (device < 0)
    ck(cudaGetDevice(&device_), "cudaGetDevice");
  else
    device_ = device;
  const OnDevice on(device_);
  finder_ = std::make_unique<ChangeFinder>();  // its stream on that device
}

DevicePublisher::~DevicePublisher() = default;

std::uint64_t DevicePublisher::base_bytes() const {
  std::uint64_t n = 0;
  for (const auto& [name, b] : bases_) n += b->nbytes;
  return n;
}

// The tensor's base, loaded from the mirror unless it holds the bytes the
// mirror records (`record`) already.
DevicePublisher::Base& DevicePublisher::base_for(const DeviceTensorBytes& t, const std::optional<Hash128>& record) {
  auto it = bases_.find(t.name);
  if (it == bases_.end()) it = bases_.emplace(std::string(t.name), std::make_unique<Base>()).first;
  Base& b = *it->second;
  if (record && b.tag == record && b.nbytes == t.nbytes) return b;
  b.tag.reset();
  if (b.nbytes != t.nbytes) {
    if (b.data) ck(cudaFree(b.data), "cudaFree");
    b.data = nullptr, b.nbytes = 0;
    if (t.nbytes) ck(cudaMalloc(&b.data, t.nbytes), "cudaMalloc of tensor '" + std::string(t.name) + "''s base");
    b.nbytes = t.nbytes;
  }
  // The mirror's bytes of it, at the version under way's base (the mirror
  // is not advanced while a version is under way). If they are not those it
  // records, put_found() refuses them when it hashes them.
  const Checkpoint c = open_checkpoint(p_.mirror());
  for (const Shard& s : c.shards)
    for (const TensorInfo& ti : s.header.tensors) {
      if (ti.name != t.name) continue;
      if (ti.nbytes() != t.nbytes)
        fail(Exit::failure, "tensor '" + std::string(t.name) + "': " + std::to_string(ti.nbytes()) +
                                " bytes in mirror " + p_.mirror().string() + ", " + std::to_string(t.nbytes) +
                                " given");
      const File f(c.dir / s.file, File::Mode::read);
      constexpr std::uint64_t kBlock = 64u << 20;
      std::vector<std::uint8_t> buf(std::min(kBlock, t.nbytes));
      for (std::uint64_t at = 0; at < t.nbytes; at += kBlock) {
        const std::uint64_t n = std::min(kBlock, t.nbytes - at);
        f.pread_exact(buf.data(), n, s.header.file_offset(ti) + at);
        ck(cudaMemcpy(static_cast<std::uint8_t*>(b.data) + at, buf.data(), n, cudaMemcpyHostToDevice),
           "copy of tensor '" + std::string(t.name) + "''s base to the device");
      }
      // A copy from pageable memory may still be under way when cudaMemcpy
      // returns, and the finder's stream does not wait for the default one.
      ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      stats_.loads += 1, stats_.load_bytes += t.nbytes;
      b.tag = record;
      return b;
    }
  fail(Exit::failure, "tensor '" + std::string(t.name) + "': not in mirror " + p_.mirror().string());
}

void DevicePublisher::put(const DeviceTensorBytes& t) {
  const std::string where = "tensor '" + std::string(t.name) + "'";
  const std::optional<Encoding> enc = p_.options().encoding;
  if (!enc || !chunked(*enc))
    fail(Exit::usage, where + ": in CUDA device memory, which is published as sparse or context only, not " +
                          (enc ? std::string(encoding_name(*enc)) : std::string("auto")) +
                          ": open the publisher with encoding sparse or context, or copy the tensor to the host");
  const OnDevice on(device_);
  if (t.nbytes) {
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, t.data);
    if (e != cudaSuccess) cudaGetLastError();  // cleared: not a pointer CUDA knows
    if (e != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged))
      fail(Exit::usage, where + ": not in CUDA device memory");
    if (a.device != device_)
      fail(Exit::usage, where + ": on CUDA device " + std::to_string(a.device) +
                            ", but this publisher's tensors are on device " + std::to_string(device_) +
                            " (one device per publisher)");
  }
  // Checks name, dtype, shape and size, starts the version; the mirror's record of the tensor.
  const std::optional<Hash128> record = p_.found_base(t.name, t.dtype, t.shape, t.nbytes);
  Base& b = base_for(t, record);
  ck(cudaDeviceSynchronize(), "waiting for the device's work before reading " + where);
  const ChunkLayout l = chunk_layout(t.dtype, t.nbytes);
  const bool context = enc == Encoding::context;
  const DeviceTensor dt{b.data, t.data, t.nbytes, l.es, l.field};
  finder_->find(dt, context, b.found);
  std::vector<ContextGroups> groups;
  if (context) {
    groups = context_groups_of(b.found, l.field);
    finder_->rank(dt, groups, b.found);
  }
  std::vector<FoundChunk> chunks(b.found.chunks);
  for (std::uint64_t c = 0; c < b.found.chunks; ++c) chunks[c] = b.found.chunk(c);
  stats_.tensors += 1, stats_.tensor_bytes += t.nbytes, stats_.host_bytes += b.found.host_bytes;
  p_.put_found({t.name, t.dtype, t.shape, t.nbytes, chunks, groups});
  // Given: the base brought forward to the bytes given, tagged with their
  // checksum (the mirror's record once the version is published).
  b.tag.reset();
  finder_->apply(b.data, b.found);
  b.tag = p_.given_checksum(t.name);
}

}  // namespace hfdelta::gpu
