#include "cupti_api.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <vector>

namespace crashcap::cupti::detail {
namespace {

template <typename F>
bool bind(void* lib, const char* name, F& f, std::string& missing) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  if (!f && missing.empty()) missing = name;
  return f != nullptr;
}

CuptiApi load() {
  CuptiApi api;
  std::vector<std::string> candidates;
#ifdef CRASHCAP_CUPTI_LIBRARY
  candidates.push_back(CRASHCAP_CUPTI_LIBRARY);  // the toolkit crashcap was built against
#endif
  for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                           "/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/lib/libcupti.so"})
    candidates.push_back(name);
  void* lib = nullptr;
  std::string firstError;
  for (const auto& c : candidates) {
    lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      api.library = c;
      break;
    }
    if (firstError.empty()) {
      const char* e = ::dlerror();
      firstError = e ? e : c + " not found";
    }
  }
  if (!lib) {
    api.error = fmt::format("CUPTI not loadable ({})", firstError);
    return api;
  }
  std::string missing;
  bind(lib, "cuptiGetVersion", api.getVersion, missing);
  bind(lib, "cuptiGetResultString", api.getResultString, missing);
  bind(lib, "cuptiGetTimestamp", api.getTimestamp, missing);
  bind(lib, "cuptiGetCallbackName", api.getCallbackName, missing);
  bind(lib, "cuptiSubscribe", api.subscribe, missing);
  bind(lib, "cuptiUnsubscribe", api.unsubscribe, missing);
  bind(lib, "cuptiEnableDomain", api.enableDomain, missing);
  bind(lib, "cuptiActivityEnable", api.activityEnable, missing);
  bind(lib, "cuptiActivityDisable", api.activityDisable, missing);
  bind(lib, "cuptiActivityRegisterCallbacks", api.activityRegisterCallbacks, missing);
  bind(lib, "cuptiActivityGetNextRecord", api.activityGetNextRecord, missing);
  bind(lib, "cuptiActivityGetNumDroppedRecords", api.activityGetNumDroppedRecords, missing);
  bind(lib, "cuptiActivityFlushAll", api.activityFlushAll, missing);
  bind(lib, "cuptiActivityPushExternalCorrelationId", api.pushExternalCorrelationId, missing);
  bind(lib, "cuptiActivityPopExternalCorrelationId", api.popExternalCorrelationId, missing);
  if (!missing.empty()) api.error = fmt::format("{} lacks {} (CUPTI too old)", api.library, missing);
  return api;
}

}  // namespace

std::string CuptiApi::describe(CUptiResult r) const {
  const char* s = nullptr;
  if (getResultString && getResultString(r, &s) == CUPTI_SUCCESS && s) return fmt::format("{} ({})", s, static_cast<int>(r));
  return fmt::format("CUPTI error {}", static_cast<int>(r));
}

const CuptiApi& cuptiApi() {
  static const CuptiApi api = load();
  return api;
}

}  // namespace crashcap::cupti::detail
