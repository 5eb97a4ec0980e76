#pragma once
// Thin POSIX file helpers that turn failures into Error{Io} naming the path and offset, and
// the same reads from a bundle held in memory.

#include <cstdint>
#include <string>

namespace crashcap::formats::detail {

/// Owns a file descriptor, or reads bytes held in memory as if they were a file.
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~File();
  File(File&& o) noexcept
      : fd_(o.fd_), path_(std::move(o.path_)), memory_(o.memory_), memorySize_(o.memorySize_), inMemory_(o.inMemory_) {
    o.fd_ = -1;
  }
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  static File openRead(const std::string& path);
  /// O_WRONLY|O_CREAT and O_EXCL unless overwrite (then O_TRUNC).
  static File create(const std::string& path, bool overwrite);
  /// A read-only file whose contents are the `size` bytes at `data`, which must outlive it;
  /// `name` stands for its path in messages. Writing or syncing it is an Error{Internal}.
  static File inMemory(const uint8_t* data, uint64_t size, std::string name);

  int fd() const { return fd_; }  ///< -1 for a file in memory
  const std::string& path() const { return path_; }
  uint64_t size() const;
  /// Reads exactly n bytes at offset; throws Truncated if the file ends first.
  void preadExact(void* buf, uint64_t n, uint64_t offset) const;
  /// Reads up to n bytes at offset; returns how many.
  uint64_t preadSome(void* buf, uint64_t n, uint64_t offset) const;
  /// Writes all parts in order at atOffset (pwritev, retrying short writes and EINTR).
  void writeAll(const void* const* parts, const uint64_t* sizes, int count, uint64_t atOffset);
  void datasync();
  void close();

 private:
  int fd_ = -1;
  std::string path_;
  const uint8_t* memory_ = nullptr;  // inMemory: the contents
  uint64_t memorySize_ = 0;
  bool inMemory_ = false;
};

/// fsync on the directory holding `path`, so a new file's name is durable.
void syncParentDirectory(const std::string& path);

}  // namespace crashcap::formats::detail
