#include "util/io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <boost/filesystem/operations.hpp>

#include "hfdelta/error.hpp"
#include "util/fault.hpp"
#include "util/scope_guard.hpp"

namespace hfdelta {

namespace fs = boost::filesystem;

namespace {

[[noreturn]] void sys_fail(const fs::path& p, const std::string& op) {
  const int e = errno;
  fail(Exit::failure, p, op + std::string(": ") + std::strerror(e));
}

}  // namespace

void rename_path(const fs::path& from, const fs::path& to) {
  fault_point("rename");
  if (::rename(from.c_str(), to.c_str()) != 0) sys_fail(to, "rename from " + from.string());
}

bool link_path(const fs::path& from, const fs::path& to) {
  fault_point("link");
  if (::link(from.c_str(), to.c_str()) == 0) return true;
  if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EMLINK || errno == ENOSYS) return false;
  sys_fail(to, "link to " + from.string());
}

bool remove_path(const fs::path& p) {
  fault_point("remove");
  if (::remove(p.c_str()) == 0) return true;
  if (errno == ENOENT) return false;
  sys_fail(p, "remove");
}

void make_dirs(const fs::path& dir) {
  boost::system::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  fault_point("mkdir");
  fs::create_directories(dir, ec);
  if (ec) fail(Exit::failure, dir, "cannot create: " + ec.message());
}

bool exists_nofollow(const fs::path& p) {
  boost::system::error_code ec;
  return fs::exists(fs::symlink_status(p, ec));
}

Nesting nesting(const fs::path& p, const fs::path& dir) {
  boost::system::error_code ep, ed;
  const fs::path a = fs::weakly_canonical(fs::absolute(p), ep), d = fs::canonical(dir, ed);
  if (ep || ed) return Nesting::apart;
  if (a == d) return Nesting::same;
  std::string prefix = d.generic_string();
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  return a.generic_string().rfind(prefix, 0) == 0 ? Nesting::inside : Nesting::apart;
}

void require_dir(const fs::path& dir, const std::string& what_to_do) {
  boost::system::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  if (!exists_nofollow(dir)) fail(Exit::usage, dir, "does not exist; " + what_to_do);
  fail(Exit::bad_input, dir, "not a directory");
}

std::string relative_name(const fs::path& p, const fs::path& dir) {
  std::string rel = p.generic_string().substr(dir.generic_string().size());
  rel.erase(0, rel.find_first_not_of('/'));
  return rel;
}

fs::path temp_path_beside(const fs::path& target) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, ".tmp-%08llx", static_cast<unsigned long long>(rng() & 0xffffffffu));
  return target.parent_path() / ("." + target.filename().string() + suffix);
}

// ---- MappedFile -------------------------------------------------------------

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  File f(path, File::Mode::read);
  size_ = f.size();
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd(), 0);
  if (p == MAP_FAILED) sys_fail(path, "mmap");
  data_ = static_cast<const std::uint8_t*>(p);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

std::span<const std::uint8_t> MappedFile::bytes(std::uint64_t offset, std::uint64_t n) const {
  if (offset > size_ || n > size_ - offset)
    fail(Exit::bad_input, path_,
         "range [" + std::to_string(offset) + ", +" + std::to_string(n) + ") is outside the " + std::to_string(size_) +
             "-byte file");
  return {data_ + offset, static_cast<std::size_t>(n)};
}

void MappedFile::advise_sequential(std::uint64_t offset, std::uint64_t n) const {
  if (!data_ || n == 0) return;
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = offset / page * page;
  ::madvise(const_cast<std::uint8_t*>(data_) + start, n + (offset - start), MADV_SEQUENTIAL);
  ::madvise(const_cast<std::uint8_t*>(data_) + start, n + (offset - start), MADV_WILLNEED);
}

// ---- File -------------------------------------------------------------------

File::File(const fs::path& path, Mode mode) : path_(path) {
  int flags = O_CLOEXEC;
  switch (mode) {
    case Mode::read:
      flags |= O_RDONLY;
      break;
    case Mode::read_write:
      flags |= O_RDWR;
      break;
    case Mode::create_exclusive:
      flags |= O_RDWR | O_CREAT | O_EXCL;
      break;
  }
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) sys_fail(path, mode == Mode::create_exclusive ? "create" : "open");
}

File::File(File&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) sys_fail(path_, "stat");
  if (!S_ISREG(st.st_mode)) fail(Exit::bad_input, path_, "not a regular file");
  return static_cast<std::uint64_t>(st.st_size);
}

void File::pread_exact(void* buf, std::size_t n, std::uint64_t offset) const {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(path_, "read at offset " + std::to_string(offset));
    }
    if (r == 0) fail(Exit::bad_input, path_, "unexpected end of file at offset " + std::to_string(offset));
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

void File::pwrite_all(const void* buf, std::size_t n, std::uint64_t offset) {
  fault_point("write");
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(path_, "write at offset " + std::to_string(offset));
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
}

void File::write_all(const void* buf, std::size_t n) {
  fault_point("write");
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd_, p, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(path_, "write");
    }
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

namespace {

[[noreturn]] void fail_published(const fs::path& out) {
  fail(Exit::exists, out, "already exists; refusing to overwrite");
}

[[noreturn]] void fail_rename(const fs::path& tmp, const fs::path& out, int e) {
  fail(Exit::failure, out, "rename from " + tmp.filename().string() + ": " + std::strerror(e));
}

// Where the filesystem takes no rename flags (the NFS and CephFS clients and
// many FUSE filesystems answer EINVAL): plain rename(2) is atomic as well,
// and refuses to replace a non-empty directory (EEXIST, ENOTEMPTY) or a
// non-directory (ENOTDIR). A published version always holds its index, so of
// two publishers exactly one wins. Anything at OUT before we start is refused
// as with RENAME_NOREPLACE; only an empty directory made at OUT between that
// check and the rename can be replaced, and it held nothing.
void publish_dir_portable(const fs::path& tmp, const fs::path& out) {
  struct stat st {};
  if (::lstat(out.c_str(), &st) == 0) fail_published(out);
  if (errno != ENOENT) fail_rename(tmp, out, errno);
  if (::rename(tmp.c_str(), out.c_str()) == 0) return;
  const int e = errno;
  if (e == EEXIST || e == ENOTEMPTY || e == ENOTDIR || e == EISDIR) fail_published(out);
  fail_rename(tmp, out, e);
}

}  // namespace

void publish_dir(const fs::path& tmp, const fs::path& out) {
  fault_point("rename");
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0) return;
  const int e = errno;
  if (e == EEXIST) fail_published(out);
  if (e == EINVAL || e == ENOSYS) return publish_dir_portable(tmp, out);
  fail_rename(tmp, out, e);
}

void File::truncate(std::uint64_t n) {
  fault_point("ftruncate");
  if (::ftruncate(fd_, static_cast<off_t>(n)) != 0) sys_fail(path_, "ftruncate");
}

void File::reserve(std::uint64_t n) {
  fault_point("fallocate");
  if (n == 0) return;
  // glibc writes the blocks itself where the filesystem has no fallocate.
  if (const int e = ::posix_fallocate(fd_, 0, static_cast<off_t>(n)); e != 0) {
    errno = e;
    sys_fail(path_, "reserving " + std::to_string(n) + " bytes");
  }
}

void File::sync() {
  fault_point("fdatasync");
  if (::fdatasync(fd_) != 0) sys_fail(path_, "fdatasync");
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) sys_fail(path_, "close");
}

// ---- helpers ------------------------------------------------------------------

void sync_dir(const fs::path& dir) {
  fault_point("fsync directory");
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) sys_fail(dir, "open directory");
  const int r = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (r != 0) {
    errno = e;
    sys_fail(dir, "fsync directory");
  }
}

void write_file_atomic(const fs::path& path, std::string_view content, bool sync) {
  const fs::path tmp = temp_path_beside(path);
  {
    const OnFailure remove_tmp([&] { ::unlink(tmp.c_str()); });
    File f(tmp, File::Mode::create_exclusive);
    f.write_all(content.data(), content.size());
    if (sync) f.sync();
    f.close();
    rename_path(tmp, path);
  }
  if (sync) sync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

std::string read_small_file(const fs::path& path, std::uint64_t max_bytes) {
  File f(path, File::Mode::read);
  const std::uint64_t n = f.size();
  if (n > max_bytes)
    fail(Exit::bad_input, path,
         std::to_string(n) + " bytes, more than the " + std::to_string(max_bytes) + " this file may have");
  std::string s(n, '\0');
  f.pread_exact(s.data(), n, 0);
  return s;
}

void copy_file_atomic(const fs::path& src, const fs::path& dst, bool sync) {
  File in(src, File::Mode::read);
  const std::uint64_t n = in.size();
  const fs::path tmp = temp_path_beside(dst);
  const OnFailure remove_tmp([&] { ::unlink(tmp.c_str()); });
  File out(tmp, File::Mode::create_exclusive);
  copy_range(in, 0, n, out, 0);
  if (out.size() != n) fail(Exit::failure, src, "changed size while being copied");
  ::fchmod(out.fd(), 0644);
  if (sync) out.sync();
  out.close();
  rename_path(tmp, dst);
}

void copy_range(const File& in, std::uint64_t in_off, std::uint64_t n, File& out, std::uint64_t out_off) {
  fault_point("copy");
  // copy_file_range lets the kernel (or a reflink-capable filesystem) move
  // the bytes without a round trip through user memory.
  while (n > 0) {
    loff_t i = static_cast<loff_t>(in_off), o = static_cast<loff_t>(out_off);
    const ssize_t r = ::copy_file_range(in.fd(), &i, out.fd(), &o, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) break;
      sys_fail(out.path(), "copy from " + in.path().string());
    }
    if (r == 0) fail(Exit::bad_input, in.path(), "unexpected end of file at offset " + std::to_string(in_off));
    in_off += static_cast<std::uint64_t>(r), out_off += static_cast<std::uint64_t>(r),
        n -= static_cast<std::uint64_t>(r);
  }
  std::vector<char> buf(static_cast<std::size_t>(std::min<std::uint64_t>(n, 1u << 20)));
  while (n > 0) {  // fallback where the kernel cannot copy between these files
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), n));
    in.pread_exact(buf.data(), k, in_off);
    out.pwrite_all(buf.data(), k, out_off);
    in_off += k, out_off += k, n -= k;
  }
}

bool same_contents(const fs::path& a, const fs::path& b) {
  File fa(a, File::Mode::read), fb(b, File::Mode::read);
  const std::uint64_t n = fa.size();
  if (fb.size() != n) return false;
  std::vector<char> ba(1 << 20), bb(1 << 20);
  for (std::uint64_t off = 0; off < n;) {
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(ba.size(), n - off));
    fa.pread_exact(ba.data(), k, off);
    fb.pread_exact(bb.data(), k, off);
    if (std::memcmp(ba.data(), bb.data(), k) != 0) return false;
    off += k;
  }
  return true;
}

void check_relative_path(const std::string& rel, const std::string& what) {
  auto bad = [&](const char* why) { fail(Exit::bad_input, what + ": path \"" + rel + "\" " + why); };
  if (rel.empty()) bad("is empty");
  if (rel.front() == '/') bad("is absolute");
  if (rel.find('\0') != std::string::npos) bad("contains a NUL byte");
  if (rel.find('\\') != std::string::npos) bad("contains a backslash");
  std::size_t start = 0;
  while (start <= rel.size()) {
    const std::size_t slash = rel.find('/', start);
    const std::string part = rel.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty()) bad("has an empty component");
    if (part == ".") bad("has a '.' component");
    if (part == "..") bad("has a '..' component");
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

std::uint64_t tree_bytes(const fs::path& dir) {
  std::uint64_t n = 0;
  boost::system::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    const auto st = it->symlink_status(ec);
    if (!ec && fs::is_regular_file(st)) n += fs::file_size(it->path(), ec);
  }
  if (ec) fail(Exit::failure, dir, "cannot list: " + ec.message());
  return n;
}

}  // namespace hfdelta
