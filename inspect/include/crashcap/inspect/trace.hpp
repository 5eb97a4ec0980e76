#pragma once
// The kernel-trace viewers: `crashcap export B --chrome OUT.json` (a Trace Event Format file
// for Perfetto and chrome://tracing, with the ATen ops, the CUDA API calls, the GPU work and
// the launch → kernel flows on one time line) and `crashcap inspect B --trace` (per traced
// process: the first CUDA error, the last launches, which ops launched the last kernels).
// Both read a decoded RecordingView; neither needs a GPU or CUPTI.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "crashcap/formats/records.hpp"

namespace crashcap::inspect {

struct ChromeTraceOptions {
  /// The process that recorded the op trace (RecordingInfo.pid), used when the bundle has no
  /// crash record naming it; 0: the supervised child's pid, else the only traced process's.
  uint32_t opTracePid = 0;
};

/// The Trace Event Format object {"traceEvents": [...], "displayTimeUnit": "ns",
/// "otherData": {...}} of a recording. `ts`/`dur` are microseconds (doubles with ns precision)
/// on the tracer clock, counted from otherData.ts_origin_ns; op times are moved onto the tracer
/// clock of their process's trace (its clockOffsetNs), or stay on CLOCK_MONOTONIC when that
/// process was not traced. Every event has ph, ts, pid and tid; every flow start ("s") has
/// exactly one flow end ("f") with the same id. otherData: producer, clock, ts_origin_ns,
/// kernel_trace (each traced process's status, or why there is no trace), kernels, memcpys,
/// memsets, api_calls, ops, flows, launches, ops_without_time.
nlohmann::json chromeTrace(const formats::RecordingView& view, const ChromeTraceOptions& options = {});

struct TraceReportOptions {
  size_t lastLaunches = 20;  ///< launches listed per process, newest last
  size_t topOps = 10;        ///< ops listed in the kernels-per-op summary
};

/// `inspect --trace --json`. Keys: traces [one per traced process, in bundle order: {pid,
/// status, available, reason (null when recorded), cupti_version (null unknown),
/// clock_offset_ns, truncated_names, activities {total, dropped, kept, kernel,
/// memcpy, memset, runtime, driver, overhead}, launch_counts {total, kept, shown},
/// first_error and sticky_error (the first error of any kind, and the first that poisoned the
/// context; each null, or {domain, api, code, name, correlation, time_ns, thread, sticky,
/// kernel (null, or {symbol, demangled, grid, block, stream: the launch's handle, stream_id:
/// CUPTI's when the kernel ran}), op (null, or {index, name, phase, step}; name null when the
/// op is older than the op ring)}), launches [the last ones, oldest first: {index, symbol,
/// demangled, api, grid, block, stream, correlation, thread, time_ns, return_code,
/// return_name, op_index, op}], kernels_per_op [newest first: {op_index, op, phase, step,
/// kernels, launches, gpu_ns, last_kernel}]}], run_trace (what `crashcap run` wrote about the
/// trace, or null), note (why there is no trace, or null).
nlohmann::json traceJson(const formats::RecordingView& view, const TraceReportOptions& options = {});
/// The same as text, one screen per traced process.
std::string traceText(const formats::RecordingView& view, const TraceReportOptions& options = {});

/// Each name demangled when it is a mangled C++ name (starts with "_Z" and abi::__cxa_demangle
/// accepts it: libstdc++ refuses names over 1024 characters), else unchanged. Names are
/// untrusted (a few hundred crafted bytes can demangle to gigabytes), so the demangling runs
/// in one forked child with a memory budget; a name it is stuck on for 2 s stays mangled, and
/// after 3 such names the rest do. Nothing is demangled in-process; no fork without a "_Z" name.
std::vector<std::string> demangleSymbols(const std::vector<std::string>& names);
/// demangleSymbols for one name.
std::string demangleSymbol(const std::string& name);

/// "cudaErrorIllegalInstruction" for a runtime API (`api` starts with "cuda"), the CUresult
/// name for a driver API; "" for codes this table does not know.
std::string cudaResultName(const std::string& api, int32_t code);

}  // namespace crashcap::inspect
