#include "file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats::detail {
namespace {
Error ioError(const std::string& what, const std::string& path, int err) {
  std::string hint;
  if (err == ENOSPC) hint = "the disk is full; free space or write elsewhere";
  if (err == EFBIG) hint = "the file size limit was reached (ulimit -f)";
  if (err == EACCES || err == EPERM) hint = "check the permissions of the file and its directory";
  return Error(ErrorCode::Io, fmt::format("{} {}: {}", what, path, std::strerror(err)), hint);
}
}  // namespace

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    memory_ = o.memory_;
    memorySize_ = o.memorySize_;
    inMemory_ = o.inMemory_;
    o.fd_ = -1;
  }
  return *this;
}

File File::inMemory(const uint8_t* data, uint64_t size, std::string name) {
  File f(-1, std::move(name));
  f.memory_ = data;
  f.memorySize_ = size;
  f.inMemory_ = true;
  return f;
}

File File::openRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::NotFound, fmt::format("no such file: {}", path));
    throw ioError("cannot open", path, err);
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} is a directory, not a bundle", path));
  }
  return File(fd, path);
}

File File::create(const std::string& path, bool overwrite) {
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL);
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    int err = errno;
    if (err == EEXIST)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", path),
                  "choose another name or remove the file first");
    throw ioError("cannot create", path, err);
  }
  return File(fd, path);
}

uint64_t File::size() const {
  if (inMemory_) return memorySize_;
  struct stat st;
  if (fstat(fd_, &st) != 0) throw ioError("cannot stat", path_, errno);
  return uint64_t(st.st_size);
}

uint64_t File::preadSome(void* buf, uint64_t n, uint64_t offset) const {
  if (inMemory_) {
    if (offset >= memorySize_) return 0;
    uint64_t got = std::min(n, memorySize_ - offset);
    if (got) std::memcpy(buf, memory_ + offset, size_t(got));
    return got;
  }
  uint64_t got = 0;
  auto* p = static_cast<uint8_t*>(buf);
  while (got < n) {
    ssize_t r = ::pread(fd_, p + got, size_t(n - got), off_t(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ioError(fmt::format("cannot read {} bytes at byte {} of", n, offset), path_, errno);
    }
    if (r == 0) break;
    got += uint64_t(r);
  }
  return got;
}

void File::preadExact(void* buf, uint64_t n, uint64_t offset) const {
  uint64_t got = preadSome(buf, n, offset);
  if (got != n)
    throw Error(ErrorCode::Truncated,
                fmt::format("{} ends at byte {}, inside a structure of {} bytes at byte {}", path_, offset + got, n,
                            offset));
}

void File::writeAll(const void* const* parts, const uint64_t* sizes, int count, uint64_t atOffset) {
  if (inMemory_) throw Error(ErrorCode::Internal, fmt::format("{} is held in memory and cannot be written", path_));
  std::vector<iovec> iov;
  for (int i = 0; i < count; ++i)
    if (sizes[i]) iov.push_back({const_cast<void*>(parts[i]), size_t(sizes[i])});
  size_t first = 0;
  uint64_t written = 0;
  while (first < iov.size()) {
    int n = int(std::min<size_t>(iov.size() - first, 1024));
    ssize_t r = ::pwritev(fd_, iov.data() + first, n, off_t(atOffset + written));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw ioError(fmt::format("cannot write at byte {} of", atOffset + written), path_, errno);
    }
    written += uint64_t(r);
    auto left = size_t(r);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < iov.size() && left) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void File::datasync() {
  if (inMemory_) throw Error(ErrorCode::Internal, fmt::format("{} is held in memory and cannot be synced", path_));
  if (::fdatasync(fd_) != 0) throw ioError("cannot sync", path_, errno);
}

void File::close() {
  if (fd_ >= 0) {
    int r = ::close(fd_);
    fd_ = -1;
    if (r != 0) throw ioError("cannot close", path_, errno);
  }
}

void syncParentDirectory(const std::string& path) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory opens
  ::fsync(fd);
  ::close(fd);
}

}  // namespace crashcap::formats::detail
