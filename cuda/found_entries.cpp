// Entries from changes found on the device: the CPU's chunked encoders fed
// FoundChunks instead of views. Plain C++: the unit tests build it without
// the CUDA Toolkit.
#include <algorithm>

#include "change_finder.hpp"
#include "codec/codec.hpp"

namespace hfdelta::gpu {

FoundChunk Found::chunk(std::uint64_t c) const {
  FoundChunk fc;
  const std::uint64_t j = start[c];
  fc.elements = std::min(kSparseChunkElements, elements - c * kSparseChunkElements);
  fc.count = start[c + 1] - j;
  fc.bytes_changed = bytes[c];
  fc.pos = pos.data() + j;
  fc.diff = diff.data() + j * es;
  if (!ctx.empty()) fc.ctx = ctx.data() + j;
  if (!sample.empty()) fc.sample = sample.data() + 256 * c;
  if (!rank.empty()) fc.rank = rank.data() + j;
  return fc;
}

ContextField usable_field(ContextField f, std::size_t es) {
  return !f.bits || f.bits > 8 || f.shift + f.bits > 8 * es ? ContextField{} : f;
}

namespace {

std::vector<FoundChunk> chunks_of(const Found& f) {
  std::vector<FoundChunk> cs(f.chunks);
  for (std::uint64_t c = 0; c < f.chunks; ++c) cs[c] = f.chunk(c);
  return cs;
}

}  // namespace

std::vector<std::uint8_t> sparse_entry(const Found& f, std::uint64_t nbytes, int level) {
  std::vector<std::uint8_t> out;
  Compressor comp(level);
  encode_sparse_found(comp, f.es, nbytes, chunks_of(f),
                      [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

std::vector<ContextGroups> context_groups_of(const Found& f, ContextField field) {
  std::vector<ContextGroups> groups(f.chunks);
  for (std::uint64_t c = 0; c < f.chunks; ++c) groups[c] = context_groups(f.chunk(c), usable_field(field, f.es));
  return groups;
}

std::vector<std::uint8_t> context_entry(const Found& f, std::uint64_t nbytes, ContextField field,
                                        std::span<const ContextGroups> groups, int level) {
  std::vector<std::uint8_t> out;
  Compressor comp(level);
  encode_context_found(comp, f.es, nbytes, field, chunks_of(f), groups,
                       [&](std::span<const std::uint8_t> s) { out.insert(out.end(), s.begin(), s.end()); });
  return out;
}

}  // namespace hfdelta::gpu
