#include "hfdelta/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "hfdelta/error.hpp"
#include "util/io.hpp"
#include "util/json_text.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;
using nlohmann::json;

namespace {

struct DtypeEntry {
  std::string_view name;
  std::size_t size;
};

constexpr std::array<DtypeEntry, 16> kDtypes{{
    {"BOOL", 1},
    {"U8", 1},
    {"I8", 1},
    {"F8_E5M2", 1},
    {"F8_E4M3", 1},
    {"F8_E8M0", 1},
    {"I16", 2},
    {"U16", 2},
    {"F16", 2},
    {"BF16", 2},
    {"I32", 4},
    {"U32", 4},
    {"F32", 4},
    {"I64", 8},
    {"U64", 8},
    {"F64", 8},
}};

// `what`: the file the header is of.
[[noreturn]] void bad(const std::string& what, const std::string& msg) { fail(Exit::bad_input, what, msg); }

std::uint64_t read_le64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

std::uint64_t as_u64(const json& v, const std::string& what, const std::string& field) {
  if (!v.is_number_unsigned()) bad(what, field + " must be a non-negative integer, got " + v.dump());
  return v.get<std::uint64_t>();
}

}  // namespace

std::string shape_string(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// The reference writer orders data by its dtype enumeration, last first; this
// is that enumeration's order (which also puts larger alignments first).
constexpr std::array<std::string_view, 20> kDtypeOrder{
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
    "U16",  "F16", "BF16",    "I32",     "U32", "F32", "C64",     "F64",     "I64",     "U64"};

int dtype_rank(std::string_view dtype) {
  for (std::size_t i = 0; i < kDtypeOrder.size(); ++i)
    if (kDtypeOrder[i] == dtype) return static_cast<int>(i);
  return -1;
}
}  // namespace

std::size_t dtype_size(std::string_view dtype) {
  for (const auto& d : kDtypes)
    if (d.name == dtype) return d.size;
  return 0;
}

std::uint64_t TensorInfo::counted_elements() const { return dtype_size(dtype) ? elements() : nbytes(); }

std::uint64_t TensorInfo::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;  // validated against overflow at parse time
  return n;
}

std::string SafetensorsHeader::prefix() const {
  std::string p(8, '\0');
  for (int i = 0; i < 8; ++i) p[static_cast<std::size_t>(i)] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  return p + header;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// The 8-byte header length against the format's limit, hfdelta's and the file.
SafetensorsHeader check_header_length(std::uint64_t header_len, std::uint64_t file_size, const std::string& what) {
  if (file_size < 8)
    bad(what, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  SafetensorsHeader h;
  h.file_size = file_size;
  h.header_len = header_len;
  if (h.header_len > kMaxHeaderSize)
    bad(what, "header length " + std::to_string(h.header_len) + " exceeds the limit of " +
                  std::to_string(kMaxHeaderSize) + " bytes");
  if (h.header_len > kHeaderJson.bytes)  // within the format's limit, but more than any real header
    bad(what, "header length " + std::to_string(h.header_len) + " exceeds hfdelta's limit of " +
                  std::to_string(kHeaderJson.bytes) + " bytes");
  if (8 + h.header_len > file_size)
    bad(what, "header length " + std::to_string(h.header_len) + " runs past the end of the " +
                  std::to_string(file_size) + "-byte file");
  return h;
}

// Parses h.header. Each JSON entry is erased once converted, so the parsed
// document and what it becomes are not both held in full.
void parse_header_json(SafetensorsHeader& h, const std::string& what) {
  if (h.header.empty() || h.header.front() != '{') bad(what, "header does not start with '{'");

  json j = parse_json_text(h.header, what, "header", kHeaderJson);
  if (!j.is_object()) bad(what, "header is not a JSON object");

  const std::uint64_t buffer = h.file_size - 8 - h.header_len;
  for (auto it = j.begin(); it != j.end(); it = j.erase(it)) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) bad(what, "__metadata__ is not an object of strings");
      h.has_metadata = true;
      for (auto m = it->begin(); m != it->end(); m = it->erase(m)) {
        if (!m->is_string()) bad(what, "__metadata__[\"" + m.key() + "\"] is not a string");
        h.metadata.emplace(m.key(), std::move(m->get_ref<std::string&>()));
      }
      continue;
    }
    const std::string tw = "tensor '" + name + "'";
    const json& t = *it;
    if (!t.is_object()) bad(what, tw + ": entry is not an object");
    if (!t.contains("dtype") || !t["dtype"].is_string()) bad(what, tw + ": missing string \"dtype\"");
    if (!t.contains("shape") || !t["shape"].is_array()) bad(what, tw + ": missing array \"shape\"");
    if (!t.contains("data_offsets") || !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
      bad(what, tw + ": \"data_offsets\" must be [begin, end]");
    TensorInfo ti;
    ti.name = name;
    ti.dtype = t["dtype"].get<std::string>();
    for (const auto& d : t["shape"]) ti.shape.push_back(as_u64(d, what, tw + ": shape entry"));
    ti.begin = as_u64(t["data_offsets"][0], what, tw + ": data_offsets[0]");
    ti.end = as_u64(t["data_offsets"][1], what, tw + ": data_offsets[1]");
    if (ti.begin > ti.end)
      bad(what,
          tw + ": data_offsets [" + std::to_string(ti.begin) + ", " + std::to_string(ti.end) + "] has begin after end");
    std::uint64_t n = 1;
    for (auto d : ti.shape)
      if (mul_overflows(n, d, &n)) bad(what, tw + ": shape " + shape_string(ti.shape) + " overflows 64 bits");
    if (const std::size_t es = dtype_size(ti.dtype); es != 0) {
      std::uint64_t need = 0;
      if (mul_overflows(n, es, &need))
        bad(what, tw + ": shape " + shape_string(ti.shape) + " times " + ti.dtype + " size overflows 64 bits");
      if (ti.nbytes() != need)
        bad(what, tw + ": data_offsets span " + std::to_string(ti.nbytes()) + " bytes but shape " +
                      shape_string(ti.shape) + " of " + ti.dtype + " needs " + std::to_string(need));
    }
    h.tensors.push_back(std::move(ti));
  }

  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != pos) {
      bad(what, "tensor '" + t.name + "': data_offsets begin at " + std::to_string(t.begin) +
                    " but the previous tensor ends at " + std::to_string(pos) +
                    (t.begin > pos ? " (gap in the data buffer)" : " (overlap in the data buffer)"));
    }
    pos = t.end;
  }
  if (pos != buffer)
    bad(what, "tensors cover " + std::to_string(pos) + " bytes of data but the file holds " + std::to_string(buffer) +
                  " bytes after the header");
}

}  // namespace

SafetensorsHeader parse_safetensors(std::string_view bytes, std::uint64_t file_size, const std::string& what) {
  if (file_size >= 8 && bytes.size() < 8) bad(what, "fewer than 8 bytes given");
  SafetensorsHeader h = check_header_length(file_size < 8 ? 0 : read_le64(bytes.data()), file_size, what);
  if (bytes.size() < 8 + h.header_len) bad(what, "header truncated");
  h.header.assign(bytes.substr(8, h.header_len));
  parse_header_json(h, what);
  return h;
}

bool same_tensor_ranges(const SafetensorsHeader& a, const SafetensorsHeader& b) {
  if (a.header_len != b.header_len || a.file_size != b.file_size || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].begin != b.tensors[i].begin || a.tensors[i].end != b.tensors[i].end) return false;
  return true;
}

SafetensorsHeader read_safetensors(const fs::path& path) {
  File f(path, File::Mode::read);
  const std::uint64_t size = f.size();
  const std::string what = path.string();
  char len[8] = {};
  if (size >= 8) f.pread_exact(len, 8, 0);
  SafetensorsHeader h = check_header_length(read_le64(len), size, what);
  h.header.resize(h.header_len);  // read straight into place: the header text is held once
  f.pread_exact(h.header.data(), h.header_len, 8);
  parse_header_json(h, what);
  return h;
}

// ---- writing ------------------------------------------------------------------

std::string encode_safetensors_header(const std::vector<TensorInfo>& tensors,
                                      const std::map<std::string, std::string>* metadata, std::uint64_t header_len) {
  json j = json::object();
  if (metadata) j["__metadata__"] = *metadata;
  for (const auto& t : tensors)
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  std::string text = j.dump();
  std::uint64_t want = header_len ? header_len : (text.size() + 7) / 8 * 8;
  if (text.size() > want)
    fail(Exit::failure, "safetensors header of " + std::to_string(text.size()) + " bytes does not fit the reserved " +
                            std::to_string(want));
  text.resize(want, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((want >> (8 * i)) & 0xff);
  return out + text;
}

SafetensorsLayout layout_safetensors(std::vector<TensorSpec> specs, const std::map<std::string, std::string>* metadata,
                                     std::uint64_t min_header_len) {
  std::sort(specs.begin(), specs.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const int ra = dtype_rank(a.dtype), rb = dtype_rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  SafetensorsLayout L;
  std::uint64_t pos = 0;
  for (auto& s : specs) {
    if (const auto es = dtype_size(s.dtype)) {
      std::uint64_t n = es;
      for (auto d : s.shape)
        if (mul_overflows(n, d, &n))
          fail(Exit::failure, "tensor '" + s.name + "': shape " + shape_string(s.shape) + " overflows 64 bits");
      if (n != s.nbytes)
        fail(Exit::failure, "tensor '" + s.name + "': " + std::to_string(s.nbytes) + " bytes given but shape " +
                                shape_string(s.shape) + " of " + s.dtype + " needs " + std::to_string(n));
    }
    L.tensors.push_back({s.name, s.dtype, s.shape, pos, pos + s.nbytes});
    pos += s.nbytes;
  }
  std::string natural = encode_safetensors_header(L.tensors, metadata, 0);
  std::uint64_t hlen = std::max<std::uint64_t>(natural.size() - 8, (min_header_len + 7) / 8 * 8);
  L.prefix = hlen == natural.size() - 8 ? std::move(natural) : encode_safetensors_header(L.tensors, metadata, hlen);
  L.file_size = L.prefix.size() + pos;
  return L;
}

}  // namespace hfdelta
