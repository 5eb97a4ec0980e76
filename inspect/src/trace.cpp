#include "crashcap/inspect/trace.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "crashcap/formats/bundle_writer.hpp"

namespace crashcap::inspect {
namespace {

using nlohmann::json;
using formats::ApiErrorData;
using formats::KernelLaunchData;
using formats::KernelTraceData;
using formats::OpData;
using formats::RecordingView;
using formats::TraceActivityData;
using Kind = TraceActivityData::Kind;

/// The same failing call (a trace's first error may also be its sticky one).
bool sameError(const ApiErrorData& a, const ApiErrorData& b) {
  return a.code == b.code && a.correlationId == b.correlationId && a.timeNs == b.timeNs && a.api == b.api;
}

/// GPU pseudo-processes get ids above any Linux pid (at most 2^22), so they never merge with a
/// real process in the viewer.
constexpr int64_t kGpuPidBase = int64_t(1) << 30;
/// The pseudo-thread that carries CUPTI's own overhead, above any Linux thread id.
constexpr int64_t kOverheadTid = (int64_t(1) << 30) - 1;
/// Placeholder time of an event whose time is unknown: moved to the end of the trace.
constexpr int64_t kAtEnd = std::numeric_limits<int64_t>::max();

/// The demangled form of every symbol of a recording's traces, demangled in one batch (one
/// child process) up front; kernels repeat thousands of times.
class SymbolNames {
 public:
  explicit SymbolNames(const RecordingView& v) {
    std::set<std::string> unique;
    for (const auto& t : v.kernelTraces) {
      for (const auto& a : t.activities)
        if (a.kind == Kind::Kernel) unique.insert(a.name);
      for (const auto& l : t.launches) unique.insert(l.symbol);
      if (t.firstError) unique.insert(t.firstError->symbol);
    }
    std::vector<std::string> names(unique.begin(), unique.end());
    auto demangled = demangleSymbols(names);
    for (size_t i = 0; i < names.size(); ++i) names_.emplace(std::move(names[i]), std::move(demangled[i]));
  }
  const std::string& operator()(const std::string& symbol) const {
    auto it = names_.find(symbol);
    return it == names_.end() ? symbol : it->second;
  }

 private:
  std::unordered_map<std::string, std::string> names_;
};

/// Op index -> op of the op trace; the ring holds only the last ops, so older indices miss.
class OpLookup {
 public:
  explicit OpLookup(const std::optional<formats::OpTraceData>& trace) {
    if (trace)
      for (const auto& o : trace->ops) byIndex_.emplace(o.index, &o);
  }
  const OpData* find(int64_t index) const {
    if (index < 0) return nullptr;
    auto it = byIndex_.find(static_cast<uint64_t>(index));
    return it == byIndex_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<uint64_t, const OpData*> byIndex_;
};

json dims(const int32_t (&d)[3]) { return json::array({d[0], d[1], d[2]}); }
std::string hex(uint64_t v) { return fmt::format("0x{:x}", v); }

/// A tracer time as the signed ns the builder works in; false for 0 (unknown) and for values
/// no clock gives (a damaged or crafted bundle), which would overflow the arithmetic.
bool tracerNs(uint64_t v, int64_t& ns) {
  if (v == 0 || v >= static_cast<uint64_t>(kAtEnd)) return false;
  ns = static_cast<int64_t>(v);
  return true;
}

/// end - start, 0 when end is before start.
int64_t spanNs(uint64_t start, uint64_t end) {
  return end >= start ? static_cast<int64_t>(std::min<uint64_t>(end - start, static_cast<uint64_t>(kAtEnd) - 1)) : 0;
}

bool isGpuWork(Kind k) { return k == Kind::Kernel || k == Kind::Memcpy || k == Kind::Memset; }
bool isApiCall(Kind k) { return k == Kind::Runtime || k == Kind::Driver; }

/// The process that recorded the op trace.
uint32_t opTracePid(const RecordingView& v, const ChromeTraceOptions& options) {
  if (v.crash && v.crash->pid) return v.crash->pid;
  if (options.opTracePid) return options.opTracePid;
  if (v.supervision && v.supervision->pid) return v.supervision->pid;
  if (v.kernelTraces.size() == 1) return v.kernelTraces.front().pid;
  return 0;
}

/// Why a trace has no events: the status without its "unavailable: " prefix.
std::string reasonOf(const std::string& status) {
  const std::string prefix = "unavailable: ";
  return status.rfind(prefix, 0) == 0 ? status.substr(prefix.size()) : status;
}

/// One line on every traced process's status, or on why there is no trace.
std::string traceStatusSummary(const RecordingView& v) {
  if (v.kernelTraces.empty()) {
    std::string s = "absent: this bundle has no kernel trace record";
    if (v.supervision && !v.supervision->trace.empty()) s += " (crashcap run: " + v.supervision->trace + ")";
    return s;
  }
  std::string s;
  for (const auto& t : v.kernelTraces) s += fmt::format("{}pid {}: {}", s.empty() ? "" : "; ", t.pid, t.status);
  return s;
}

/// Events collect with tracer-clock ns; `finish` moves them to microseconds from the earliest
/// event, which keeps ns precision in a double (absolute CUPTI times in µs would not).
class ChromeBuilder {
 public:
  /// A metadata event ("M", ts 0).
  void meta(int64_t pid, int64_t tid, const char* name, json args) {
    meta_.push_back({{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"ts", 0}, {"args", std::move(args)}});
  }
  /// An event at tracer-clock `ns` (kAtEnd: the end of the trace), with `durNs` when >= 0.
  void add(json e, int64_t ns, int64_t durNs = -1) {
    if (!e.contains("tid")) e["tid"] = 0;
    threads_[e["pid"].get<int64_t>()].insert(e["tid"].get<int64_t>());
    events_.push_back({std::move(e), ns, durNs});
  }
  const std::map<int64_t, std::set<int64_t>>& threads() const { return threads_; }

  /// All events, metadata first, the rest by time (ties keep insertion order, so a slice
  /// comes before the flow event that binds to it); `origin` gets the ns of ts 0.
  json finish(int64_t& origin) {
    origin = 0;
    int64_t last = 0;
    bool any = false;
    for (const auto& p : events_)
      if (p.ns != kAtEnd) {
        int64_t end = 0;
        if (__builtin_add_overflow(p.ns, std::max<int64_t>(p.durNs, 0), &end)) end = kAtEnd - 1;
        origin = any ? std::min(origin, p.ns) : p.ns;
        last = any ? std::max(last, end) : end;
        any = true;
      }
    for (auto& p : events_)
      if (p.ns == kAtEnd) p.ns = last;
    std::stable_sort(events_.begin(), events_.end(), [](const Pending& a, const Pending& b) { return a.ns < b.ns; });
    json all = json::array();
    for (auto& m : meta_) all.push_back(std::move(m));
    for (auto& p : events_) {
      // p.ns >= origin, so the unsigned difference is exact even across the whole int64 range.
      p.event["ts"] = static_cast<double>(static_cast<uint64_t>(p.ns) - static_cast<uint64_t>(origin)) / 1000.0;
      if (p.durNs >= 0) p.event["dur"] = static_cast<double>(p.durNs) / 1000.0;
      all.push_back(std::move(p.event));
    }
    return all;
  }

 private:
  struct Pending {
    json event;
    int64_t ns;
    int64_t durNs;
  };
  std::vector<json> meta_;
  std::vector<Pending> events_;
  std::map<int64_t, std::set<int64_t>> threads_;
};

/// args shared by everything an op launched: the op's name and index.
void addOpArgs(json& args, int64_t opIndex, const OpLookup& ops) {
  if (opIndex < 0) return;
  args["op index"] = opIndex;
  if (const auto* o = ops.find(opIndex)) args["op"] = o->name;
}

std::string returnText(const std::string& api, int32_t code) {
  auto name = cudaResultName(api, code);
  return name.empty() ? std::to_string(code) : fmt::format("{} ({})", code, name);
}

}  // namespace

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

std::string cudaResultName(const std::string& api, int32_t code) {
  // The codes a kernel trace meets most; the rest print as numbers.
  static const std::map<int32_t, std::pair<const char*, const char*>> kNames = {
      {0, {"cudaSuccess", "CUDA_SUCCESS"}},
      {1, {"cudaErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE"}},
      {2, {"cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"}},
      {3, {"cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED"}},
      {4, {"cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED"}},
      {9, {"cudaErrorInvalidConfiguration", nullptr}},
      {98, {"cudaErrorInvalidDeviceFunction", nullptr}},
      {209, {"cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU"}},
      {400, {"cudaErrorInvalidResourceHandle", "CUDA_ERROR_INVALID_HANDLE"}},
      {700, {"cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS"}},
      {701, {"cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"}},
      {702, {"cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT"}},
      {710, {"cudaErrorAssert", "CUDA_ERROR_ASSERT"}},
      {714, {"cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR"}},
      {715, {"cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION"}},
      {716, {"cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS"}},
      {718, {"cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC"}},
      {719, {"cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED"}},
  };
  auto it = kNames.find(code);
  if (it == kNames.end()) return "";
  bool runtime = api.rfind("cuda", 0) == 0;
  const char* name = runtime ? it->second.first : it->second.second;
  return name ? name : "";
}

json chromeTrace(const RecordingView& v, const ChromeTraceOptions& options) {
  ChromeBuilder out;
  OpLookup ops(v.opTrace);
  SymbolNames symbols(v);
  const uint32_t opPid = opTracePid(v, options);
  uint64_t kernels = 0, memcpys = 0, memsets = 0, apiCalls = 0, flows = 0, launches = 0, opEvents = 0;
  uint64_t opsWithoutTime = 0, entriesWithoutTime = 0;
  // GPU pseudo-process per (trace, device): streams of two processes must not merge.
  std::map<std::pair<size_t, uint32_t>, int64_t> gpuPids;
  std::map<int64_t, std::string> gpuNames;

  for (size_t ti = 0; ti < v.kernelTraces.size(); ++ti) {
    const KernelTraceData& t = v.kernelTraces[ti];
    const int64_t pid = t.pid;
    auto gpuPid = [&](uint32_t device) {
      auto [it, added] = gpuPids.emplace(std::make_pair(ti, device), kGpuPidBase + int64_t(gpuPids.size()));
      if (added)
        gpuNames[it->second] = v.kernelTraces.size() > 1 ? fmt::format("GPU {} (pid {})", device, t.pid)
                                                         : fmt::format("GPU {}", device);
      return it->second;
    };
    // Correlation id -> the API call that launched it; a runtime call wins over the driver call
    // it made, since the runtime call is what the program wrote.
    std::unordered_map<uint32_t, std::pair<const TraceActivityData*, int64_t>> apiByCorrelation;
    for (const auto& a : t.activities) {
      if (!isApiCall(a.kind)) continue;
      int64_t ns = 0;
      if (!tracerNs(a.startNs, ns)) {
        ++entriesWithoutTime;
        continue;
      }
      if (a.correlationId) {
        auto [it, added] = apiByCorrelation.emplace(a.correlationId, std::make_pair(&a, ns));
        if (!added && it->second.first->kind == Kind::Driver && a.kind == Kind::Runtime) it->second = {&a, ns};
      }
      json args = {{"correlation", a.correlationId}, {"return code", returnText(a.name, a.returnCode)}};
      addOpArgs(args, a.opIndex, ops);
      out.add({{"ph", "X"},
               {"name", a.name},
               {"cat", a.kind == Kind::Runtime ? "cuda_runtime" : "cuda_driver"},
               {"pid", pid},
               {"tid", int64_t(a.threadId)},
               {"args", std::move(args)}},
              ns, spanNs(a.startNs, a.endNs));
      ++apiCalls;
    }
    for (const auto& a : t.activities) {
      if (isApiCall(a.kind)) continue;
      int64_t ns = 0;
      if (!tracerNs(a.startNs, ns)) {
        ++entriesWithoutTime;
        continue;
      }
      const int64_t dur = spanNs(a.startNs, a.endNs);
      if (a.kind == Kind::Overhead) {
        out.add({{"ph", "X"},
                 {"name", a.name.empty() ? std::string("overhead") : a.name},
                 {"cat", "cupti_overhead"},
                 {"pid", pid},
                 {"tid", kOverheadTid}},
                ns, dur);
        continue;
      }
      const int64_t gpu = gpuPid(a.deviceId), stream = a.streamId;
      json args = {{"correlation", a.correlationId}, {"device", a.deviceId}, {"context", a.contextId},
                   {"stream", a.streamId}};
      addOpArgs(args, a.opIndex, ops);
      std::string name;
      const char* cat = "kernel";
      if (a.kind == Kind::Kernel) {
        name = symbols(a.name);
        args["grid"] = dims(a.grid);
        args["block"] = dims(a.block);
        if (name != a.name) args["mangled"] = a.name;
        ++kernels;
      } else if (a.kind == Kind::Memcpy) {
        name = "Memcpy " + a.name;
        cat = "gpu_memcpy";
        args["bytes"] = a.bytes;
        ++memcpys;
      } else {
        name = "Memset " + a.name;
        cat = "gpu_memset";
        args["bytes"] = a.bytes;
        ++memsets;
      }
      out.add({{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", gpu}, {"tid", stream}, {"args", std::move(args)}},
              ns, dur);
      auto api = a.correlationId ? apiByCorrelation.find(a.correlationId) : apiByCorrelation.end();
      if (api == apiByCorrelation.end()) continue;
      // Both ends or neither: a viewer drops (or misdraws) a flow that has one.
      const uint64_t id = ++flows;
      out.add({{"ph", "s"}, {"name", "launch"}, {"cat", "launch"}, {"id", id}, {"pid", pid},
               {"tid", int64_t(api->second.first->threadId)}},
              api->second.second);
      out.add({{"ph", "f"}, {"bp", "e"}, {"name", "launch"}, {"cat", "launch"}, {"id", id}, {"pid", gpu},
               {"tid", stream}},
              ns);
    }
    for (const auto& l : t.launches) {
      int64_t ns = 0;
      if (!tracerNs(l.timeNs, ns)) {
        ++entriesWithoutTime;
        continue;
      }
      json args = {{"api", l.api},
                   {"grid", dims(l.grid)},
                   {"block", dims(l.block)},
                   {"stream", hex(l.stream)},
                   {"correlation", l.correlationId},
                   {"launch index", l.index},
                   {"return code", l.returnCode == -1 ? std::string("not returned") : returnText(l.api, l.returnCode)}};
      addOpArgs(args, l.opIndex, ops);
      const auto& demangled = symbols(l.symbol);
      if (demangled != l.symbol) args["mangled"] = l.symbol;
      out.add({{"ph", "i"}, {"s", "t"}, {"name", "launch " + demangled}, {"cat", "launch_ring"}, {"pid", pid},
               {"tid", int64_t(l.threadId)}, {"args", std::move(args)}},
              ns);
      ++launches;
    }
    // The first error, and the sticky one when a soft error came before it.
    for (const auto* which : {&t.firstError, &t.stickyError}) {
      if (!*which) continue;
      const auto& e = **which;
      bool isFirst = which == &t.firstError;
      bool sticky = t.stickyError && sameError(e, *t.stickyError);
      if (!isFirst && t.firstError && sameError(e, *t.firstError)) continue;  // drawn already
      std::string errorName = !e.name.empty() ? e.name : cudaResultName(e.api, e.code);
      json args = {{"domain", e.domain}, {"api", e.api}, {"code", e.code}, {"name", errorName},
                   {"correlation", e.correlationId}, {"sticky", sticky}};
      if (!e.symbol.empty()) args["kernel"] = symbols(e.symbol);
      addOpArgs(args, e.opIndex, ops);
      int64_t ns = kAtEnd;
      if (!tracerNs(e.timeNs, ns)) {
        ns = kAtEnd;
        args["time"] = "unknown (drawn at the end of the trace)";
      }
      out.add({{"ph", "i"},
               {"s", "g"},
               {"name", fmt::format("{}: {} in {}", isFirst ? "first CUDA error" : "sticky CUDA error",
                                    errorName.empty() ? std::to_string(e.code) : errorName, e.api)},
               {"cat", "error"},
               {"pid", pid},
               {"tid", int64_t(e.threadId)},
               {"args", std::move(args)}},
              ns);
    }
  }

  if (v.opTrace) {
    // Ops are timed on CLOCK_MONOTONIC; their process's trace says how far its clock is from it.
    int64_t offset = 0;
    for (const auto& t : v.kernelTraces)
      if (t.pid == opPid && t.available()) {
        offset = t.clockOffsetNs;
        break;
      }
    for (const auto& o : v.opTrace->ops) {
      int64_t ns = 0;
      // 0 is unknown; a negative time or one the offset overflows is damage, not a time.
      if (o.startNs <= 0 || __builtin_sub_overflow(o.startNs, offset, &ns) || ns == kAtEnd) {
        ++opsWithoutTime;
        continue;
      }
      json shapes = json::array(), types = json::array();
      for (const auto& in : o.inputs) {
        shapes.push_back(in.shape);
        types.push_back(in.dtype);
      }
      json args = {{"op index", o.index}, {"step", o.step}, {"phase", o.phase}, {"sequence number", o.sequenceNr},
                   {"input shapes", shapes}, {"input types", types}};
      json e = {{"name", o.name}, {"cat", "cpu_op"}, {"pid", int64_t(opPid)}, {"tid", int64_t(o.thread)}};
      if (o.endNs >= o.startNs && o.endNs != 0) {
        e["ph"] = "X";
        e["args"] = std::move(args);
        out.add(std::move(e), ns, o.endNs - o.startNs);
      } else {
        args["end"] = "unknown: the op had not returned (or its end was not recorded)";
        e["ph"] = "i";
        e["s"] = "t";
        e["args"] = std::move(args);
        out.add(std::move(e), ns);
      }
      ++opEvents;
    }
  }

  // Name what the events use: host processes and threads, GPUs and streams.
  int64_t sortIndex = 0;
  for (const auto& [pid, tids] : out.threads()) {
    if (pid >= kGpuPidBase) continue;
    out.meta(pid, 0, "process_name", {{"name", pid ? fmt::format("pid {}", pid) : std::string("recorded process")}});
    out.meta(pid, 0, "process_sort_index", {{"sort_index", sortIndex++}});
    for (auto tid : tids) {
      std::string name = tid == kOverheadTid ? std::string("CUPTI overhead")
                         : tid == pid        ? fmt::format("thread {} (main)", tid)
                                             : fmt::format("thread {}", tid);
      out.meta(pid, tid, "thread_name", {{"name", name}});
    }
  }
  for (const auto& [pid, tids] : out.threads()) {
    if (pid < kGpuPidBase) continue;
    out.meta(pid, 0, "process_name", {{"name", gpuNames[pid]}});
    out.meta(pid, 0, "process_sort_index", {{"sort_index", sortIndex++}});
    for (auto tid : tids) out.meta(pid, tid, "thread_name", {{"name", fmt::format("stream {}", tid)}});
  }

  int64_t origin = 0;
  json events = out.finish(origin);
  json other = {{"producer", std::string("crashcap ") + formats::toolVersion()},
                {"clock", "ts is microseconds since ts_origin_ns on the tracer clock (CUPTI ns); ops were moved "
                          "there from CLOCK_MONOTONIC with their process's clock offset"},
                {"ts_origin_ns", origin},
                {"kernel_trace", traceStatusSummary(v)},
                {"kernels", kernels},
                {"memcpys", memcpys},
                {"memsets", memsets},
                {"api_calls", apiCalls},
                {"ops", opEvents},
                {"flows", flows},
                {"launches", launches},
                {"ops_without_time", opsWithoutTime},
                {"trace_entries_without_time", entriesWithoutTime}};
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}, {"otherData", std::move(other)}};
}

namespace {

json opJson(int64_t index, const OpLookup& ops) {
  if (index < 0) return nullptr;
  const auto* o = ops.find(index);
  if (!o) return {{"index", index}, {"name", nullptr}, {"phase", nullptr}, {"step", nullptr}};
  return {{"index", index}, {"name", o->name}, {"phase", o->phase}, {"step", o->step}};
}

json launchJson(const KernelLaunchData& l, const OpLookup& ops, const SymbolNames& symbols) {
  const auto* o = ops.find(l.opIndex);
  return {{"index", l.index},
          {"symbol", l.symbol},
          {"demangled", symbols(l.symbol)},
          {"api", l.api},
          {"grid", dims(l.grid)},
          {"block", dims(l.block)},
          {"stream", hex(l.stream)},
          {"correlation", l.correlationId},
          {"thread", l.threadId},
          {"time_ns", l.timeNs},
          {"return_code", l.returnCode},
          {"return_name", l.returnCode == -1 ? std::string("not returned") : cudaResultName(l.api, l.returnCode)},
          {"op_index", l.opIndex >= 0 ? json(l.opIndex) : json(nullptr)},
          {"op", o ? json(o->name) : json(nullptr)}};
}

/// An error of the trace (its first, or its sticky one), with the kernel it launched (from the
/// launch ring or the activities, by correlation id) and the op that launched it.
json errorJson(const KernelTraceData& t, const std::optional<ApiErrorData>& error, const OpLookup& ops,
               const SymbolNames& symbols) {
  if (!error) return nullptr;
  const auto& e = *error;
  const KernelLaunchData* launch = nullptr;
  const TraceActivityData* kernel = nullptr;
  if (e.correlationId) {
    for (const auto& l : t.launches)
      if (l.correlationId == e.correlationId) launch = &l;
    for (const auto& a : t.activities)
      if (isGpuWork(a.kind) && a.correlationId == e.correlationId) kernel = &a;
  }
  std::string symbol = !e.symbol.empty() ? e.symbol : launch ? launch->symbol : kernel ? kernel->name : "";
  json k = nullptr;
  if (!symbol.empty() || launch || kernel) {
    k = {{"symbol", symbol}, {"demangled", symbols(symbol)}, {"grid", nullptr}, {"block", nullptr},
         {"stream", nullptr}, {"stream_id", nullptr}};
    if (launch) {
      k["grid"] = dims(launch->grid);
      k["block"] = dims(launch->block);
      k["stream"] = hex(launch->stream);
    }
    if (kernel) {
      k["grid"] = dims(kernel->grid);
      k["block"] = dims(kernel->block);
      k["stream_id"] = kernel->streamId;
    }
  }
  int64_t opIndex = e.opIndex >= 0 ? e.opIndex : launch ? launch->opIndex : kernel ? kernel->opIndex : -1;
  return {{"domain", e.domain},
          {"api", e.api},
          {"code", e.code},
          {"name", e.name.empty() ? cudaResultName(e.api, e.code) : e.name},
          {"correlation", e.correlationId},
          {"time_ns", e.timeNs},
          {"thread", e.threadId},
          {"sticky", t.stickyError && sameError(e, *t.stickyError)},
          {"kernel", std::move(k)},
          {"op", opJson(opIndex, ops)}};
}

/// The ops that launched the most recent GPU work, newest first: kernels from the activities,
/// launches from the host ring (the only evidence when the activities never arrived).
json kernelsPerOpJson(const KernelTraceData& t, const OpLookup& ops, const SymbolNames& symbols, size_t limit) {
  struct PerOp {
    uint64_t kernels = 0, launches = 0, gpuNs = 0, lastNs = 0;
    std::string lastKernel;
  };
  std::map<int64_t, PerOp> perOp;
  for (const auto& a : t.activities) {
    if (a.kind != Kind::Kernel || a.opIndex < 0) continue;
    auto& p = perOp[a.opIndex];
    ++p.kernels;
    p.gpuNs += a.endNs >= a.startNs ? a.endNs - a.startNs : 0;
    if (a.startNs >= p.lastNs) {
      p.lastNs = a.startNs;
      p.lastKernel = a.name;
    }
  }
  for (const auto& l : t.launches) {
    if (l.opIndex < 0) continue;
    auto& p = perOp[l.opIndex];
    ++p.launches;
    if (l.timeNs >= p.lastNs) {
      p.lastNs = l.timeNs;
      p.lastKernel = l.symbol;
    }
  }
  std::vector<std::pair<int64_t, PerOp>> sorted(perOp.begin(), perOp.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second.lastNs != b.second.lastNs ? a.second.lastNs > b.second.lastNs : a.first > b.first;
  });
  json list = json::array();
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
    const auto& [index, p] = sorted[i];
    const auto* o = ops.find(index);
    list.push_back({{"op_index", index},
                    {"op", o ? json(o->name) : json(nullptr)},
                    {"phase", o ? json(o->phase) : json(nullptr)},
                    {"step", o ? json(o->step) : json(nullptr)},
                    {"kernels", p.kernels},
                    {"launches", p.launches},
                    {"gpu_ns", p.gpuNs},
                    {"last_kernel", symbols(p.lastKernel)}});
  }
  return list;
}

std::string cut(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

std::string opText(const json& op) {
  if (op.is_null()) return "none recorded";
  if (op["name"].is_null()) return fmt::format("#{} (older than the op ring)", op["index"].get<int64_t>());
  return fmt::format("#{} {} ({}, step {})", op["index"].get<int64_t>(), op["name"].get<std::string>(),
                     op["phase"].get<std::string>(), op["step"].get<int64_t>());
}

std::string dimsText(const json& d) {
  return d.is_null() ? "?" : fmt::format("{}x{}x{}", d[0].get<int>(), d[1].get<int>(), d[2].get<int>());
}

std::string durationText(uint64_t ns) {
  if (ns >= 1000000) return fmt::format("{:.2f} ms", double(ns) / 1e6);
  if (ns >= 1000) return fmt::format("{:.1f} us", double(ns) / 1e3);
  return fmt::format("{} ns", ns);
}

}  // namespace

json traceJson(const RecordingView& v, const TraceReportOptions& options) {
  OpLookup ops(v.opTrace);
  SymbolNames symbols(v);
  json traces = json::array();
  for (const auto& t : v.kernelTraces) {
    std::map<Kind, uint64_t> byKind;
    for (const auto& a : t.activities) ++byKind[a.kind];
    json activities = {{"total", t.totalActivities}, {"dropped", t.droppedActivities}, {"kept", t.activities.size()}};
    for (auto k : {Kind::Kernel, Kind::Memcpy, Kind::Memset, Kind::Runtime, Kind::Driver, Kind::Overhead})
      activities[formats::activityKindName(k)] = byKind[k];
    size_t shown = std::min(options.lastLaunches, t.launches.size());
    json launches = json::array();
    for (size_t i = t.launches.size() - shown; i < t.launches.size(); ++i)
      launches.push_back(launchJson(t.launches[i], ops, symbols));
    traces.push_back({{"pid", t.pid},
                      {"status", t.status},
                      {"available", t.available()},
                      {"reason", t.available() ? json(nullptr) : json(reasonOf(t.status))},
                      {"cupti_version", t.cuptiVersion ? json(t.cuptiVersion) : json(nullptr)},
                      {"clock_offset_ns", t.clockOffsetNs},
                      {"sticky_error", errorJson(t, t.stickyError, ops, symbols)},
                      {"truncated_names", t.truncatedNames},
                      {"activities", std::move(activities)},
                      {"launch_counts", {{"total", t.totalLaunches}, {"kept", t.launches.size()}, {"shown", shown}}},
                      {"first_error", errorJson(t, t.firstError, ops, symbols)},
                      {"launches", std::move(launches)},
                      {"kernels_per_op", kernelsPerOpJson(t, ops, symbols, options.topOps)}});
  }
  json runTrace = v.supervision && !v.supervision->trace.empty() ? json(v.supervision->trace) : json(nullptr);
  json note = nullptr;
  if (traces.empty())
    note = "this bundle has no kernel trace: it was recorded without a tracer, or on a machine where none could run "
           "(`crashcap doctor` checks CUPTI)";
  return {{"traces", std::move(traces)}, {"run_trace", std::move(runTrace)}, {"note", std::move(note)}};
}

std::string traceText(const RecordingView& v, const TraceReportOptions& options) {
  json j = traceJson(v, options);
  std::string s;
  if (j["traces"].empty()) {
    s += fmt::format("kernel trace  none: {}\n", j["note"].get<std::string>());
    if (!j["run_trace"].is_null()) s += fmt::format("run trace     {}\n", j["run_trace"].get<std::string>());
    return s;
  }
  bool first = true;
  for (const auto& t : j["traces"]) {
    if (!first) s += "\n";
    first = false;
    s += fmt::format("kernel trace  pid {}: {}", t["pid"].get<uint32_t>(), t["status"].get<std::string>());
    if (!t["cupti_version"].is_null()) s += fmt::format(" (CUPTI {})", t["cupti_version"].get<uint32_t>());
    s += "\n";
    const auto& a = t["activities"];
    const auto& lc = t["launch_counts"];
    // An unavailable trace with nothing in it: the status line says all there is.
    if (t["available"] == false && a["kept"] == 0 && lc["kept"] == 0 && t["first_error"].is_null()) continue;
    s += fmt::format("activities    {} delivered, {} dropped; {} kept: {} kernel, {} memcpy, {} memset, {} runtime, "
                     "{} driver, {} overhead\n",
                     a["total"].get<uint64_t>(), a["dropped"].get<uint64_t>(), a["kept"].get<uint64_t>(),
                     a["kernel"].get<uint64_t>(), a["memcpy"].get<uint64_t>(), a["memset"].get<uint64_t>(),
                     a["runtime"].get<uint64_t>(), a["driver"].get<uint64_t>(), a["overhead"].get<uint64_t>());
    s += fmt::format("launches      {} seen, {} kept\n", lc["total"].get<uint64_t>(), lc["kept"].get<uint64_t>());
    if (t["truncated_names"].get<uint64_t>())
      s += fmt::format("names         {} cut to 4 KiB\n", t["truncated_names"].get<uint64_t>());
    auto errorBlock = [&](const char* title, const json& e) {
      std::string name = e["name"].get<std::string>();
      s += fmt::format("{:<13} {}{} returned by {} ({}), thread {}, correlation {}\n", title,
                       name.empty() ? "" : name + " ", fmt::format("({})", e["code"].get<int32_t>()),
                       e["api"].get<std::string>(), e["domain"].get<std::string>(), e["thread"].get<uint32_t>(),
                       e["correlation"].get<uint32_t>());
      const auto& k = e["kernel"];
      if (!k.is_null())
        s += fmt::format("  kernel      {}  grid {} block {}\n", cut(k["demangled"].get<std::string>(), 160),
                         dimsText(k["grid"]), dimsText(k["block"]));
      s += fmt::format("  op          {}\n", opText(e["op"]));
    };
    const auto& e = t["first_error"];
    const auto& sticky = t["sticky_error"];
    if (e.is_null()) {
      s += "first error   none: no CUDA API call returned an error while tracing\n";
    } else {
      errorBlock("FIRST ERROR", e);
      if (e["sticky"] == true)
        s += "  sticky      yes: this error poisons the CUDA context; every later CUDA call in the process fails, "
             "so later errors are echoes of this one\n";
      else
        s += "  sticky      no: the context survived it (a recovered allocation failure, a query)\n";
    }
    if (!sticky.is_null() && e["sticky"] != true) {
      errorBlock("STICKY ERROR", sticky);
      s += "  sticky      yes: this is the failure; it poisons the CUDA context, so every later CUDA call fails "
           "with it\n";
    }
    if (!t["launches"].empty()) {
      s += fmt::format("\nlast {} launches (of {} seen), oldest first\n", t["launches"].size(),
                       lc["total"].get<uint64_t>());
      s += fmt::format("  {:>8} {:<34} {:<12} {:<10} {:<14} {:<24} {}\n", "index", "return", "grid", "block",
                       "stream", "op", "kernel");
      for (const auto& l : t["launches"]) {
        const int32_t code = l["return_code"].get<int32_t>();
        const std::string codeName = l["return_name"].get<std::string>();
        std::string rc = code == -1         ? codeName
                         : codeName.empty() ? std::to_string(code)
                                            : fmt::format("{} {}", code, codeName);
        std::string op = l["op"].is_string() ? fmt::format("#{} {}", l["op_index"].get<int64_t>(), l["op"].get<std::string>())
                         : l["op_index"].is_null() ? std::string("-")
                                                   : fmt::format("#{}", l["op_index"].get<int64_t>());
        s += fmt::format("  {:>8} {:<34} {:<12} {:<10} {:<14} {:<24} {}\n", l["index"].get<uint64_t>(), rc,
                         dimsText(l["grid"]), dimsText(l["block"]), l["stream"].get<std::string>(), cut(op, 24),
                         cut(l["demangled"].get<std::string>(), 120));
      }
    }
    if (!t["kernels_per_op"].empty()) {
      s += "\nkernels per op (the ops that launched the last kernels, newest first)\n";
      s += fmt::format("  {:>8} {:<32} {:>7} {:>8} {:>10}  {}\n", "op", "name", "kernels", "launches", "gpu time",
                       "last kernel");
      for (const auto& p : t["kernels_per_op"]) {
        std::string name = p["op"].is_null() ? std::string("(older than the op ring)")
                                             : fmt::format("{} ({})", p["op"].get<std::string>(), p["phase"].get<std::string>());
        s += fmt::format("  {:>8} {:<32} {:>7} {:>8} {:>10}  {}\n", p["op_index"].get<int64_t>(), cut(name, 32),
                         p["kernels"].get<uint64_t>(), p["launches"].get<uint64_t>(),
                         durationText(p["gpu_ns"].get<uint64_t>()), cut(p["last_kernel"].get<std::string>(), 100));
      }
    }
  }
  if (!j["run_trace"].is_null()) s += fmt::format("\nrun trace     {}\n", j["run_trace"].get<std::string>());
  return s;
}

}  // namespace crashcap::inspect
