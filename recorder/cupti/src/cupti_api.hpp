#pragma once
// CUPTI, loaded at run time: crashcap never needs libcupti to start, and a machine without
// it gets a trace that says so instead of a loader error.

#include <cupti.h>

#include <string>

namespace crashcap::cupti::detail {

struct CuptiApi {
  CUptiResult (*getVersion)(uint32_t*) = nullptr;
  CUptiResult (*getResultString)(CUptiResult, const char**) = nullptr;
  CUptiResult (*getTimestamp)(uint64_t*) = nullptr;
  CUptiResult (*getCallbackName)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
  CUptiResult (*subscribe)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*) = nullptr;
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
  CUptiResult (*enableDomain)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain) = nullptr;
  CUptiResult (*activityEnable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activityDisable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*activityGetNextRecord)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*activityGetNumDroppedRecords)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*activityFlushAll)(uint32_t) = nullptr;
  CUptiResult (*pushExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t) = nullptr;
  CUptiResult (*popExternalCorrelationId)(CUpti_ExternalCorrelationKind, uint64_t*) = nullptr;

  std::string library;   ///< the path that loaded
  std::string error;     ///< why it did not load ("" when it did)
  bool loaded() const { return error.empty(); }
  /// "CUPTI_ERROR_UNKNOWN (999)"
  std::string describe(CUptiResult r) const;
};

/// Loads libcupti once per process (the build's CUDA toolkit directory first, then the
/// loader's search path); the result, loaded or with the reason, is kept.
const CuptiApi& cuptiApi();

}  // namespace crashcap::cupti::detail
