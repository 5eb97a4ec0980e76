#include "crashcap/inspect/chrome_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "crashcap/formats/bundle_writer.hpp"
#include "trace_util.hpp"

namespace crashcap::inspect {
namespace {

using nlohmann::json;
using formats::KernelTraceData;
using formats::BundleRecords;
using formats::TraceActivityData;
using namespace detail;

/// GPU pseudo-processes get ids above any Linux pid (at most 2^22), so they never merge with a
/// real process in the viewer.
constexpr int64_t kGpuPidBase = int64_t(1) << 30;
/// The pseudo-thread that carries CUPTI's own overhead, above any Linux thread id.
constexpr int64_t kOverheadTid = (int64_t(1) << 30) - 1;
/// Placeholder time of an event whose time is unknown: moved to the end of the trace.
constexpr int64_t kAtEnd = std::numeric_limits<int64_t>::max();

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

bool isApiCall(Kind k) { return k == Kind::Runtime || k == Kind::Driver; }

/// The process that recorded the op trace.
uint32_t opTracePid(const BundleRecords& v, const ChromeTraceOptions& options) {
  if (v.crash && v.crash->pid) return v.crash->pid;
  if (options.opTracePid) return options.opTracePid;
  if (v.supervision && v.supervision->pid) return v.supervision->pid;
  if (v.kernelTraces.size() == 1) return v.kernelTraces.front().pid;
  return 0;
}

/// One line on every traced process's status, or on why there is no trace.
std::string traceStatusSummary(const BundleRecords& v) {
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

/// "715 (cudaErrorIllegalInstruction)", or the bare code when this table has no name for it.
std::string returnText(const std::string& api, int32_t code) {
  auto name = cudaResultName(api, code);
  return name.empty() ? std::to_string(code) : fmt::format("{} ({})", code, name);
}

}  // namespace

json chromeTrace(const BundleRecords& v, const ChromeTraceOptions& options) {
  ChromeBuilder out;
  OpLookup ops(v.opTrace);
  SymbolNames symbols(v);
  const uint32_t opPid = opTracePid(v, options);
  uint64_t kernels = 0, memcpys = 0, memsets = 0, apiCalls = 0, flows = 0, launches = 0, opEvents = 0;
  uint64_t opsWithoutTime = 0, entriesWithoutTime = 0;
  // Kernels, copies and memsets CUPTI gave no GPU time: seen on a real GPU for every one of them
  // when the context faulted (a sticky error) before CUPTI had read their clocks.
  uint64_t gpuWithoutTime = 0, kernelsWithoutTime = 0;
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
        if (a.kind != Kind::Overhead) ++gpuWithoutTime;
        if (a.kind == Kind::Kernel) ++kernelsWithoutTime;
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
      std::string errorName = detail::errorName(e);
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
                {"trace_entries_without_time", entriesWithoutTime},
                {"gpu_activities_without_time", gpuWithoutTime},
                {"kernels_without_time", kernelsWithoutTime}};
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}, {"otherData", std::move(other)}};
}

}  // namespace crashcap::inspect
