// Publishing from tensors that live on a CUDA device: the publisher's
// device side. A DevicePublisher keeps, for each tensor, the mirror's bytes
// of it on the device (its base), finds the changes of the new bytes on the
// device (ChangeFinder) and hands only them, copied to the host, to
// MemoryPublisher::put_found, which writes the entry put() writes from the
// same bytes on the host.
//
// A base is loaded from the mirror on first use and tagged with the checksum
// the mirror records for the tensor. Once its changes are handed over, they
// are added to the base on the device, and the base is tagged with the
// checksum of the bytes given (the mirror's record of the version once it
// is published). A base whose tag is not the mirror's record at the version
// under way (the version was abandoned, the mirror was re-created or caught
// up from ROOT, it records no checksum) is loaded from the mirror again.
//
// Memory per rank: one copy of the rank's tensors on the device (each
// tensor's base, kept), plus ChangeFinder's scratch (cuda/README.md).
//
// This header needs no CUDA headers. Not thread-safe: one per publisher.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "hfdelta/hash.hpp"
#include "hfdelta/publisher.hpp"

namespace hfdelta::gpu {

class ChangeFinder;

// One tensor on the current CUDA device: row-major bytes, valid during the call.
struct DeviceTensorBytes {
  std::string_view name;
  std::string_view dtype;
  std::span<const std::uint64_t> shape;
  const void* data = nullptr;  // device memory
  std::uint64_t nbytes = 0;
};

struct DevicePublishStats {
  std::uint64_t tensors = 0;       // given from the device
  std::uint64_t tensor_bytes = 0;  // their bytes
  std::uint64_t host_bytes = 0;    // copied from the device to the host (changes and counts)
  std::uint64_t loads = 0;         // bases loaded from the mirror
  std::uint64_t load_bytes = 0;    // their bytes (host to device)
};

class DevicePublisher {
 public:
  // Works on CUDA device `device` (-1: the current one; Error(unsupported)
  // without one) for the publisher `p`, which must outlive it.
  explicit DevicePublisher(MemoryPublisher& p, int device = -1);
  ~DevicePublisher();
  DevicePublisher(const DevicePublisher&) = delete;
  DevicePublisher& operator=(const DevicePublisher&) = delete;

  // put() from device memory: the entry, the checksum and the errors are
  // those of MemoryPublisher::put() for the same bytes; a publisher of
  // another encoding than sparse or context is refused (Error(usage)), as is
  // memory that is not on this device. The caller's work on the device is
  // waited for (cudaDeviceSynchronize) before the bytes are read.
  void put(const DeviceTensorBytes& t);

  // The device memory that the bases hold, in bytes.
  std::uint64_t base_bytes() const;
  const DevicePublishStats& stats() const { return stats_; }
  int device() const { return device_; }

  struct Base;

 private:
  Base& base_for(const DeviceTensorBytes& t, const std::optional<Hash128>& record);
  MemoryPublisher& p_;
  int device_ = 0;
  std::unique_ptr<ChangeFinder> finder_;
  std::map<std::string, std::unique_ptr<Base>, std::less<>> bases_;
  DevicePublishStats stats_;
};

}  // namespace hfdelta::gpu
