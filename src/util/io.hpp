// File I/O kept apart from the codecs: read-only mappings for views, plain
// descriptors with pread/pwrite for in-place patching, and atomic publication.
// Every call here that changes a file or directory (write, rename, remove,
// flush, copy) is a numbered write step, where the crash-safety tests inject
// faults (docs/hacking.md, "Fault injection").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <boost/filesystem/path.hpp>

namespace hfdelta {

// Read-only, private mapping of a whole file. An empty file maps to an empty span.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const boost::filesystem::path& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::span<const std::uint8_t> bytes(std::uint64_t offset, std::uint64_t n) const;
  std::uint64_t size() const { return size_; }
  const boost::filesystem::path& path() const { return path_; }
  // Tells the kernel the range will be read sequentially soon.
  void advise_sequential(std::uint64_t offset, std::uint64_t n) const;

 private:
  boost::filesystem::path path_;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

// An owned file descriptor. Errors name the path.
class File {
 public:
  enum class Mode { read, read_write, create_exclusive };
  File() = default;
  File(const boost::filesystem::path& path, Mode mode);
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  int fd() const { return fd_; }
  const boost::filesystem::path& path() const { return path_; }
  std::uint64_t size() const;
  void pread_exact(void* buf, std::size_t n, std::uint64_t offset) const;
  void pwrite_all(const void* buf, std::size_t n, std::uint64_t offset);
  void write_all(const void* buf, std::size_t n);  // at the current position
  void truncate(std::uint64_t n);                  // sets the size; a file grown reads as zeros there
  // Sets the size to at least n with the blocks allocated (posix_fallocate):
  // a full disk is an error here, not a SIGBUS when a mapping is written.
  void reserve(std::uint64_t n);
  void sync();   // fdatasync
  void close();  // reports close errors instead of swallowing them

 private:
  boost::filesystem::path path_;
  int fd_ = -1;
};

// rename(2) and unlink/rmdir of one path, as write steps; errors name the paths.
void rename_path(const boost::filesystem::path& from, const boost::filesystem::path& to);
bool remove_path(const boost::filesystem::path& p);  // false if it did not exist
// link(2) as a write step; false where the filesystem has no hard links.
bool link_path(const boost::filesystem::path& from, const boost::filesystem::path& to);
// mkdir of `dir` and its missing parents, as a write step (none if it exists).
void make_dirs(const boost::filesystem::path& dir);

// True if anything (a dangling symlink too) is at `p`.
bool exists_nofollow(const boost::filesystem::path& p);

// `dir` must be a directory: a path that does not exist is a usage error
// (Error(usage): it says so, and `what_to_do`); anything else that is not a
// directory is Error(bad_input).
void require_dir(const boost::filesystem::path& dir, const std::string& what_to_do);

// Where `p` lies against directory `dir`, both resolved (symlinks, "..";
// `p` need not exist yet): the same directory, inside it (at any depth), or
// apart. Paths that cannot be resolved are apart: their own checks report them.
enum class Nesting { apart, same, inside };
Nesting nesting(const boost::filesystem::path& p, const boost::filesystem::path& dir);

// `p`, a path below `dir` as a directory iterator gives it, relative to `dir`
// by name with '/' separators. Not boost::filesystem::relative, which
// resolves symlinks: it would give a link's target ("../../blobs/<hash>")
// instead of the link.
std::string relative_name(const boost::filesystem::path& p, const boost::filesystem::path& dir);

// Unique hidden name beside `target` (".NAME.tmp-XXXXXXXX"): a crash leaves
// an obvious leftover, never a file or directory that looks complete.
boost::filesystem::path temp_path_beside(const boost::filesystem::path& target);

// Copies n bytes between two files, in the kernel where it can.
void copy_range(const File& in, std::uint64_t in_off, std::uint64_t n, File& out, std::uint64_t out_off);

// fsync on a directory, so that a rename or create inside it is durable.
void sync_dir(const boost::filesystem::path& dir);

// Writes `content` to `path` atomically: temp file beside it, flush (if sync),
// rename over, flush the directory (if sync).
void write_file_atomic(const boost::filesystem::path& path, std::string_view content, bool sync);

// Renames the finished directory `tmp` to `out` with RENAME_NOREPLACE: a
// publication never replaces a version someone else published meanwhile, not
// even an empty directory (Error(exists)). Where the filesystem rejects rename
// flags (EINVAL, ENOSYS: NFS, CephFS, FUSE), it checks that nothing is at
// `out` and renames with plain rename(2), which never replaces a file or a
// non-empty directory: the same guarantees, except that an empty directory
// made at `out` in between may be replaced.
void publish_dir(const boost::filesystem::path& tmp, const boost::filesystem::path& out);

// Reads a whole small file (configs, indexes, state); refuses files over max_bytes.
std::string read_small_file(const boost::filesystem::path& path, std::uint64_t max_bytes = 256u << 20);

// Copies a file to `dst` atomically (temp + rename), optionally flushed.
void copy_file_atomic(const boost::filesystem::path& src, const boost::filesystem::path& dst, bool sync);

// Bytes of the regular files below `dir` (symlinks not followed); a listing
// error is Error(failure) naming `dir`.
std::uint64_t tree_bytes(const boost::filesystem::path& dir);

// True if both files have the same size and bytes.
bool same_contents(const boost::filesystem::path& a, const boost::filesystem::path& b);

// Relative path `rel` is a plain path inside a directory: not absolute, no
// "..", no empty or "." components. Throws Error(bad_input) naming `what`.
void check_relative_path(const std::string& rel, const std::string& what);

}  // namespace hfdelta
