#pragma once
// The kernel tracer (docs/RUN.md, "Kernel trace"): CUPTI activity records and a host-side
// launch ring, the first CUDA API call that fails, and the ATen op that launched each kernel.
// Errors on a GPU are asynchronous: the launch ring, filled on the launching thread, is the
// evidence that survives once the context is poisoned. With no driver, no device, no CUPTI
// or a busy profiler slot the tracer is unavailable, says why, and costs nothing.
//
// One tracer per process: CUPTI has one subscriber slot. No LibTorch here.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "crashcap/formats/records.hpp"

namespace crashcap::cupti {

struct TracerOptions {
  size_t activityCapacity = 2048;   ///< the ring of the last CUPTI activities
  size_t launchCapacity = 1024;     ///< the host-side launch ring
  /// Called once, on the tracer's own thread, after the first sticky CUDA error (one that
  /// poisons the context) has been seen and CUPTI's buffers were flushed: write the trace now.
  std::function<void()> onStickyError;
  /// Ask the driver first whether a device is there (cuInit, cuDeviceGetCount). False inside
  /// InitializeInjection: when the driver is already loaded, it is loading the tracer from
  /// within cuInit, and calling cuInit again from there could deadlock; the probe then runs
  /// only when libcuda is not loaded at all (nothing to recurse into).
  bool probeDriver = true;
  /// The tracer's parts, each of which costs every CUDA call something; all on by default. For
  /// measuring what each costs (bench/gpu_tracer.py), `crashcap run` takes them from
  /// CRASHCAP_TRACE_LEAVE_OUT (docs/RUN.md).
  bool apiCallbacks = true;   ///< CUPTI's callbacks on every runtime and driver call: launches, errors
  bool apiActivity = true;    ///< an activity record of every runtime and driver call (the time line)
  bool kernelActivity = true; ///< kernels', copies' and sets' GPU times
};

class KernelTracer {
 public:
  virtual ~KernelTracer() = default;
  /// "recorded" while tracing, or "unavailable: <reason>".
  virtual std::string status() const = 0;
  bool available() const { return status() == "recorded"; }
  /// Has CUPTI deliver the activities it holds (cuptiActivityFlushAll) on a helper thread,
  /// waiting at most `ms`: after a sticky error a flush can block on the poisoned context.
  /// `forced` also delivers records still incomplete (the crash path). False on timeout.
  virtual bool flushWithin(int ms, bool forced) = 0;
  /// What has been traced so far; safe from any thread.
  virtual formats::KernelTraceData snapshot() const = 0;
  /// Stops tracing (clean end only: never on a crash path; no cuptiFinalize either way).
  virtual void stop() = 0;
};

/// Starts the process's tracer (or returns the running one). Never throws: a tracer that
/// cannot run is returned unavailable, with the reason.
std::shared_ptr<KernelTracer> startTracer(const TracerOptions& options = {});

/// Why no kernel trace can be taken on this machine, without starting anything heavier
/// than dlopen of the driver ("" when the driver reports a device). For `crashcap run`,
/// `doctor` and bundles that carry no trace.
std::string gpuUnavailableReason();

/// Is CUPTI compiled into this crashcap?
bool builtWithCupti();

/// The op observer's side of the kernel -> op link (external correlation): while an ATen op
/// runs, the kernels it launches carry its op index. No-ops unless a tracer is running in this
/// process: this library's, or libcrashcap_inject.so's after linkOpsToInjectedTracer().
void pushOp(uint64_t opIndex);
void popOp();

/// A process that libcrashcap_inject.so traces (under `crashcap run`) has the library's own
/// copy of this code, which the Recorder's op observer cannot reach; from here on pushOp talks
/// to CUPTI directly, whose external correlation records the injected tracer collects. Call
/// only where a GPU is present (each op then costs two CUPTI calls).
void linkOpsToInjectedTracer();

}  // namespace crashcap::cupti
