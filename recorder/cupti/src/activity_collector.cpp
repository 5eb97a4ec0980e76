#include "crashcap/cupti/activity_collector.hpp"

#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "crashcap/formats/error.hpp"
#include "cupti_api.hpp"

namespace crashcap::cupti {
namespace {

using formats::TraceActivityData;
using Kind = TraceActivityData::Kind;

const char* copyKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "memcpy";
  }
}

const char* overheadKindName(CUpti_ActivityOverheadKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_OVERHEAD_DRIVER_COMPILER: return "driver compiler";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH: return "CUPTI buffer flush";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION: return "CUPTI instrumentation";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_RESOURCE: return "CUPTI resource";
    default: return "overhead";
  }
}

/// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel"; "cuLaunchKernel_ptsz" stays.
std::string apiName(CUpti_CallbackDomain domain, uint32_t cbid) {
  const auto& api = detail::cuptiApi();
  const char* name = nullptr;
  if (api.getCallbackName && api.getCallbackName(domain, cbid, &name) == CUPTI_SUCCESS && name) {
    std::string s = name;
    auto v = s.rfind("_v");
    if (v != std::string::npos && v + 2 < s.size() &&
        s.find_first_not_of("0123456789", v + 2) == std::string::npos)
      s.erase(v);
    return s;
  }
  return fmt::format("{} API {}", domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver" : "runtime", cbid);
}

/// When and where GPU work ran: the fields kernel, memcpy and memset records share.
template <typename Record>
void copyPlacement(const Record* r, TraceActivityData& a) {
  a.startNs = r->start;
  a.endNs = r->end;
  a.deviceId = r->deviceId;
  a.contextId = r->contextId;
  a.streamId = r->streamId;
  a.correlationId = r->correlationId;
}

/// A memcpy or memset: its placement and its size.
template <typename Record>
void copyTransfer(const Record* m, TraceActivityData& a) {
  copyPlacement(m, a);
  a.bytes = m->bytes;
}

/// One raw record, converted; nullopt for kinds crashcap does not keep.
std::optional<TraceActivityData> convert(const CUpti_Activity* record) {
  TraceActivityData a;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      // CUDA 13's layout; older versions share every field read here (they only append).
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      a.kind = Kind::Kernel;
      a.name = k->name ? k->name : "<unnamed kernel>";
      copyPlacement(k, a);
      a.grid[0] = k->gridX;
      a.grid[1] = k->gridY;
      a.grid[2] = k->gridZ;
      a.block[0] = k->blockX;
      a.block[1] = k->blockY;
      a.block[2] = k->blockZ;
      return a;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      a.kind = Kind::Memcpy;
      a.name = copyKindName(m->copyKind);
      copyTransfer(m, a);
      return a;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      a.kind = Kind::Memset;
      a.name = fmt::format("memset {:#x}", m->value);
      copyTransfer(m, a);
      return a;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      const auto* api = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      bool driver = record->kind == CUPTI_ACTIVITY_KIND_DRIVER;
      a.kind = driver ? Kind::Driver : Kind::Runtime;
      a.name = apiName(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, api->cbid);
      a.startNs = api->start;
      a.endNs = api->end;
      a.correlationId = api->correlationId;
      a.returnCode = static_cast<int32_t>(api->returnValue);
      a.threadId = api->threadId;
      return a;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
      const auto* o = reinterpret_cast<const CUpti_ActivityOverhead3*>(record);
      a.kind = Kind::Overhead;
      a.name = overheadKindName(o->overheadKind);
      a.startNs = o->start;
      a.endNs = o->end;
      a.correlationId = o->correlationId;
      return a;
    }
    default: return std::nullopt;
  }
}

constexpr size_t kMaxLinks = 1u << 16;

}  // namespace

ActivityCollector::ActivityCollector(size_t capacity) : capacity_(capacity ? capacity : 1) {}

void ActivityCollector::addBuffer(const uint8_t* buffer, size_t validSize, uint64_t dropped) {
  const auto& api = detail::cuptiApi();
  if (!api.loaded())
    throw Error(ErrorCode::Unsupported, "cannot read CUPTI activity buffers: " + api.error);
  {
    std::lock_guard<std::mutex> lk(mu_);
    dropped_ += dropped;
  }
  if (!buffer || validSize == 0) return;
  CUpti_Activity* record = nullptr;
  // CUPTI walks the buffer (it knows each kind's record size); it never writes to it.
  auto* bytes = const_cast<uint8_t*>(buffer);
  while (api.activityGetNextRecord(bytes, validSize, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
      const auto* x = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
      if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
        link(x->correlationId, static_cast<int64_t>(x->externalId));
      continue;
    }
    if (auto a = convert(record)) add(std::move(*a));
  }
}

void ActivityCollector::add(TraceActivityData activity) {
  std::lock_guard<std::mutex> lk(mu_);
  if (activity.name.size() > formats::kMaxTraceNameBytes) {
    activity.name.resize(formats::kMaxTraceNameBytes);
    ++truncated_;
  }
  ++total_;
  ring_.push_back(std::move(activity));
  if (ring_.size() > capacity_) ring_.pop_front();
}

void ActivityCollector::link(uint32_t correlationId, int64_t opIndex) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ops_.emplace(correlationId, opIndex).second) {
    opsOrder_.push_back(correlationId);
    if (opsOrder_.size() > kMaxLinks) {
      ops_.erase(opsOrder_.front());
      opsOrder_.pop_front();
    }
  } else {
    ops_[correlationId] = opIndex;
  }
}

void ActivityCollector::fill(formats::KernelTraceData& out) const {
  std::lock_guard<std::mutex> lk(mu_);
  out.activities.assign(ring_.begin(), ring_.end());
  for (auto& a : out.activities) {
    auto it = ops_.find(a.correlationId);
    if (a.correlationId != 0 && it != ops_.end()) a.opIndex = it->second;
  }
  out.totalActivities = total_;
  out.droppedActivities = dropped_;
  out.truncatedNames = truncated_;
}

int64_t ActivityCollector::opFor(uint32_t correlationId) const {
  if (correlationId == 0) return -1;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = ops_.find(correlationId);
  return it == ops_.end() ? -1 : it->second;
}

uint64_t ActivityCollector::total() const {
  std::lock_guard<std::mutex> lk(mu_);
  return total_;
}

}  // namespace crashcap::cupti
