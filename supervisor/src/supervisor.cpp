#include "crashcap/supervisor/supervisor.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/observed_run.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/cuda_errors.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/distributed.hpp"
#include "crashcap/recorder/environment.hpp"
#include "crashcap/cupti/trace_file.hpp"
#include "crashcap/cupti/tracer.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/supervisor/child_process.hpp"
#include "crashcap/supervisor/run_log.hpp"
#include "crashcap/formats/signal_name.hpp"

namespace crashcap::supervisor {
namespace fs = std::filesystem;
using recorder::bundlePath;
using recorder::captureEnvironment;
using recorder::isRecording;
using recorder::kRecordingPrefix;
using recorder::redactArguments;
using recorder::sealRecording;
using recorder::SealOptions;
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Ctrl-C, SIGTERM and SIGHUP to `crashcap run` arrive here and are handled in the loop.
int gStopPipe[2] = {-1, -1};
void onStopSignal(int sig) {
  char c = static_cast<char>(sig);
  int saved = errno;
  (void)!::write(gStopPipe[1], &c, 1);
  errno = saved;
}

/// Installs the stop handlers for the scope of supervise() and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    if (gStopPipe[0] < 0 && ::pipe2(gStopPipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(ErrorCode::Io, fmt::format("pipe: {}", std::strerror(errno)));
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &previous_[i]);
  }
  ~StopSignals() {
    for (size_t i = 0; i < 3; ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  /// A stop signal that arrived since the last call, or 0.
  static int take() {
    char c = 0;
    return ::read(gStopPipe[0], &c, 1) == 1 ? c : 0;
  }
  static int fd() { return gStopPipe[0]; }

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction previous_[3];
};

/// The last `limit` bytes of a stream.
class Tail {
 public:
  explicit Tail(size_t limit) : limit_(limit) {}
  void add(const char* p, size_t n) {
    data_.append(p, n);
    if (data_.size() > 2 * limit_) data_.erase(0, data_.size() - limit_);
  }
  std::string str() const { return data_.size() > limit_ ? data_.substr(data_.size() - limit_) : data_; }

 private:
  size_t limit_;
  std::string data_;
};

void writeAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // our own output is gone (closed pipe): keep supervising, keep the tails
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

/// One process crashcap run started: the command, or one rank of a job (SuperviseOptions::nproc).
struct Member {
  Member(ChildProcess c, int r, size_t tailBytes) : child(std::move(c)), rank(r), outTail(tailBytes), errTail(tailBytes) {}
  ChildProcess child;
  int rank = -1;  ///< -1: the command itself
  Tail outTail, errTail;
  bool ended = false;   ///< seen to exit
  bool stopped = false; ///< stopped by crashcap run after another rank failed
  double seconds = 0;   ///< from the start to its exit
  bool failed() const { return ended && (child.termSignal() != 0 || child.exitCode() != 0); }
  std::string name() const { return rank < 0 ? "the command" : fmt::format("rank {} (pid {})", rank, child.pid()); }
};

/// Passes the children's output through, keeps the tails, handles stop signals, waits for all.
/// Of a job's ranks (more than one member), once one has failed the others get o.hangSeconds
/// to end on their own and are then stopped.
struct Watched {
  bool interrupted = false;          ///< crashcap run was asked to stop
  const Member* firstFailed = nullptr;  ///< the member seen to fail first (not one crashcap stopped)
};
Watched watch(std::vector<Member>& members, const SuperviseOptions& o, bool& stopRequested, int cudnnFd, Tail* cudnnTail,
           Clock::time_point started) {
  std::vector<pollfd> extra = {{StopSignals::fd(), POLLIN, 0}, {cudnnFd, POLLIN, 0}};
  bool interrupted = false, termSent = false;
  Clock::time_point stopAt, failedAt, hangStopAt;
  const Member* firstFailed = nullptr;
  bool hangStopSent = false;
  char buf[65536];
  auto running = [&] {
    std::vector<Member*> out;
    for (auto& m : members)
      if (!m.child.exited()) out.push_back(&m);
    return out;
  };
  for (;;) {
    // Grandchildren may hold the pipes open after a child is gone: give them a moment.
    bool done = std::all_of(members.begin(), members.end(), [](const Member& m) {
      return m.child.exited() && (!m.child.outputOpen() || m.child.secondsSinceExit() > 2);
    });
    if (done) break;
    for (size_t i = 0; i < members.size(); ++i) {
      Member& m = members[i];
      auto passThrough = [&](int stream, const char* data, size_t n) {
        writeAll(stream, data, n);
        (stream == 1 ? m.outTail : m.errTail).add(data, n);
      };
      // With both pipes closed the child is exiting: look again soon rather than in 100 ms.
      int timeout = m.child.outputOpen() ? (members.size() == 1 ? 100 : 20) : 5;
      if (m.child.exited() && !m.child.outputOpen()) timeout = 0;
      m.child.poll(timeout, passThrough, i == 0 ? &extra : nullptr);
      if (m.child.exited() && !m.ended) {
        m.ended = true;
        m.seconds = secondsSince(started);
        if (m.failed() && !firstFailed && !m.stopped) {
          firstFailed = &m;
          failedAt = Clock::now();
          if (members.size() > 1 && !running().empty() && o.say && !stopRequested)
            o.say(fmt::format("crashcap run: {} failed; the other ranks have {:.0f} s to end on their own before "
                              "they are stopped",
                              m.name(), o.hangSeconds));
        }
      }
    }
    if (cudnnFd >= 0 && (extra[1].revents & POLLIN)) {
      ssize_t n = ::read(cudnnFd, buf, sizeof buf);
      if (n > 0) cudnnTail->add(buf, static_cast<size_t>(n));
    }
    while (int sig = StopSignals::take()) {
      if (running().empty()) continue;
      if (!stopRequested) {
        stopRequested = interrupted = true;
        stopAt = Clock::now();
        const char* name = formats::signalName(sig);
        if (o.say)
          o.say(fmt::format("crashcap run: {} received: stopping the command (SIGINT now, SIGTERM after {:.0f} s, "
                            "SIGKILL after {:.0f} s)",
                            name ? name : "signal", o.stopGraceSeconds / 2, o.stopGraceSeconds));
        for (auto* m : running()) m->child.signal(SIGINT);
      } else {
        if (o.say) o.say("crashcap run: second stop signal: SIGKILL");
        for (auto* m : running()) m->child.signal(SIGKILL);
      }
    }
    if (stopRequested && !running().empty()) {
      double waited = secondsSince(stopAt);
      if (!termSent && waited > o.stopGraceSeconds / 2) {
        termSent = true;
        for (auto* m : running()) m->child.signal(SIGTERM);
      }
      if (waited > o.stopGraceSeconds)
        for (auto* m : running()) m->child.signal(SIGKILL);
    }
    // A job whose rank failed: the others wait in a collective for a peer that is gone, until its
    // timeout (30 minutes by default). They are stopped instead; SIGTERM lets a recorder seal
    // what it holds (its op ring: the collective it waits in).
    if (firstFailed && members.size() > 1 && !stopRequested) {
      auto left = running();
      if (!hangStopSent && !left.empty() && secondsSince(failedAt) > o.hangSeconds) {
        hangStopSent = true;
        hangStopAt = Clock::now();
        std::vector<std::string> names;
        for (auto* m : left) {
          m->stopped = true;
          names.push_back(m->name());
          m->child.signal(SIGTERM);
        }
        if (o.say)
          o.say(fmt::format("crashcap run: {} {} not ended {:.0f} s after {} failed: SIGTERM now, SIGKILL after {:.0f} s",
                            fmt::join(names, ", "), names.size() == 1 ? "has" : "have", o.hangSeconds,
                            firstFailed->name(), o.stopGraceSeconds / 2));
      }
      if (hangStopSent && secondsSince(hangStopAt) > o.stopGraceSeconds / 2)
        for (auto* m : left) m->child.signal(SIGKILL);
    }
  }
  for (auto& m : members) {
    m.child.wait();
    if (!m.ended) {
      m.ended = true;
      m.seconds = secondsSince(started);
    }
  }
  if (cudnnFd >= 0) {  // what the log still holds
    ssize_t n;
    while ((n = ::read(cudnnFd, buf, sizeof buf)) > 0) cudnnTail->add(buf, static_cast<size_t>(n));
  }
  return {interrupted, firstFailed};
}


/// The pid in a name crashcap gives recordings and bundles ("recording-<time>-<pid>",
/// "crash-<time>-<pid>[-N].ccap"); 0 when there is none.
uint32_t pidInName(const std::string& name) {
  auto first = name.find('-');
  auto second = first == std::string::npos ? first : name.find('-', first + 1);
  if (second == std::string::npos) return 0;
  uint64_t pid = 0;
  size_t i = second + 1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && pid < (1ull << 32); ++i)
    pid = pid * 10 + static_cast<uint64_t>(name[i] - '0');
  return i > second + 1 && pid < (1ull << 32) ? static_cast<uint32_t>(pid) : 0;
}

/// What is in the directory now: bundles and recordings present before a run are not its.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.insert(e.path().filename().string());
  return names;
}

/// Rewrites `bundle` with `supervision` appended (OUT.partial, then a rename over it).
void appendSupervision(const std::string& bundle, const formats::SupervisionData& supervision,
                       const std::vector<formats::KernelTraceData>& traces) {
  formats::PartialOutput output(bundle);
  {
    auto reader = formats::BundleReader::open(bundle);
    formats::WriterOptions wo;
    wo.overwrite = true;
    wo.producer = "crashcap run";
    auto writer = formats::BundleWriter::createCopy(output.path(), reader->fileHeader(), wo);
    formats::copyRecords(*reader, *writer, {}, /*decodeChunks=*/false);
    for (const auto& t : traces) formats::writeMetaRecord(*writer, t);
    formats::writeMetaRecord(*writer, supervision);
    writer->seal();
  }
  output.commit();
}

/// A bundle of the supervisor's own: the environment it ran the command in, and what it saw.
std::string writeOwnBundle(const std::string& dir, const formats::SupervisionData& supervision,
                           const std::vector<formats::KernelTraceData>& traces) {
  std::string path = bundlePath(dir, "crash", supervision.endNs, supervision.pid);
  formats::PartialOutput output(path);
  {
    formats::WriterOptions wo;
    wo.overwrite = true;
    wo.producer = "crashcap run";
    auto writer = formats::BundleWriter::create(output.path(), wo);
    writer->writeEnvironment(captureEnvironment());
    for (const auto& t : traces) formats::writeMetaRecord(*writer, t);
    formats::writeMetaRecord(*writer, supervision);
    writer->seal();
  }
  output.commit();
  return path;
}

}  // namespace

std::string injectionLibrary() {
  if (const char* v = std::getenv("CRASHCAP_INJECT_LIBRARY")) return fs::exists(v) ? v : "";
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  // The build puts it beside crashcap; `cmake --install` in the library directory beside bin/.
  for (const auto& candidate : {self.parent_path() / "libcrashcap_inject.so",
                                self.parent_path().parent_path() / CRASHCAP_INSTALL_LIBDIR / "libcrashcap_inject.so"})
    if (fs::exists(candidate, ec)) return candidate.string();
  return "";
}

std::string pythonPackage() {
  auto bootstrapIn = [](const fs::path& package) {
    std::error_code ec;
    return fs::exists(package / "_bootstrap" / "sitecustomize.py", ec) && fs::exists(package / "__init__.py", ec);
  };
  if (const char* v = std::getenv("CRASHCAP_PYTHON_PACKAGE")) {
    // The bootstrap imports `crashcap` from the directory above it: a copy under another name
    // would run the program unrecorded, saying so only in the child's stderr.
    const fs::path package = fs::absolute(v).lexically_normal();
    const std::string name = (package.filename().empty() ? package.parent_path() : package).filename().string();
    if (bootstrapIn(package) && name != "crashcap")
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("CRASHCAP_PYTHON_PACKAGE={} is a crashcap package named '{}': the recorded program "
                              "imports it as `crashcap` from the directory above it, so its directory must be named crashcap",
                              v, name),
                  "copy it to a directory named crashcap (e.g. /tmp/old/crashcap) and point at that");
    if (bootstrapIn(package)) return package.string();
    throw Error(ErrorCode::NotFound,
                fmt::format("CRASHCAP_PYTHON_PACKAGE={} is not the crashcap Python package (no __init__.py and "
                            "_bootstrap/sitecustomize.py in it)", v),
                "point it at the crashcap directory of a build (build/python/crashcap) or unset it");
  }
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  fs::path prefix = ec ? fs::path() : self.parent_path().parent_path();
  if (!prefix.empty()) candidates.push_back(prefix / "python" / "crashcap");
#ifdef CRASHCAP_PYTHON_INSTALL_DIR
  // Installed: relative to the prefix crashcap is installed under (or an absolute directory).
  fs::path installed = CRASHCAP_PYTHON_INSTALL_DIR;
  candidates.push_back(installed.is_absolute() || prefix.empty() ? installed : prefix / installed);
#endif
  for (const auto& c : candidates)
    if (bootstrapIn(c)) return c.string();
  throw Error(ErrorCode::NotFound, "crashcap run --record needs the crashcap Python package, and there is none here",
              "build it (./dev build, with python3-torch, pybind11-dev and python3-dev installed; "
              "-DCRASHCAP_WITH_PYTHON=ON says what is missing) or set CRASHCAP_PYTHON_PACKAGE to its directory");
}

std::string traceStatus() {
  std::string reason = cupti::gpuUnavailableReason();
  if (!reason.empty()) return "unavailable: " + reason;
  if (!cupti::builtWithCupti()) return "unavailable: this crashcap was built without CUPTI";
  std::string lib = injectionLibrary();
  if (lib.empty()) return "unavailable: libcrashcap_inject.so is not next to crashcap (set CRASHCAP_INJECT_LIBRARY)";
  return "available: kernels are traced through " + lib;
}

namespace {

/// The trace files the run's processes left (new or rewritten since `since`), decoded.
std::vector<formats::KernelTraceData> collectTraces(const std::string& dir, const std::set<std::string>& before,
                                                    std::vector<std::string>& files,
                                                    const std::function<void(const std::string&)>& say) {
  std::vector<formats::KernelTraceData> traces;
  for (const auto& name : listing(dir)) {
    if (before.count(name) || name.rfind(cupti::kTraceFilePrefix, 0) != 0 ||
        fs::path(name).extension() != cupti::kTraceFileExtension)
      continue;
    auto path = (fs::path(dir) / name).string();
    files.push_back(path);
    try {
      for (auto& t : cupti::readKernelTraces(path)) traces.push_back(std::move(t));
    } catch (const Error& e) {
      if (say) say(fmt::format("crashcap run: unreadable kernel trace {}: {}", path, e.what()));
    }
  }
  return traces;
}

/// The number of the training --record's observer recorded into the recording or bundle at `path`
/// (python.observed.training: 0 for a process's first); nullopt when the observer did not record it.
std::optional<int> observedTraining(const std::string& path) {
  try {
    const auto file = fs::is_directory(path) ? (fs::path(path) / recorder::kRunFileName).string() : path;
    auto env = formats::BundleReader::open(file)->environment();
    if (!env || env->fact("python.capture") != "observed") return std::nullopt;
    return std::stoi(env->fact("python.observed.training"));
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable, or no number
  }
}

/// Whether the recording at `path` was started by `--record`'s observer (python.capture = observed).
bool observedRecording(const std::string& path) {
  try {
    auto env = formats::BundleReader::open((fs::path(path) / recorder::kRunFileName).string())->environment();
    return env && env->fact("python.capture") == "observed";
  } catch (const Error&) {
    return false;  // unreadable: not ours to remove
  }
}

/// The first sticky CUDA error (the one that poisoned a context, earliest across the run's
/// processes) names the failure better than a generic exit does. Soft errors do not: PyTorch's
/// caching allocator recovers from a failed cudaMalloc, and the run may die of something else.
void refineClassification(Classification& c, const std::vector<formats::KernelTraceData>& traces) {
  static const std::set<std::string> generic = {"python-exception", "exit-nonzero", "signal"};
  if (!generic.count(c.id)) return;
  uint32_t pid = 0;
  const auto* e = cupti::firstStickyError(traces, &pid);
  if (!e) return;
  std::string id = formats::classificationForCode(e->code, e->domain == "driver");
  if (id.empty()) return;
  c.id = id;
  c.evidence = fmt::format("kernel trace of pid {}: first sticky CUDA error {} ({}) in {}{}", pid,
                           e->name.empty() ? "code" : e->name, e->code, e->api,
                           e->symbol.empty() ? "" : fmt::format(" launching {}", e->symbol));
}

/// A FIFO for cuDNN's API log: cuDNN writes into it, the supervisor keeps the tail in memory,
/// so a long run's log never fills the disk.
struct CudnnLog {
  std::string path;
  int fd = -1, keepOpen = -1;
  CudnnLog(const std::string& dir, int attempt) {
    path = (fs::path(dir) / fmt::format(".cudnn-log-{}-{}.fifo", ::getpid(), attempt)).string();
    ::unlink(path.c_str());
    if (::mkfifo(path.c_str(), 0600) != 0)
      throw Error(ErrorCode::Io, fmt::format("cannot make the cuDNN log pipe {}: {}", path, std::strerror(errno)));
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    keepOpen = fd >= 0 ? ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC) : -1;  // no EOF between writers
    if (fd < 0 || keepOpen < 0) {
      std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      ::unlink(path.c_str());
      throw Error(ErrorCode::Io, fmt::format("cannot open the cuDNN log pipe {}: {}", path, why));
    }
  }
  ~CudnnLog() {
    if (fd >= 0) ::close(fd);
    if (keepOpen >= 0) ::close(keepOpen);
    ::unlink(path.c_str());
  }
  std::vector<std::string> environment() const {
    // cuDNN 9 reads LOGLEVEL; cuDNN 8 reads the three LOG*_DBG switches. Both read LOGDEST.
    return {"CUDNN_LOGLEVEL_DBG=3", "CUDNN_LOGINFO_DBG=1", "CUDNN_LOGWARN_DBG=1", "CUDNN_LOGERR_DBG=1",
            "CUDNN_LOGDEST_DBG=" + path};
  }
};

}  // namespace

int SuperviseReport::exitStatus() const {
  if (attempts.empty()) return 1;
  const auto& a = attempts.back();
  return a.signal ? 128 + a.signal : a.exitCode;
}

SuperviseReport supervise(const SuperviseOptions& o) {
  if (o.command.empty())
    throw Error(ErrorCode::InvalidArgument, "no command to run", "give it after --: crashcap run -- python train.py");
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec || !fs::is_directory(o.dir))
    throw Error(ErrorCode::Io, fmt::format("cannot make the directory {}: {}", o.dir, ec.message()));
  std::string dir = fs::absolute(o.dir).string();

  SuperviseReport report;
  report.trace = traceStatus();
  std::vector<std::string> extraEnv = {fmt::format("{}={}", recorder::kOutputDirVariable, dir)};
  if (o.launchBlocking) extraEnv.push_back("CUDA_LAUNCH_BLOCKING=1");
  if (o.deviceSideAssertions) extraEnv.push_back("TORCH_USE_CUDA_DSA=1");
  if (o.observePython) {
    // The bootstrap first (Python imports the first sitecustomize on its path; crashcap's runs
    // the one it hides), then the user's own PYTHONPATH. The bootstrap puts the package's parent
    // at the end of sys.path itself: an installed package's parent is a whole site directory,
    // which must not shadow the program's own torch or numpy.
    fs::path package = pythonPackage();
    std::string path = (package / "_bootstrap").string();
    const char* user = std::getenv("PYTHONPATH");
    if (user && *user) path += std::string(":") + user;
    extraEnv.push_back("PYTHONPATH=" + path);
    extraEnv.push_back(std::string(formats::kObserveVariable) + "=" + o.observePolicy);
  }
  if (o.kernelTrace && !std::getenv("CUDA_INJECTION64_PATH")) {
    std::string lib = injectionLibrary();
    if (!lib.empty()) extraEnv.push_back("CUDA_INJECTION64_PATH=" + lib);
  }

  StopSignals stopSignals;
  bool stopRequested = false;
  int consecutive = 0;
  double backoff = o.backoffSeconds;
  for (int attempt = 1;; ++attempt) {
    auto before = listing(dir);
    auto started = Clock::now();
    int64_t startNs = formats::unixTimeNs();
    std::optional<CudnnLog> cudnnLog;
    std::vector<std::string> env = extraEnv;
    // One job id per run of the command, inherited by every rank a launcher under it starts, so
    // that their recordings are one job's; an id this crashcap run was given (the same on every
    // node of a multi-node job) is kept.
    std::string jobId;
    if (const char* given = std::getenv(recorder::kJobIdVariable); given && *given) {
      jobId = given;
    } else {
      jobId = fmt::format("run-{}-{}-{}", startNs / 1000000, ::getpid(), attempt);
      env.push_back(fmt::format("{}={}", recorder::kJobIdVariable, jobId));
    }
    if (o.cudnnLog) {
      try {
        cudnnLog.emplace(dir, attempt);
        for (auto& e : cudnnLog->environment()) env.push_back(e);
      } catch (const Error& e) {
        // The log helps explain a failure; its absence must not stop the training.
        if (o.say) o.say(fmt::format("crashcap run: running without --cudnn-log: {}", e.what()));
      }
    }
    // The program may declare its hyperparameters (crashcap.hyperparameters) into this file.
    const std::string paramsFile = (fs::path(dir) / fmt::format(".params-{}-{}.json", ::getpid(), attempt)).string();
    fs::remove(paramsFile, ec);
    env.push_back(fmt::format("{}={}", kParamsFileVariable, paramsFile));
    Tail cudnnTail(o.cudnnLogTailBytes);
    ChildProcess::Options co;
    co.environment = env;
    co.ownProcessGroup = true;  // a stop reaches the whole training, its workers included
    std::vector<Member> members;
    members.reserve(static_cast<size_t>(std::max(1, o.nproc)));
    if (o.nproc > 0) {
      // The variables torchrun sets for the ranks of a one-machine job.
      const int port = o.masterPort > 0 ? o.masterPort : freePort();
      for (int rank = 0; rank < o.nproc; ++rank) {
        ChildProcess::Options rc = co;
        for (const auto& [name, value] :
             {std::pair<const char*, int>{"RANK", rank}, {"LOCAL_RANK", rank}, {"WORLD_SIZE", o.nproc},
              {"LOCAL_WORLD_SIZE", o.nproc}, {"GROUP_RANK", 0}, {"MASTER_PORT", port}})
          rc.environment.push_back(fmt::format("{}={}", name, value));
        rc.environment.push_back("MASTER_ADDR=127.0.0.1");
        members.emplace_back(ChildProcess::start(o.command, rc), rank, o.tailBytes);
      }
    } else {
      members.emplace_back(ChildProcess::start(o.command, co), -1, o.tailBytes);
    }
    const Watched watched = watch(members, o, stopRequested, cudnnLog ? cudnnLog->fd : -1, &cudnnTail, started);
    const bool interrupted = watched.interrupted;
    const Member* firstFailed = watched.firstFailed;
    cudnnLog.reset();
    std::vector<std::string> traceFiles;
    auto traces = collectTraces(dir, before, traceFiles, o.say);

    AttemptReport a;
    std::string paramsProblem;
    a.params = mergeParams(commandLineParams(redactArguments(o.command)), declaredParams(paramsFile, &paramsProblem));
    fs::remove(paramsFile, ec);
    if (!paramsProblem.empty() && o.say) o.say("crashcap run: the run's declared hyperparameters are lost: " + paramsProblem);
    a.attempt = attempt;
    for (const auto& m : members) a.seconds = std::max(a.seconds, m.seconds);
    if (interrupted) report.interrupted = true;
    // Each process's own account: its exit, its classification, its record.
    std::vector<RankReport> ranks;
    std::vector<formats::SupervisionData> records;
    for (const auto& m : members) {
      RankReport r;
      r.rank = m.rank;
      r.pid = static_cast<uint32_t>(m.child.pid());
      r.signal = m.child.termSignal();
      r.exitCode = r.signal ? -1 : m.child.exitCode();
      r.stopped = m.stopped;
      r.seconds = m.seconds;
      const std::string out = m.outTail.str(), err = m.errTail.str();
      r.classification = classifyExit(r.exitCode, r.signal, out, err);
      if (!r.classification.id.empty()) refineClassification(r.classification, traces);
      if (m.stopped && firstFailed)
        r.classification = {"signal", fmt::format("stopped by crashcap run: {} failed {:.1f} s before and this rank had "
                                                  "not ended",
                                                  firstFailed->name(), m.seconds - firstFailed->seconds)};
      if (interrupted && r.classification.id.empty()) r.classification = {"signal", "stopped by crashcap run"};
      formats::SupervisionData sd;
      sd.command = redactArguments(o.command);
      sd.attempt = static_cast<uint32_t>(attempt);
      sd.pid = r.pid;
      sd.exitCode = r.exitCode;
      sd.signal = r.signal;
      if (const char* name = formats::signalName(r.signal); r.signal)
        sd.signalName = name ? name : fmt::format("signal {}", r.signal);
      sd.classification = r.classification.id;
      sd.evidence = r.classification.evidence;
      sd.stdoutTail = out;
      sd.stderrTail = err;
      sd.startNs = startNs;
      sd.endNs = startNs + static_cast<int64_t>(m.seconds * 1e9);  // when it ended, not when the job did
      sd.trace = cupti::describeTraces(traces, report.trace);
      sd.interrupted = interrupted;
      sd.stopped = m.stopped;
      sd.environment = env;
      if (m.rank >= 0) sd.environment.push_back(fmt::format("RANK={}", m.rank));
      sd.cudnnLogTail = cudnnTail.str();
      sd.params = a.params;
      ranks.push_back(r);
      records.push_back(std::move(sd));
    }
    // A process crashed when it has a classification (a stop of crashcap run gives it one).
    auto crashedMember = [&](size_t i) { return !ranks[i].classification.id.empty(); };
    // The process the attempt is told by: the rank that failed first, else the first that crashed.
    size_t primary = 0;
    if (firstFailed) primary = static_cast<size_t>(firstFailed - members.data());
    else
      for (size_t i = 0; i < members.size(); ++i)
        if (crashedMember(i)) {
          primary = i;
          break;
        }
    bool crashed = false;
    for (size_t i = 0; i < members.size(); ++i) crashed = crashed || crashedMember(i);
    a.pid = ranks[primary].pid;
    a.exitCode = ranks[primary].exitCode;
    a.signal = ranks[primary].signal;
    a.classification = ranks[primary].classification;
    a.trace = records[primary].trace;

    // What the run left, by the process that left it (the pid in the name; the primary's for a
    // process crashcap run did not start itself, a launcher's ranks): crash bundles its recorder
    // sealed, recordings it never closed.
    auto ownerOf = [&](const std::string& name) {
      uint32_t pid = pidInName(name);
      for (size_t i = 0; i < members.size(); ++i)
        if (pid && ranks[i].pid == pid) return i;
      return primary;
    };
    // A training --record observed that ended clean before another began in the same process (the
    // first run of a sweep, the folds before the one that failed) is not evidence of the crash when
    // a later training of the process left the crash's own: a bundle its recorder sealed, or a
    // recording it never closed. It is left to the clean recordings' rule below, not sealed as the
    // crash's bundle. A recording that ended clean after the process's last training's bundle (the
    // fresh recording after a NaN that --nonfinite record let the training go past, closed at exit)
    // is still the crash's.
    const auto names = listing(dir);
    auto isCrashBundle = [](const std::string& name) {
      return name.rfind("crash-", 0) == 0 && fs::path(name).extension() == ".ccap";
    };
    std::vector<int> lastTrainingFailed(members.size(), -1);  // the latest training that left evidence
    for (const auto& name : names) {
      if (before.count(name) || !o.observePython) continue;
      auto path = (fs::path(dir) / name).string();
      const bool evidence = isCrashBundle(name) || (name.rfind(kRecordingPrefix, 0) == 0 && isRecording(path) &&
                                                    recorder::recordingState(path) != "finished");
      if (auto training = evidence ? observedTraining(path) : std::nullopt) {
        auto& last = lastTrainingFailed[ownerOf(name)];
        last = std::max(last, *training);
      }
    }
    auto endedBeforeTheCrash = [&](const std::string& path, size_t who) {
      if (!o.observePython || recorder::recordingState(path) != "finished") return false;
      auto training = observedTraining(path);
      return training && *training < lastTrainingFailed[who];
    };
    std::vector<std::vector<std::string>> bundlesOf(members.size());
    for (const auto& name : names) {
      if (before.count(name)) continue;
      auto path = (fs::path(dir) / name).string();
      size_t who = ownerOf(name);
      if (isCrashBundle(name)) bundlesOf[who].push_back(path);
      if (crashedMember(who) && name.rfind(kRecordingPrefix, 0) == 0 && isRecording(path) &&
          !endedBeforeTheCrash(path, who)) {
        SealOptions so;
        so.supervision = records[who];
        so.kernelTraces = traces;
        try {
          auto sealed = sealRecording(path, so);
          if (ranks[who].bundle.empty()) ranks[who].bundle = sealed.out;  // the supervision record is already in it
          else bundlesOf[who].push_back(sealed.out);
        } catch (const Error& e) {
          if (o.say) o.say(fmt::format("crashcap run: could not seal {}: {}", path, e.what()));
        }
      }
    }
    for (size_t i = 0; i < members.size(); ++i) {
      auto& bundles = bundlesOf[i];
      std::sort(bundles.begin(), bundles.end());
      if (crashedMember(i) && ranks[i].bundle.empty() && !bundles.empty()) {
        ranks[i].bundle = bundles.back();  // the newest: names sort by time
        bundles.pop_back();
        try {
          appendSupervision(ranks[i].bundle, records[i], traces);
        } catch (const Error& e) {
          // The recorder's bundle stays as it was; the run's record and traces go into one of
          // the supervisor's own beside it, so nothing the run saw is lost.
          if (o.say)
            o.say(fmt::format("crashcap run: could not add the run's record to {} ({}); writing it to a bundle of its own",
                              ranks[i].bundle, e.what()));
          bundles.push_back(ranks[i].bundle);
          ranks[i].bundle.clear();
        }
      }
      if (crashedMember(i) && ranks[i].bundle.empty()) ranks[i].bundle = writeOwnBundle(dir, records[i], traces);
    }
    // A clean exit may still have left bundles: crashes the program recorded and went on from
    // (a handled exception, a NaN loss recorded with --nonfinite record). They, and every rank's
    // bundle but the primary's, are the attempt's other bundles.
    a.bundle = ranks[primary].bundle;
    for (size_t i = 0; i < members.size(); ++i) {
      if (i != primary && !ranks[i].bundle.empty()) a.otherBundles.push_back(ranks[i].bundle);
      for (const auto& b : bundlesOf[i]) a.otherBundles.push_back(b);
    }
    std::sort(a.otherBundles.begin(), a.otherBundles.end());
    // The recordings --record started (not a program's own Recorder's) that finished cleanly are
    // not evidence of anything.
    if (o.observePython && !o.keepRecording)
      for (const auto& name : listing(dir)) {
        auto path = (fs::path(dir) / name).string();
        if (!before.count(name) && name.rfind(kRecordingPrefix, 0) == 0 && isRecording(path) &&
            recorder::recordingState(path) == "finished" && observedRecording(path))
          formats::removeTree(path);
      }
    if (o.nproc > 0) {
      a.ranks = ranks;
      a.firstFailedRank = firstFailed ? firstFailed->rank : -1;
    }
    try {
      RunLogEntry entry;
      entry.command = redactArguments(o.command);
      entry.attempt = static_cast<uint32_t>(attempt);
      entry.pid = a.pid;
      entry.startNs = startNs;
      entry.endNs = formats::unixTimeNs();
      entry.exitCode = a.exitCode;
      entry.signal = a.signal;
      entry.classification = a.classification.id;
      entry.evidence = a.classification.evidence;
      entry.bundle = a.bundle;
      entry.otherBundles = a.otherBundles;
      entry.params = a.params;
      entry.jobId = jobId;
      for (const auto& r : a.ranks)
        entry.ranks.push_back({r.rank, r.pid, r.exitCode, r.signal, r.classification.id, r.stopped, r.bundle});
      entry.firstFailedRank = a.firstFailedRank;
      appendRunLog(dir, entry);
    } catch (const Error& e) {
      // The log helps compare runs later; the run itself is recorded in its bundle already.
      if (o.say) o.say(fmt::format("crashcap run: {}", e.what()));
    }
    // The traces are in a bundle now (writeOwnBundle throws otherwise, and the files stay), or
    // the run was clean: the files go.
    for (const auto& f : traceFiles) fs::remove(f, ec);
    report.attempts.push_back(a);

    if (!crashed) return report;
    if (stopRequested) {
      report.stoppedBecause = "stopped by a signal to crashcap run";
      return report;
    }
    bool sameAsBefore = report.attempts.size() >= 2 &&
                        report.attempts[report.attempts.size() - 2].classification.id == a.classification.id;
    consecutive = sameAsBefore ? consecutive + 1 : 1;
    if (attempt > o.restarts) {
      report.stoppedBecause = o.restarts > 0 ? fmt::format("{} restarts used", o.restarts) : "";
      return report;
    }
    if (o.maxConsecutive > 0 && consecutive >= o.maxConsecutive) {
      report.stoppedBecause = fmt::format("{} crashes in a row classified {}", consecutive, a.classification.id);
      return report;
    }
    if (o.say) o.say(fmt::format("crashcap run: restart {} of {} in {:.0f} s", attempt, o.restarts, backoff));
    // Back off, but a stop signal during the wait ends the supervision at once.
    pollfd p = {StopSignals::fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(backoff * 1000)) > 0 && StopSignals::take()) {
      report.interrupted = true;
      report.stoppedBecause = "stopped by a signal to crashcap run";
      return report;
    }
    backoff = std::min(backoff * 2, 60.0);
  }
}

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(ErrorCode::Io, fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(ErrorCode::Io, fmt::format("no free port for the job's rendezvous: {}", std::strerror(e)),
                "give one with --master-port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace crashcap::supervisor
