// Byte-level delta codecs of the disk-delta format (docs/format.md, "Encodings").
//
// Codecs see only memory: encoders read two views and push a zstd frame into a
// sink; decoders read an untrusted frame and hand the patch to a callback in
// bounded chunks. They never touch files, and never allocate from a size read
// out of the frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hfdelta/encodings.hpp"
#include "hfdelta/found.hpp"
#include "hfdelta/hash.hpp"

// libzstd's contexts (ZSTD_CCtx, ZSTD_DCtx), used only through pointers here.
struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace hfdelta {

// Bytes handed out by encoders, in order.
using ByteSink = std::function<void(std::span<const std::uint8_t>)>;

// Changed elements and bytes between two equally long views. An element is
// `elem_size` bytes (1 for dtypes this tool does not know).
struct ChangeCount {
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
};
ChangeCount count_changes(std::span<const std::uint8_t> old_bytes, std::span<const std::uint8_t> new_bytes,
                          std::size_t elem_size);

// How a frame is written. hfdelta's own frames carry zstd's frame checksum.
// The slime layout's xor and overwrite entries are written as its publishers
// write them: no frame checksum (each entry's checksum covers the tensor) and
// their level, 1, unless one is given; and with a window of 128 KiB, which
// makes XOR masks 4-12% smaller than a larger window on training steps (fewer
// far matches) and lets a reader decode in 128 KiB of window.
enum class FrameKind { own, slime };

int frame_level(int level, FrameKind kind);  // 3 for own frames, 1 for slime frames

// A zstd compression context reused across frames (one per thread).
class Compressor {
 public:
  // `level`: 1 to 19, or kDefaultLevel.
  explicit Compressor(int level);
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  static constexpr std::uint64_t kUnknownSize = ~0ull;  // zstd's "content size unknown"
  void begin(std::uint64_t pledged_size, FrameKind kind = FrameKind::own);
  // One whole frame of `in` appended to `out` (the streaming state is reset).
  // `literals`: symbols with few repeats, coded mostly by zstd's Huffman stage.
  void compress_frame(std::span<const std::uint8_t> in, std::vector<std::uint8_t>& out, bool literals = false);
  void put(std::span<const std::uint8_t> in, const ByteSink& sink);
  void end(const ByteSink& sink);
  // Hands out everything put so far, the frame still open (ZSTD_e_flush).
  void flush(const ByteSink& sink);

 private:
  ZSTD_CCtx_s* cctx_;
  int level_;
  std::vector<std::uint8_t> out_;
};

// Encode one tensor into one zstd frame of the slime layout (FrameKind::slime).
// Return the frame's size in bytes.
std::uint64_t encode_xor(Compressor& c, std::span<const std::uint8_t> old_bytes,
                         std::span<const std::uint8_t> new_bytes, const ByteSink& sink);
// `changed_bytes` is count_changes(...).bytes. Tensors of 4 GiB or more cannot
// be expressed (32-bit positions): throws Error(unsupported).
std::uint64_t encode_overwrite(Compressor& c, std::span<const std::uint8_t> old_bytes,
                               std::span<const std::uint8_t> new_bytes, std::uint64_t changed_bytes,
                               const ByteSink& sink);

// Elements per independently coded chunk of the sparse encoding.
inline constexpr std::uint64_t kSparseChunkElements = 1u << 20;

// What a sparse entry's values mean. Entries with magic "HFS1" store new XOR
// old; "HFS2" entries (what the encoder writes) store zigzag(new - old), the
// difference of the elements as little-endian unsigned integers modulo
// 2^(8*elem_size): a step of one unit in the last place, the usual change of
// a float weight, is 1 or 2 whatever carries it causes, where XOR values
// spread over 1, 3, 7, 15, ... So the values cost about a third fewer bits.
enum class SparseOp { xor_bytes, add_zigzag };

// Changes one element of `es` bytes in place by one stored value.
void sparse_apply_value(std::uint8_t* elem, const std::uint8_t* value, std::size_t es, SparseOp op);

// The element size a sparse entry uses for a dtype of `es` bytes: sizes other
// than 1, 2, 4 and 8, or not dividing the tensor, fall back to 1.
std::size_t sparse_elem_size(std::size_t es, std::uint64_t nbytes);
inline constexpr std::size_t kSparseHeadSize = 32;
// The entry's head: magic, element size, tensor bytes, chunk size, chunk count.
void sparse_entry_head(std::size_t sparse_es, std::uint64_t nbytes, std::uint8_t out[kSparseHeadSize]);

// Builds one chunk of a sparse entry from views scanned in order, so a caller
// can feed it blocks it has just read (and hashed) while they are in cache.
// Buffers grow to the largest chunk seen and are reused: no allocation per
// element or per chunk.
class SparseChunkEncoder {
 public:
  SparseChunkEncoder();
  ~SparseChunkEncoder();
  SparseChunkEncoder(const SparseChunkEncoder&) = delete;
  SparseChunkEncoder& operator=(const SparseChunkEncoder&) = delete;

  void begin(std::size_t sparse_es);
  // Adds the changes between `a` and `b`, `n` elements that start at element
  // `first` of the chunk; successive calls must cover ascending elements.
  void scan(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first);
  // Adds the whole chunk's changes as found elsewhere (instead of scan()).
  void take(const FoundChunk& fc);
  std::uint64_t changed_elements() const { return count_; }
  std::uint64_t changed_bytes() const { return bytes_; }
  // Compresses the chunk and hands out its head and frames; returns their size.
  std::uint64_t end(Compressor& c, const ByteSink& sink);

 private:
  template <std::size_t ES>
  void scan_t(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first);
  template <std::size_t ES>
  void take_t(const FoundChunk& fc);
  template <std::size_t ES>
  void add(std::uint64_t e, const std::uint8_t* a, const std::uint8_t* b);
  template <std::size_t ES>
  void put(std::uint64_t e, std::uint64_t zz);

  std::size_t es_ = 1;
  std::uint64_t count_ = 0, bytes_ = 0, next_ = 0;
  std::size_t gaps_len_ = 0, cap_es_ = 0;
  std::unique_ptr<std::uint8_t[]> gaps_, planes_;  // planes_: es_ planes of kSparseChunkElements
  std::vector<std::uint8_t> frames_;
};

// Encodes one tensor in the sparse encoding. `elem_size` is the dtype's size
// (1 for dtypes this tool does not know). Returns the entry's size in bytes.
std::uint64_t encode_sparse(Compressor& c, std::span<const std::uint8_t> old_bytes,
                            std::span<const std::uint8_t> new_bytes, std::size_t elem_size, const ByteSink& sink);

// A sparse entry of a tensor of `nbytes` bytes (`elem_size`: sparse_elem_size)
// from its chunks' changes found elsewhere: the bytes encode_sparse writes.
std::uint64_t encode_sparse_found(Compressor& c, std::size_t elem_size, std::uint64_t nbytes,
                                  std::span<const FoundChunk> chunks, const ByteSink& sink);

// ---- context ---------------------------------------------------------------
// The bits of a base element that pick its context: (element >> shift) &
// (2^bits - 1), the element read as a little-endian integer. For float dtypes
// the exponent field (its top 8 bits where it is wider); bits 0 (one context)
// for the rest.
struct ContextField {
  std::uint8_t shift = 0, bits = 0;
};
ContextField context_field(std::string_view dtype, std::size_t elem_size);

// How the chunked encodings (sparse, context) read a tensor of `dtype` and
// `nbytes` bytes: the element size (sparse_elem_size of the dtype's size; 1
// for dtypes this tool does not know) and, where that is the dtype's own
// size, its context field.
struct ChunkLayout {
  std::size_t es = 1;
  ContextField field;
};
ChunkLayout chunk_layout(std::string_view dtype, std::uint64_t nbytes);

// Elements per independently coded chunk: sparse's, so the two chunked
// encodings share their chunk arithmetic (sparse_chunk_count) and their split
// over threads; and most context groups per chunk.
inline constexpr std::uint64_t kContextChunkElements = kSparseChunkElements;
inline constexpr std::size_t kContextHeadSize = 40;
// The entry's head: magic "HFC1", element size, tensor bytes, chunk size,
// chunk count, the context field.
void context_entry_head(std::size_t es, std::uint64_t nbytes, ContextField f, std::uint8_t out[kContextHeadSize]);

// The groups the context encoder picks for a chunk of found changes (from
// fc.ctx and fc.sample): what ranks its changes (FoundChunk::rank).
ContextGroups context_groups(const FoundChunk& fc, ContextField f);

// Builds one chunk of a context entry from views scanned in order (as
// SparseChunkEncoder). Holds one context byte per element of the chunk and
// the chunk's changes, in buffers reused from chunk to chunk.
class ContextChunkEncoder {
 public:
  ContextChunkEncoder();
  ~ContextChunkEncoder();
  ContextChunkEncoder(const ContextChunkEncoder&) = delete;
  ContextChunkEncoder& operator=(const ContextChunkEncoder&) = delete;

  void begin(std::size_t es, ContextField f);
  // `n` elements of the base `a` and the new `b` from element `first` of the
  // chunk; successive calls cover the chunk front to back, without holes.
  void scan(const std::uint8_t* a, const std::uint8_t* b, std::size_t n, std::uint64_t first);
  // Takes the whole chunk's changes as found elsewhere (instead of scan()),
  // ranked among `groups` (context_groups(fc)). `fc`'s views must outlive end().
  void take(const FoundChunk& fc, const ContextGroups& groups);
  std::uint64_t changed_elements() const { return count_; }
  std::uint64_t changed_bytes() const { return bytes_; }
  // Chooses the chunk's groups, compresses it and hands out its bytes;
  // returns their size.
  std::uint64_t end(Compressor& c, const ByteSink& sink);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::uint64_t count_ = 0, bytes_ = 0;
};

// Encodes one tensor in the context encoding (`elem_size` and `field` as for
// sparse and context_field). Returns the entry's size in bytes; adds the
// elements that changed to `*changed` where given.
std::uint64_t encode_context(Compressor& c, std::span<const std::uint8_t> old_bytes,
                             std::span<const std::uint8_t> new_bytes, std::size_t elem_size, ContextField field,
                             const ByteSink& sink, std::uint64_t* changed = nullptr);

// A context entry from its chunks' changes found elsewhere, each ranked among
// its chunk's `groups`: the bytes encode_context writes.
std::uint64_t encode_context_found(Compressor& c, std::size_t elem_size, std::uint64_t nbytes, ContextField field,
                                   std::span<const FoundChunk> chunks, std::span<const ContextGroups> groups,
                                   const ByteSink& sink);

class FrameReader;

// A zstd decompression context reused across frames.
class Decompressor {
 public:
  Decompressor();
  ~Decompressor();
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;

 private:
  friend class FrameReader;  // the one user of the context and the buffer
  // The output buffer of the FrameReader using this context (one at a time),
  // allocated once: a reader per small frame must not cost a fresh buffer.
  std::span<std::uint8_t> buffer();

  ZSTD_DCtx_s* dctx_;
  std::unique_ptr<std::uint8_t[]> buf_;
};

// Receives consecutive pieces of the decoded XOR stream: (offset, bytes).
using XorPatch = std::function<void(std::uint64_t, std::span<const std::uint8_t>)>;
// Receives batches of (ascending positions, their new byte values).
using OverwritePatch = std::function<void(std::span<const std::uint64_t>, std::span<const std::uint8_t>)>;

// Receives batches of changed elements: byte offsets (ascending), their
// stored values, `elem_size` bytes per element, and what the values mean.
using SparsePatch =
    std::function<void(std::span<const std::uint64_t>, std::span<const std::uint8_t>, std::size_t, SparseOp)>;

// Decoders throw Error(bad_input) naming `what` when the frame is corrupt or
// decodes to more or fewer bytes than `nbytes` implies.
void decode_xor(Decompressor& d, std::span<const std::uint8_t> frame, std::uint64_t nbytes, const std::string& what,
                const XorPatch& patch);
void decode_overwrite(Decompressor& positions, Decompressor& values, std::span<const std::uint8_t> frame,
                      std::uint64_t nbytes, const std::string& what, const OverwritePatch& patch);

void decode_sparse(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what,
                   const SparsePatch& patch);

// The base bytes [offset, offset + n) of the tensor a context entry is laid
// over. The decoder asks front to back, at most kContextWindow bytes at a time
// and never across a chunk, and hands `patch` the changes of each piece
// before it asks for the next, so a caller may patch the piece in place.
using BaseView = std::function<std::span<const std::uint8_t>(std::uint64_t offset, std::size_t n)>;
inline constexpr std::size_t kContextWindow = 1 << 20;

// Decodes a context entry against its base: changes come as sparse
// differences (SparseOp::add_zigzag). Throws Error(bad_input) naming `what`
// when the entry is damaged (what check_context finds), and
// Error(verify_failed) when it does not fit the base bytes (a base whose
// contexts hold fewer elements than the entry names: not its base, or an
// entry damaged in a way only the base shows).
void decode_context(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what,
                    const BaseView& base, const SparsePatch& patch);

// What a context entry says without its base: its changes per chunk, after
// every check that needs no base bytes (heads, frames, stream lengths,
// positions that fit their chunk). Throws Error(bad_input) naming `what`.
struct ContextSummary {
  std::uint64_t chunks = 0, changes = 0;
  std::uint32_t elem_size = 0;
  ContextField field;
};
ContextSummary check_context(std::span<const std::uint8_t> entry, std::uint64_t nbytes, const std::string& what);

// A stacked entry: magic "HFK1", a u32 layer count N >= 1, N layer records of
// kStackLayerSize bytes (u32 encoding: its code in kEncodings; u32 zero; u64
// length; the XXH3-128 of the tensor's bytes after the layer, high word
// first: for a parts layer, the checksum of its head, as a parts entry
// records it), then the layers' bytes in order, filling the entry exactly.
// Little-endian throughout.
inline constexpr std::size_t kStackHeadSize = 8;
inline constexpr std::size_t kStackLayerSize = 32;
struct StackLayer {
  Encoding enc = Encoding::xor_bytes;  // never stack
  std::uint64_t size = 0;
  Hash128 hash;                         // of the tensor after this layer (parts: of its head)
  std::span<const std::uint8_t> bytes;  // read_stack: the layer within the entry
};
// The head of a stacked entry of `layers` (their bytes follow it).
std::vector<std::uint8_t> stack_head(const std::vector<StackLayer>& layers);
// Splits a stacked entry into its layers; throws Error(bad_input) naming
// `what` unless the head is well formed, the layers fill the entry, and the
// last layer ends at `new_hash` (the checksum the delta records for the tensor).
// A parts layer's own head is not read here (read_parts, delta/parts.hpp).
std::vector<StackLayer> read_stack(std::span<const std::uint8_t> entry, const Hash128& new_hash,
                                   const std::string& what);

}  // namespace hfdelta
