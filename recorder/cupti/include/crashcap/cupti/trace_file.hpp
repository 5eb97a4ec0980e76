#pragma once
// Trace files: how a traced process that has no in-process recorder (libcrashcap_inject.so in
// a Python training) hands its kernel trace to `crashcap run`. `<dir>/trace-<pid>.cctrace` is
// a small sealed bundle holding one kernel_trace record; it is rewritten whole (a .partial
// file, then a rename), so a reader sees the previous trace or the new one, never half.

#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::cupti {

inline constexpr const char* kTraceFilePrefix = "trace-";
inline constexpr const char* kTraceFileExtension = ".cctrace";

std::string traceFilePath(const std::string& dir, uint32_t pid);
/// Throws crashcap::Error{Io} when it cannot be written.
void writeTraceFile(const std::string& path, const formats::KernelTraceData& trace, const std::string& producer);
/// Every kernel trace in a trace file (or in any bundle); throws crashcap::Error.
std::vector<formats::KernelTraceData> readKernelTraces(const std::string& path);

/// The error that poisoned a CUDA context first among `traces` (compared on CLOCK_MONOTONIC
/// through each trace's clock offset, so processes compare); nullptr when none did.
const formats::ApiErrorData* firstStickyError(const std::vector<formats::KernelTraceData>& traces,
                                              uint32_t* pid = nullptr);

/// One line for a bundle's trace: "recorded: 2 processes, 3210 kernel launches, first sticky
/// error cudaErrorIllegalInstruction in cudaLaunchKernel" or the unavailable reason.
std::string describeTraces(const std::vector<formats::KernelTraceData>& traces, const std::string& fallback);

}  // namespace crashcap::cupti
