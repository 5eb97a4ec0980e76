#pragma once
// Private helpers shared by the kernel-trace viewers (chrome_trace.cpp, trace_report.cpp): ops
// by index, kernel symbols demangled in one batch, errors and CUDA result names.

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crashcap/formats/records.hpp"

namespace crashcap::inspect::detail {

/// What a trace activity is: a kernel, a copy, a memset, an API call or CUPTI overhead.
using Kind = formats::TraceActivityData::Kind;

/// Op index -> op of the op trace; the ring holds only the last ops, so older indices miss.
/// Points into the OpTraceData it was built from, which must outlive it.
class OpLookup {
 public:
  explicit OpLookup(const std::optional<formats::OpTraceData>& trace);
  /// The op with this index, or nullptr (negative, or older than the ring).
  const formats::OpData* find(int64_t index) const;

 private:
  std::unordered_map<uint64_t, const formats::OpData*> byIndex_;
};

/// The demangled form of every symbol of a recording's traces (kernels, launches, first
/// errors), demangled in one batch (one child process) up front; kernels repeat thousands of
/// times.
class SymbolNames {
 public:
  explicit SymbolNames(const formats::BundleRecords& view);
  /// The demangled `symbol`, or `symbol` itself when it was not among the recording's.
  const std::string& operator()(const std::string& symbol) const;

 private:
  std::unordered_map<std::string, std::string> names_;
};

/// The same failing call (a trace's first error may also be its sticky one).
bool sameError(const formats::ApiErrorData& a, const formats::ApiErrorData& b);

/// The error's name as recorded, else the name of its code; "" when neither is known.
std::string errorName(const formats::ApiErrorData& e);

/// The name of `code` as the API `api` returned it: cudaError_t's for a runtime API (`api`
/// starts with "cuda"), CUresult's for a driver API; "" for a code formats/cuda_errors.hpp
/// does not know.
std::string cudaResultName(const std::string& api, int32_t code);

/// A grid or block as [x, y, z].
inline nlohmann::json dims(const int32_t (&d)[3]) { return nlohmann::json::array({d[0], d[1], d[2]}); }

/// A stream handle or address as "0x...".
inline std::string hex(uint64_t v) { return fmt::format("0x{:x}", v); }

}  // namespace crashcap::inspect::detail
