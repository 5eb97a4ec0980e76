#include "crashcap/formats/directory.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace crashcap::formats {
namespace {

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

std::string failure(const std::string& what, const std::string& path, int error) {
  return what + " " + path + ": " + std::strerror(error);
}

// Removes NAME in the directory DIRFD (a directory's contents first); keeps the first failure.
void removeAt(int dirfd, const std::string& name, const std::string& shown, std::string& firstError) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    // Absent, or below something that is not a directory: nothing to remove (as rm -rf says).
    if (errno != ENOENT && errno != ENOTDIR && firstError.empty()) firstError = failure("cannot stat", shown, errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (firstError.empty()) firstError = failure("cannot open", shown, errno);
    } else {
      std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd));
      if (!dir) {
        if (firstError.empty()) firstError = failure("cannot list", shown, errno);
        ::close(fd);
      } else {
        std::vector<std::string> names;
        errno = 0;
        while (dirent* e = ::readdir(dir.get())) {
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
          errno = 0;
        }
        if (errno != 0 && firstError.empty()) firstError = failure("cannot list all of", shown, errno);
        for (const auto& child : names) removeAt(::dirfd(dir.get()), child, shown + "/" + child, firstError);
      }
    }
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && firstError.empty())
      firstError = failure("cannot remove", shown, errno);
    return;
  }
  if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT && firstError.empty())
    firstError = failure("cannot remove", shown, errno);
}

}  // namespace

std::string removeTree(const std::string& path) {
  if (path.empty()) return "no path to remove";
  // "link/" names what the link points at; the tree to remove is the link itself.
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  if (trimmed == "/") return "refusing to remove /";
  // "dir/." and "dir/.." name a directory by a link its own parent holds: what they name is not
  // removable under that name, and removing its contents first would empty "dir" or its parent
  // ("/." would empty the root), as rm -rf refuses to.
  const size_t slash = trimmed.rfind('/');
  const std::string last = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  if (last == "." || last == "..") return "refusing to remove '" + path + "': its last part is " + last;
  std::string firstError;
  removeAt(AT_FDCWD, trimmed, path, firstError);
  return firstError;
}

std::string listDirectory(const std::string& dir, std::vector<DirectoryEntry>& entries) {
  entries.clear();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
  std::unique_ptr<DIR, DirCloser> d(::fdopendir(fd));
  if (!d) {
    int error = errno;
    ::close(fd);
    return std::string("cannot list it: ") + std::strerror(error);
  }
  errno = 0;
  while (dirent* e = ::readdir(d.get())) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    DirectoryEntry entry;
    entry.name = e->d_name;
    struct stat st {};
    if (::fstatat(::dirfd(d.get()), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      entry.symlink = S_ISLNK(st.st_mode);
      entry.directory = S_ISDIR(st.st_mode);
      if (entry.symlink && ::fstatat(::dirfd(d.get()), e->d_name, &st, 0) == 0) entry.directory = S_ISDIR(st.st_mode);
    } else {
      // Not stat-able (gone since, or no permission on it): the directory entry's own type.
      entry.symlink = e->d_type == DT_LNK;
      entry.directory = e->d_type == DT_DIR;
    }
    entries.push_back(std::move(entry));
    errno = 0;
  }
  std::string result = errno != 0 ? std::string("cannot list all of it: ") + std::strerror(errno) : std::string();
  std::sort(entries.begin(), entries.end(),
            [](const DirectoryEntry& a, const DirectoryEntry& b) { return a.name < b.name; });
  return result;
}

}  // namespace crashcap::formats
