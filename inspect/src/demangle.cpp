#include "crashcap/inspect/demangle.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace crashcap::inspect {
namespace {

/// A demangled name longer than this stays mangled (it is noise, not help).
constexpr size_t kMaxDemangledBytes = 64 * 1024;
/// The memory the demangling child may add to what it inherits.
constexpr rlim_t kDemangleMemoryBytes = 256ull << 20;
/// A child that spends this long on one name is stuck in an exponential one: it is killed and
/// the name stays mangled.
constexpr int kDemangleStallMs = 2000;
/// After this many stuck names the rest stay mangled, so a crafted bundle costs seconds at most.
constexpr int kMaxStuckNames = 3;
/// The child's answer for a name that stays mangled.
constexpr uint32_t kStaysMangled = 0xffffffff;

bool writeAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

/// The child: bounds its memory, then answers each name of `todo` from `from` on with a length
/// (kStaysMangled, or the demangled size) and the bytes. Never returns.
[[noreturn]] void demangleChild(int fd, const std::vector<std::string>& names, const std::vector<size_t>& todo,
                                size_t from) {
  // Its inherited address space plus a budget: an exponential name fails to allocate instead of
  // taking the machine's memory (and then stalls, which the parent sees).
  char statm[128] = {};
  int sfd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (sfd >= 0) {
    ssize_t n = ::read(sfd, statm, sizeof statm - 1);
    ::close(sfd);
    unsigned long long pages = n > 0 ? std::strtoull(statm, nullptr, 10) : 0;
    if (pages > 0) {
      rlimit limit{};
      limit.rlim_cur = limit.rlim_max = pages * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + kDemangleMemoryBytes;
      ::setrlimit(RLIMIT_AS, &limit);
    }
  }
  for (size_t i = from; i < todo.size(); ++i) {
    int status = 0;
    char* out = abi::__cxa_demangle(names[todo[i]].c_str(), nullptr, nullptr, &status);
    size_t size = status == 0 && out ? std::strlen(out) : 0;
    uint32_t length = status == 0 && out && size <= kMaxDemangledBytes ? static_cast<uint32_t>(size) : kStaysMangled;
    bool ok = writeAll(fd, &length, sizeof length) && (length == kStaysMangled || writeAll(fd, out, length));
    std::free(out);
    if (!ok) break;
  }
  ::_exit(0);
}

}  // namespace

std::vector<std::string> demangleSymbols(const std::vector<std::string>& names) {
  std::vector<std::string> result(names);
  std::vector<size_t> todo;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i].rfind("_Z", 0) == 0) todo.push_back(i);
  // A few hundred crafted bytes demangle to gigabytes (each back-reference can double the
  // output) and __cxa_demangle has no budget, so it runs in a child that can be killed.
  size_t next = 0;
  int stuck = 0;
  while (next < todo.size() && stuck < kMaxStuckNames) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) break;  // the names stay mangled
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      break;
    }
    if (pid == 0) {
      ::close(fds[0]);
      demangleChild(fds[1], names, todo, next);
    }
    ::close(fds[1]);
    std::string buffer;
    bool childFailed = false;
    for (;;) {
      // Take every complete answer in the buffer.
      size_t at = 0;
      while (next < todo.size() && buffer.size() - at >= sizeof(uint32_t)) {
        uint32_t length;
        std::memcpy(&length, buffer.data() + at, sizeof length);
        if (length == kStaysMangled) {
          at += sizeof length;
        } else if (buffer.size() - at - sizeof length >= length) {
          result[todo[next]] = buffer.substr(at + sizeof length, length);
          at += sizeof length + length;
        } else {
          break;
        }
        ++next;
      }
      buffer.erase(0, at);
      if (next == todo.size()) break;
      pollfd p{fds[0], POLLIN, 0};
      int ready = ::poll(&p, 1, kDemangleStallMs);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        childFailed = true;
        break;
      }
      char chunk[1 << 16];
      ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // the child died inside a name (out of its memory budget)
        childFailed = true;
        break;
      }
      buffer.append(chunk, static_cast<size_t>(n));
    }
    ::close(fds[0]);
    if (childFailed) ::kill(pid, SIGKILL);
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (childFailed) {
      ++next;  // the name it was on stays mangled
      ++stuck;
    }
  }
  return result;
}

std::string demangleSymbol(const std::string& name) { return demangleSymbols({name}).front(); }

}  // namespace crashcap::inspect
