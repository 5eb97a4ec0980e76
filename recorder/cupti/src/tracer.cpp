#include "crashcap/cupti/tracer.hpp"

#include <dlfcn.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#if CRASHCAP_HAVE_CUPTI
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "crashcap/cupti/activity_collector.hpp"
#include "crashcap/formats/cuda_errors.hpp"
#include "cupti_api.hpp"
#include "launch_ring.hpp"
#endif

namespace crashcap::cupti {
namespace {


/// A tracer that never started: it only says why.
class UnavailableTracer final : public KernelTracer {
 public:
  explicit UnavailableTracer(std::string reason) : status_("unavailable: " + std::move(reason)) {}
  std::string status() const override { return status_; }
  bool flushWithin(int, bool) override { return true; }
  formats::KernelTraceData snapshot() const override {
    formats::KernelTraceData d;
    d.status = status_;
    d.pid = static_cast<uint32_t>(::getpid());
    return d;
  }
  void stop() override {}

 private:
  std::string status_;
};

std::mutex gStartMu;
std::shared_ptr<KernelTracer>* gTracer = nullptr;  // never destroyed: CUPTI may call back at exit

}  // namespace

std::string gpuUnavailableReason() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) {
    const char* why = ::dlerror();
    return fmt::format("no NVIDIA driver here ({})", why ? why : "libcuda.so.1 not found");
  }
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(driver, "cuInit"));
  auto count = reinterpret_cast<CountFn>(::dlsym(driver, "cuDeviceGetCount"));
  if (!init || !count) return "the NVIDIA driver library lacks cuInit/cuDeviceGetCount";
  int rc = init(0);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string visibility = visible ? fmt::format("; CUDA_VISIBLE_DEVICES={}", visible) : "";
  if (rc == 100) return fmt::format("the driver sees no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE{})", visibility);
  if (rc == 34) return "libcuda.so.1 is the CUDA toolkit's stub library, not a driver";
  if (rc != 0) return fmt::format("cuInit failed with CUresult {}{}", rc, visibility);
  int n = 0;
  if (count(&n) != 0 || n == 0) return fmt::format("the driver reports no CUDA device{}", visibility);
  return "";
}

bool builtWithCupti() { return CRASHCAP_HAVE_CUPTI; }

namespace {

/// Is libcuda already in this process (without loading it)?
[[maybe_unused]] bool driverLoaded() {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) return false;
  ::dlclose(driver);  // drops only the reference RTLD_NOLOAD took
  return true;
}

}  // namespace

#if !CRASHCAP_HAVE_CUPTI

std::shared_ptr<KernelTracer> startTracer(const TracerOptions&) {
  std::lock_guard<std::mutex> lk(gStartMu);
  if (!gTracer) {
    std::string reason = gpuUnavailableReason();
    gTracer = new std::shared_ptr<KernelTracer>(std::make_shared<UnavailableTracer>(
        reason.empty() ? "this crashcap was built without CUPTI (-DCRASHCAP_WITH_CUPTI=OFF or no CUDA toolkit)" : reason));
  }
  return *gTracer;
}
void pushOp(uint64_t) {}
void popOp() {}
void linkOpsToInjectedTracer() {}

#else

namespace {

using detail::cuptiApi;

int64_t monotonicNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class CuptiTracer;
std::atomic<CuptiTracer*> gActive{nullptr};
// pushOp's switch: a tracer of this library is running, or libcrashcap_inject.so traces the process.
std::atomic<bool> gPushOps{false};

constexpr int kMaxOpDepth = 64;
thread_local uint64_t tOps[kMaxOpDepth];
thread_local int tOpDepth = 0;
thread_local int tRuntimeDepth = 0;        // inside a runtime API call (its driver calls are its own)
thread_local uint64_t tRuntimeLaunch = ~0ull, tDriverLaunch = ~0ull;
thread_local uint32_t tThread = 0;

uint32_t thisThread() {
  if (!tThread) tThread = static_cast<uint32_t>(::syscall(SYS_gettid));
  return tThread;
}
int64_t currentOp() {
  if (tOpDepth <= 0) return -1;
  return static_cast<int64_t>(tOps[(tOpDepth < kMaxOpDepth ? tOpDepth : kMaxOpDepth) - 1]);
}

// The two driver launch parameter blocks, as generated_cuda_meta.h lays them out (that header
// does not compile on its own: it needs the driver's internal API-version types).
struct cuLaunchKernel_params {
  CUfunction f;
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  void** kernelParams;
  void** extra;
};
struct cuLaunchKernelEx_params {
  const CUlaunchConfig* config;
  CUfunction f;
  void** kernelParams;
  void** extra;
};

struct LaunchShape {
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t stream = 0;
};

bool runtimeLaunch(CUpti_CallbackId cbid, const void* params, LaunchShape& s) {
  auto dims = [&](const dim3& g, const dim3& b) {
    s.grid[0] = static_cast<int32_t>(g.x), s.grid[1] = static_cast<int32_t>(g.y), s.grid[2] = static_cast<int32_t>(g.z);
    s.block[0] = static_cast<int32_t>(b.x), s.block[1] = static_cast<int32_t>(b.y), s.block[2] = static_cast<int32_t>(b.z);
  };
  switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000: {
      // The cooperative variant's parameters start with the same fields.
      const auto* p = static_cast<const cudaLaunchKernel_v7000_params*>(params);
      if (p) dims(p->gridDim, p->blockDim), s.stream = reinterpret_cast<uint64_t>(p->stream);
      return true;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: {
      const auto* p = static_cast<const cudaLaunchKernelExC_v11060_params*>(params);
      if (p && p->config) dims(p->config->gridDim, p->config->blockDim), s.stream = reinterpret_cast<uint64_t>(p->config->stream);
      return true;
    }
    default: return false;
  }
}

bool driverLaunch(CUpti_CallbackId cbid, const void* params, LaunchShape& s) {
  switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
      const auto* p = static_cast<const cuLaunchKernel_params*>(params);
      if (p) {
        s.grid[0] = static_cast<int32_t>(p->gridDimX), s.grid[1] = static_cast<int32_t>(p->gridDimY), s.grid[2] = static_cast<int32_t>(p->gridDimZ);
        s.block[0] = static_cast<int32_t>(p->blockDimX), s.block[1] = static_cast<int32_t>(p->blockDimY), s.block[2] = static_cast<int32_t>(p->blockDimZ);
        s.stream = reinterpret_cast<uint64_t>(p->hStream);
      }
      return true;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const auto* p = static_cast<const cuLaunchKernelEx_params*>(params);
      if (p && p->config) {
        const CUlaunchConfig* c = p->config;
        s.grid[0] = static_cast<int32_t>(c->gridDimX), s.grid[1] = static_cast<int32_t>(c->gridDimY), s.grid[2] = static_cast<int32_t>(c->gridDimZ);
        s.block[0] = static_cast<int32_t>(c->blockDimX), s.block[1] = static_cast<int32_t>(c->blockDimY), s.block[2] = static_cast<int32_t>(c->blockDimZ);
        s.stream = reinterpret_cast<uint64_t>(c->hStream);
      }
      return true;
    }
    default: return false;
  }
}

class CuptiTracer final : public KernelTracer {
 public:
  CuptiTracer(const TracerOptions& o) : options_(o), collector_(o.activityCapacity), launches_(o.launchCapacity) {}

  /// "" on success, else why not.
  std::string start() {
    const auto& api = cuptiApi();
    if (!api.loaded()) return api.error;
    api.getVersion(&version_);
    CUptiResult r = api.subscribe(&subscriber_, &CuptiTracer::onCallback, this);
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
      return "another profiler holds CUPTI's subscriber slot (Nsight Systems, torch.profiler/Kineto?)";
    // CUPTI has no "no device" code: without a usable device it answers 999.
    auto unknown = [&](CUptiResult r) { return r == CUPTI_ERROR_UNKNOWN ? " (no usable CUDA device?)" : ""; };
    if (r != CUPTI_SUCCESS) return fmt::format("cuptiSubscribe: {}{}", api.describe(r), unknown(r));
    subscribed_ = true;
    if (options_.apiCallbacks) {
      api.enableDomain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API);
      api.enableDomain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API);
    }
    r = api.activityRegisterCallbacks(&CuptiTracer::onBufferRequested, &CuptiTracer::onBufferCompleted);
    if (r != CUPTI_SUCCESS) return fmt::format("cuptiActivityRegisterCallbacks: {}", api.describe(r));
    std::vector<CUpti_ActivityKind> kinds{CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_OVERHEAD};
    if (options_.kernelActivity)
      kinds.insert(kinds.end(), {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET});
    if (options_.apiActivity) kinds.insert(kinds.end(), {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER});
    for (CUpti_ActivityKind kind : kinds) {
      r = api.activityEnable(kind);
      if (r != CUPTI_SUCCESS)
        return fmt::format("cuptiActivityEnable({}): {}{}", static_cast<int>(kind), api.describe(r), unknown(r));
    }
    uint64_t t = 0;
    api.getTimestamp(&t);
    clockOffsetNs_ = monotonicNs() - static_cast<int64_t>(t);
    gActive.store(this, std::memory_order_release);
    gPushOps.store(true, std::memory_order_release);
    watcher_ = std::thread([this] { watch(); });
    watcher_.detach();
    return "";
  }

  /// Undoes a start() that failed half-way.
  void abandon() {
    const auto& api = cuptiApi();
    gActive.store(nullptr, std::memory_order_release);
    gPushOps.store(false, std::memory_order_release);
    if (subscribed_) api.unsubscribe(subscriber_);
    subscribed_ = false;
  }

  std::string status() const override { return "recorded"; }

  bool flushWithin(int ms, bool forced) override {
    // One flush at a time: after a sticky error a flush can block for good, and a new thread
    // per call would pile up behind it. A caller that finds one in flight waits on that one.
    std::shared_ptr<std::atomic<bool>> done;
    {
      std::lock_guard<std::mutex> lk(flushMu_);
      if (!flushDone_ || flushDone_->load()) {
        flushDone_ = std::make_shared<std::atomic<bool>>(false);
        std::thread([d = flushDone_, forced] {
          cuptiApi().activityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
          d->store(true);
        }).detach();
      }
      done = flushDone_;
    }
    for (int waited = 0; waited < ms && !done->load(); waited += 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done->load();
  }

  formats::KernelTraceData snapshot() const override {
    formats::KernelTraceData d;
    d.status = "recorded";
    d.pid = static_cast<uint32_t>(::getpid());
    collector_.fill(d);
    launches_.fill(d);
    // Launches and errors link to their op through the correlation records too: under
    // libcrashcap_inject.so the Recorder's ops reach CUPTI, not this copy's thread-local stack.
    for (auto& l : d.launches)
      if (l.opIndex < 0) l.opIndex = collector_.opFor(l.correlationId);
    {
      std::lock_guard<std::mutex> lk(threadsMu_);
      for (auto& a : d.activities) {
        auto it = threads_.find(a.threadId);
        if (it != threads_.end()) a.threadId = it->second;
      }
    }
    {
      std::lock_guard<std::mutex> lk(errorMu_);
      d.firstError = firstError_;
      d.stickyError = stickyError_;
    }
    for (auto* e : {&d.firstError, &d.stickyError})
      if (*e && (*e)->opIndex < 0) (*e)->opIndex = collector_.opFor((*e)->correlationId);
    d.clockOffsetNs = clockOffsetNs_;
    d.cuptiVersion = version_;
    return d;
  }

  void stop() override {
    const auto& api = cuptiApi();
    if (!subscribed_) return;
    api.activityFlushAll(0);
    gActive.store(nullptr, std::memory_order_release);
    gPushOps.store(false, std::memory_order_release);
    api.unsubscribe(subscriber_);
    subscribed_ = false;
  }

 private:
  static void CUPTIAPI onCallback(void* self, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                  const void* data) noexcept {
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    try {
      static_cast<CuptiTracer*>(self)->onApi(domain == CUPTI_CB_DOMAIN_DRIVER_API, cbid,
                                             static_cast<const CUpti_CallbackData*>(data));
    } catch (...) {
      // An exception must not unwind through CUPTI's C frames (that ends the process); an
      // allocation that failed here loses one launch or error, not the training.
    }
  }

  void onApi(bool driver, CUpti_CallbackId cbid, const CUpti_CallbackData* cb) {
    if (!cb) return;
    // CUPTI's API activities name their thread by its own id (pthread_self() on Linux, it
    // seems; the header does not say); ops and launches use the OS thread id. Learn the pair
    // once per thread so both sit on one row of the time line.
    thread_local bool known = false;
    if (!known) {
      known = true;
      std::lock_guard<std::mutex> lk(threadsMu_);
      threads_.emplace(static_cast<uint32_t>(::pthread_self()), thisThread());
    }
    const auto& api = cuptiApi();
    LaunchShape shape;
    bool launch = driver ? driverLaunch(cbid, cb->functionParams, shape) : runtimeLaunch(cbid, cb->functionParams, shape);
    uint64_t& slot = driver ? tDriverLaunch : tRuntimeLaunch;
    if (cb->callbackSite == CUPTI_API_ENTER) {
      if (!driver) ++tRuntimeDepth;
      // A runtime launch reaches the driver too: record it once, as the caller made it.
      if (launch && (!driver || tRuntimeDepth == 0)) {
        uint64_t t = 0;
        api.getTimestamp(&t);
        slot = launches_.begin(cb->symbolName, cb->functionName, shape.grid, shape.block, shape.stream, cb->correlationId,
                               t, thisThread(), currentOp());
      }
      return;
    }
    // API exit.
    if (!driver && tRuntimeDepth > 0) --tRuntimeDepth;
    int32_t code = cb->functionReturnValue ? *static_cast<const int32_t*>(cb->functionReturnValue) : 0;
    if (launch && slot != ~0ull && (!driver || tRuntimeDepth == 0)) {
      launches_.finish(slot, code);
      slot = ~0ull;
    }
    if (code == 0 || formats::isAnswerNotFailure(driver, cb->functionName ? cb->functionName : "", code)) return;
    bool sticky = formats::isStickyError(code);
    {
      std::lock_guard<std::mutex> lk(errorMu_);
      // The first error of any kind, and the first that poisons the context: a soft error (an
      // allocation failure PyTorch's caching allocator recovers from) may come long before.
      bool wantFirst = !firstError_, wantSticky = sticky && !stickyError_;
      if (!wantFirst && !wantSticky) return;
      formats::ApiErrorData e;
      e.domain = driver ? "driver" : "runtime";
      e.api = cb->functionName ? cb->functionName : "";
      e.code = code;
      e.name = formats::cudaErrorName(driver, code);
      e.correlationId = cb->correlationId;
      uint64_t t = 0;
      api.getTimestamp(&t);
      e.timeNs = t;
      e.threadId = thisThread();
      e.symbol = cb->symbolName && launch ? cb->symbolName : "";
      e.opIndex = currentOp();
      if (wantSticky) stickyError_ = e;
      if (wantFirst) firstError_ = std::move(e);
      if (!wantSticky) return;
    }
    {
      std::lock_guard<std::mutex> lk(watchMu_);
      stickyPending_ = true;
      watchCv_.notify_all();
    }
  }

  /// The tracer's own thread: on the first sticky error, flush what CUPTI holds and tell the
  /// owner to write the trace (the context will not answer much longer).
  void watch() {
    std::unique_lock<std::mutex> lk(watchMu_);
    watchCv_.wait(lk, [this] { return stickyPending_; });
    lk.unlock();
    flushWithin(2000, true);
    if (options_.onStickyError) options_.onStickyError();
  }

  static void CUPTIAPI onBufferRequested(uint8_t** buffer, size_t* size, size_t* maxRecords) {
    constexpr size_t kBytes = 1u << 20;
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
    *size = *buffer ? kBytes : 0;
    *maxRecords = 0;
  }

  static void CUPTIAPI onBufferCompleted(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t, size_t validSize) {
    CuptiTracer* self = gActive.load(std::memory_order_acquire);
    if (self && buffer) {
      size_t dropped = 0;
      cuptiApi().activityGetNumDroppedRecords(ctx, stream, &dropped);
      try {
        self->collector_.addBuffer(buffer, validSize, dropped);
      } catch (...) {
        // Never let an exception cross into CUPTI.
      }
    }
    std::free(buffer);
  }

  TracerOptions options_;
  ActivityCollector collector_;
  detail::LaunchRing launches_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  bool subscribed_ = false;
  uint32_t version_ = 0;
  int64_t clockOffsetNs_ = 0;
  mutable std::mutex errorMu_;
  std::optional<formats::ApiErrorData> firstError_, stickyError_;
  std::mutex flushMu_;
  std::shared_ptr<std::atomic<bool>> flushDone_;   ///< the flush in flight, or the last one
  mutable std::mutex threadsMu_;
  std::unordered_map<uint32_t, uint32_t> threads_; ///< CUPTI's thread id -> OS thread id
  std::mutex watchMu_;
  std::condition_variable watchCv_;
  bool stickyPending_ = false;
  std::thread watcher_;
};

}  // namespace

std::shared_ptr<KernelTracer> startTracer(const TracerOptions& options) {
  std::lock_guard<std::mutex> lk(gStartMu);
  if (gTracer) return *gTracer;
  std::string reason = options.probeDriver || !driverLoaded() ? gpuUnavailableReason() : "";
  if (reason.empty()) {
    auto tracer = std::make_shared<CuptiTracer>(options);
    reason = tracer->start();
    if (reason.empty()) {
      gTracer = new std::shared_ptr<KernelTracer>(tracer);
      return *gTracer;
    }
    tracer->abandon();
  }
  gTracer = new std::shared_ptr<KernelTracer>(std::make_shared<UnavailableTracer>(reason));
  return *gTracer;
}

void pushOp(uint64_t opIndex) {
  if (!gPushOps.load(std::memory_order_relaxed)) return;
  // Deeper than the stack keeps: counted, so pops stay balanced; kernels link to the deepest kept op.
  if (tOpDepth < kMaxOpDepth) {
    tOps[tOpDepth] = opIndex;
    cuptiApi().pushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, opIndex);
  }
  ++tOpDepth;
}

void popOp() {
  if (tOpDepth == 0) return;  // the op began before tracing did
  --tOpDepth;
  uint64_t ignored = 0;
  if (tOpDepth < kMaxOpDepth && gPushOps.load(std::memory_order_relaxed))
    cuptiApi().popExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &ignored);
}

void linkOpsToInjectedTracer() {
  // Same libcupti as the injected library's (one dlopen handle per path): the external
  // correlation ids pushed here are the ones its collector records.
  if (cuptiApi().loaded()) gPushOps.store(true, std::memory_order_release);
}

#endif

}  // namespace crashcap::cupti
