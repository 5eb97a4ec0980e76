#pragma once
// `crashcap export B --chrome OUT.json`: a recording's kernel trace and op trace as one
// Trace Event Format file for Perfetto and chrome://tracing, with the ATen ops, the CUDA API
// calls, the GPU work and the launch → kernel flows on one time line. Reads a decoded
// BundleRecords; needs no GPU or CUPTI.

#include <cstdint>

#include <nlohmann/json.hpp>

#include "crashcap/formats/records.hpp"

namespace crashcap::inspect {

/// What chromeTrace cannot read from the recording itself.
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
/// memsets, api_calls, ops, flows, launches, ops_without_time, trace_entries_without_time.
nlohmann::json chromeTrace(const formats::BundleRecords& view, const ChromeTraceOptions& options = {});

}  // namespace crashcap::inspect
