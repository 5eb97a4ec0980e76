#pragma once
// `crashcap inspect B --trace`: per traced process, the first CUDA error (and the sticky one)
// with its kernel and op, the last launches, and which ops launched the last kernels. Reads a
// decoded BundleRecords; needs no GPU or CUPTI.

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "crashcap/formats/records.hpp"

namespace crashcap::inspect {

/// How much traceJson and traceText list.
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
nlohmann::json traceJson(const formats::BundleRecords& view, const TraceReportOptions& options = {});
/// The same as text, one screen per traced process.
std::string traceText(const formats::BundleRecords& view, const TraceReportOptions& options = {});

}  // namespace crashcap::inspect
