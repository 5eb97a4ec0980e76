#include "trace_util.hpp"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "crashcap/formats/cuda_errors.hpp"
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

SymbolNames::SymbolNames(const formats::BundleRecords& view) {
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
  return formats::cudaErrorName(/*driver=*/api.rfind("cuda", 0) != 0, code);
}

}  // namespace crashcap::inspect::detail
