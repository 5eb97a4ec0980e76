#include "trace_util.hpp"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "crashcap/inspect/demangle.hpp"

namespace crashcap::inspect::detail {

OpLookup::OpLookup(const std::optional<formats::OpTraceData>& trace) {
  if (trace)
    for (const auto& o : trace->ops) byIndex_.emplace(o.index, &o);
}

const formats::OpData* OpLookup::find(int64_t index) const {
  if (index < 0) return nullptr;
  auto it = byIndex_.find(static_cast<uint64_t>(index));
  return it == byIndex_.end() ? nullptr : it->second;
}

SymbolNames::SymbolNames(const formats::RecordingView& view) {
  std::set<std::string> unique;
  for (const auto& t : view.kernelTraces) {
    for (const auto& a : t.activities)
      if (a.kind == Kind::Kernel) unique.insert(a.name);
    for (const auto& l : t.launches) unique.insert(l.symbol);
    if (t.firstError) unique.insert(t.firstError->symbol);
  }
  std::vector<std::string> names(unique.begin(), unique.end());
  auto demangled = demangleSymbols(names);
  for (size_t i = 0; i < names.size(); ++i) names_.emplace(std::move(names[i]), std::move(demangled[i]));
}

const std::string& SymbolNames::operator()(const std::string& symbol) const {
  auto it = names_.find(symbol);
  return it == names_.end() ? symbol : it->second;
}

bool sameError(const formats::ApiErrorData& a, const formats::ApiErrorData& b) {
  return a.code == b.code && a.correlationId == b.correlationId && a.timeNs == b.timeNs && a.api == b.api;
}

std::string errorName(const formats::ApiErrorData& e) { return e.name.empty() ? cudaResultName(e.api, e.code) : e.name; }

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

}  // namespace crashcap::inspect::detail
