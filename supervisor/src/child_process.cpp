#include "crashcap/supervisor/child_process.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "crashcap/formats/error.hpp"

extern char** environ;

namespace crashcap::supervisor {
namespace {

using Clock = std::chrono::steady_clock;

/// The inherited environment with `extra` entries replacing those of the same name.
std::vector<std::string> mergedEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = std::any_of(extra.begin(), extra.end(),
                                [&](const std::string& x) { return x.substr(0, x.find('=')) == name; });
    if (!replaced) out.push_back(entry);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

}  // namespace

ChildProcess ChildProcess::start(const std::vector<std::string>& argv, const Options& options) {
  if (argv.empty()) throw Error(ErrorCode::InvalidArgument, "no command to run");
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> envStrings = mergedEnvironment(options.environment);
  std::vector<std::string> args = argv;
  std::vector<char*> envp, argp;
  for (auto& e : envStrings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);

  // status: the child writes errno there when exec fails; exec closes it (O_CLOEXEC) otherwise.
  int out[2], err[2], status[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(status, O_CLOEXEC) != 0)
    throw Error(ErrorCode::Io, fmt::format("pipe: {}", std::strerror(errno)));
  const char* dir = options.workingDirectory.empty() ? nullptr : options.workingDirectory.c_str();
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw Error(ErrorCode::Io, fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    if (options.ownProcessGroup) ::setpgid(0, 0);
    if (options.dieWithParent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before the request took hold
    }
    if (options.noInput) {
      int null = ::open("/dev/null", O_RDONLY);
      if (null >= 0) {
        ::dup2(null, 0);
        ::close(null);
      }
    }
    if (dir && ::chdir(dir) != 0) {
      int e = errno;
      (void)!::write(status[1], &e, sizeof e);
      ::_exit(127);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execvpe(argp[0], argp.data(), envp.data());
    int e = errno;
    (void)!::write(status[1], &e, sizeof e);
    ::_exit(127);
  }
  if (options.ownProcessGroup) ::setpgid(pid, pid);  // both sides: the group exists before any signal
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  int e = 0;
  ssize_t n;
  do n = ::read(status[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  ::close(status[0]);
  if (n == sizeof e) {
    int ignored;
    ::waitpid(pid, &ignored, 0);
    ::close(out[0]);
    ::close(err[0]);
    if (dir && ::access(dir, X_OK) != 0)
      throw Error(ErrorCode::NotFound, fmt::format("cannot run '{}' in {}: {}", argv[0], dir, std::strerror(e)),
                  "the working directory must exist");
    throw Error(ErrorCode::NotFound, fmt::format("cannot run '{}': {}", argv[0], std::strerror(e)),
                "check the command exists and is executable (a bare name is searched in PATH)");
  }
  return ChildProcess(pid, out[0], err[0], options.ownProcessGroup);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), out_(other.out_), err_(other.err_), group_(other.group_), exited_(other.exited_),
      status_(other.status_), exitedAt_(other.exitedAt_) {
  other.pid_ = -1;
  other.out_ = other.err_ = -1;
  other.exited_ = true;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exited_) {
    signal(SIGKILL);
    wait();
  }
  closePipes();
}

void ChildProcess::closePipes() {
  for (int* fd : {&out_, &err_})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
}

void ChildProcess::poll(int timeoutMs, const OutputHandler& onOutput, std::vector<pollfd>* extra) {
  std::vector<pollfd> fds = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
  if (extra)
    for (auto& p : *extra) fds.push_back({p.fd, p.events, 0});
  int r = ::poll(fds.data(), fds.size(), timeoutMs);
  if (r > 0) {
    char buf[65536];
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_ : err_;
      if (fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        if (onOutput) onOutput(i + 1, buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fd);
        fd = -1;
      }
    }
  }
  if (extra)
    for (size_t i = 0; i < extra->size(); ++i) (*extra)[i].revents = r > 0 ? fds[i + 2].revents : 0;
  if (!exited_ && ::waitpid(pid_, &status_, WNOHANG) == pid_) {
    exited_ = true;
    exitedAt_ = Clock::now();
  }
}

double ChildProcess::secondsSinceExit() const {
  return exited_ ? std::chrono::duration<double>(Clock::now() - exitedAt_).count() : 0;
}

void ChildProcess::signal(int sig) {
  if (pid_ <= 0 || exited_) return;
  ::kill(group_ ? -pid_ : pid_, sig);
}

void ChildProcess::wait() {
  if (pid_ > 0 && !exited_) {
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    exited_ = true;
    exitedAt_ = Clock::now();
  }
  closePipes();
}

int ChildProcess::exitCode() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }

int ChildProcess::termSignal() const { return WIFSIGNALED(status_) ? WTERMSIG(status_) : 0; }

CapturedRun runCaptured(const std::vector<std::string>& argv, double timeoutSeconds) {
  return runCaptured(argv, timeoutSeconds, {});
}

CapturedRun runCaptured(const std::vector<std::string>& argv, double timeoutSeconds, const ChildProcess::Options& options) {
  CapturedRun r;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeoutSeconds));
  auto child = ChildProcess::start(argv, options);
  auto capture = [&](int stream, const char* data, size_t size) { (stream == 1 ? r.out : r.err).append(data, size); };
  while (child.outputOpen() || !child.exited()) {
    // A grandchild may hold the pipes open after the child is gone: give it a moment, not more.
    if (child.exited() && child.secondsSinceExit() > 2) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      if (child.exited()) break;  // it ended in time; only a grandchild still holds the pipes
      r.timedOut = true;
      child.signal(SIGKILL);
      break;
    }
    // With both pipes closed only the exit is awaited: look again soon.
    child.poll(static_cast<int>(std::min<int64_t>(left, child.outputOpen() ? 1000 : 5)), capture);
  }
  child.wait();
  r.exitCode = child.termSignal() ? -child.termSignal() : child.exitCode();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::vector<CapturedRun> runTogether(const std::vector<TogetherCommand>& commands, double hangSeconds,
                                     double deadlineSeconds) {
  std::vector<CapturedRun> runs(commands.size());
  std::vector<ChildProcess> children;
  children.reserve(commands.size());
  auto t0 = Clock::now();
  try {
    for (const auto& c : commands) children.push_back(ChildProcess::start(c.argv, c.options));
  } catch (...) {
    for (auto& child : children) {
      child.signal(SIGKILL);
      child.wait();
    }
    throw;
  }
  std::vector<bool> done(children.size(), false);
  std::optional<Clock::time_point> firstEnd;
  for (size_t left = children.size(); left > 0;) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (done[i]) continue;
      auto& child = children[i];
      auto capture = [&](int stream, const char* data, size_t size) {
        (stream == 1 ? runs[i].out : runs[i].err).append(data, size);
      };
      // A grandchild may hold the pipes open after the child is gone: give it a moment, not more.
      bool ended = !child.outputOpen() && child.exited();
      if (child.exited() && child.secondsSinceExit() > 2) ended = true;
      // A process that has exited is waited for (its pipes, above), never counted as stopped.
      if (!ended && !child.exited() && firstEnd &&
          std::chrono::duration<double>(Clock::now() - *firstEnd).count() > hangSeconds) {
        runs[i].timedOut = true;
        child.signal(SIGKILL);
        ended = true;
      }
      if (!ended && !child.exited() && deadlineSeconds > 0 &&
          std::chrono::duration<double>(Clock::now() - t0).count() > deadlineSeconds) {
        runs[i].timedOut = runs[i].pastDeadline = true;
        child.signal(SIGKILL);
        ended = true;
      }
      if (!ended) {
        child.poll(child.outputOpen() ? 20 : 5, capture);
        continue;
      }
      child.wait();
      runs[i].exitCode = child.termSignal() ? -child.termSignal() : child.exitCode();
      runs[i].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      done[i] = true;
      --left;
      if (!firstEnd) firstEnd = Clock::now();
    }
  }
  return runs;
}

}  // namespace crashcap::supervisor
