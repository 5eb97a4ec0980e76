#include "crashcap/inspect/trace_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "trace_util.hpp"

namespace crashcap::inspect {
namespace {

using nlohmann::json;
using formats::ApiErrorData;
using formats::KernelLaunchData;
using formats::KernelTraceData;
using formats::BundleRecords;
using formats::TraceActivityData;
using namespace detail;

/// Work that ran on the GPU (what a launch or an API call's correlation id leads to).
bool isGpuWork(Kind k) { return k == Kind::Kernel || k == Kind::Memcpy || k == Kind::Memset; }

/// Why a trace has no events: the status without its "unavailable: " prefix.
std::string reasonOf(const std::string& status) {
  const std::string prefix = "unavailable: ";
  return status.rfind(prefix, 0) == 0 ? status.substr(prefix.size()) : status;
}

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
          {"name", detail::errorName(e)},
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

json traceJson(const BundleRecords& v, const TraceReportOptions& options) {
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

std::string traceText(const BundleRecords& v, const TraceReportOptions& options) {
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
