// libcrashcap_inject.so: the kernel tracer for a process crashcap did not build (a Python
// training). CUDA loads the library named by CUDA_INJECTION64_PATH when the process
// initialises the driver and calls InitializeInjection; `crashcap run` sets the variable.
//
// The trace goes to $CRASHCAP_DIR/trace-<pid>.cctrace, rewritten whole: every
// CRASHCAP_TRACE_INTERVAL_MS (2000) while launches happen, at once after the first sticky
// CUDA error (the evidence must be on disk before the context takes the process down), and
// at exit. A process that dies without running atexit handlers (SIGKILL, or SIGSEGV/SIGABRT
// with no sticky error before) leaves the last periodic trace.

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "crashcap/cupti/trace_file.hpp"
#include "crashcap/cupti/tracer.hpp"

namespace {

struct Injection {
  std::string path;
  std::shared_ptr<crashcap::cupti::KernelTracer> tracer;
  std::mutex writeMu;
  uint64_t writtenLaunches = ~0ull, writtenActivities = ~0ull;
  std::atomic<bool> exiting{false};
  std::atomic<bool> poisoned{false};   ///< a sticky error was seen: flushes may block for good
  bool closed = false;                 ///< under writeMu: atExit wrote the last trace
  std::mutex waitMu;
  std::condition_variable waitCv;
};

Injection* gInjection = nullptr;  // never freed: the process may still call into CUDA at exit

void writeTrace(bool force) {
  Injection* in = gInjection;
  if (!in) return;
  std::lock_guard<std::mutex> lk(in->writeMu);
  // After atExit the process is tearing down its statics: a periodic write still under way
  // must not touch them.
  if (in->closed) return;
  auto trace = in->tracer->snapshot();
  if (!force && trace.totalLaunches == in->writtenLaunches && trace.totalActivities == in->writtenActivities) return;
  try {
    crashcap::cupti::writeTraceFile(in->path, trace, "libcrashcap_inject");
    in->writtenLaunches = trace.totalLaunches;
    in->writtenActivities = trace.totalActivities;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crashcap: cannot write the kernel trace %s: %s\n", in->path.c_str(), e.what());
  }
}

void atExit() {
  Injection* in = gInjection;
  if (!in) return;
  in->exiting.store(true);
  in->waitCv.notify_all();
  // Bounded, and skipped once the context is poisoned (the sticky-error write already has it).
  if (!in->poisoned.load()) in->tracer->flushWithin(1000, true);
  writeTrace(true);
  std::lock_guard<std::mutex> lk(in->writeMu);
  in->closed = true;
}

int intervalMs() {
  const char* v = std::getenv("CRASHCAP_TRACE_INTERVAL_MS");
  int ms = v ? std::atoi(v) : 2000;
  return ms >= 50 ? ms : 2000;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  if (gInjection) return 1;
  const char* dir = std::getenv("CRASHCAP_DIR");
  if (!dir || !*dir) {
    std::fprintf(stderr, "crashcap: libcrashcap_inject.so loaded without CRASHCAP_DIR: no kernel trace is kept "
                         "(run the command under `crashcap run`)\n");
    return 1;
  }
  auto* in = new Injection;
  in->path = crashcap::cupti::traceFilePath(dir, static_cast<uint32_t>(::getpid()));
  crashcap::cupti::TracerOptions options;
  options.probeDriver = false;  // the driver is calling us from inside cuInit
  // For measuring the parts' cost: a comma list of api-callbacks, api-activity, kernel-activity.
  // A name it does not know is said, not ignored: a measurement must not run the full tracer
  // under another name.
  if (const char* out = std::getenv("CRASHCAP_TRACE_LEAVE_OUT"); out && *out) {
    std::string list = out, left;
    for (size_t at = 0; at <= list.size();) {
      size_t end = list.find(',', at);
      if (end == std::string::npos) end = list.size();
      std::string part = list.substr(at, end - at);
      part.erase(0, part.find_first_not_of(" \t"));
      part.erase(part.find_last_not_of(" \t") + 1);
      at = end + 1;
      if (part.empty()) continue;
      bool* flag = part == "api-callbacks"     ? &options.apiCallbacks
                   : part == "api-activity"    ? &options.apiActivity
                   : part == "kernel-activity" ? &options.kernelActivity
                                               : nullptr;
      if (!flag) {
        std::fprintf(stderr, "crashcap: CRASHCAP_TRACE_LEAVE_OUT: unknown part '%s' (api-callbacks, api-activity, "
                             "kernel-activity); tracing with every part\n", part.c_str());
        options = crashcap::cupti::TracerOptions{};
        options.probeDriver = false;
        break;
      }
      *flag = false;
      left += (left.empty() ? "" : ", ") + part;
    }
    if (!left.empty())
      std::fprintf(stderr, "crashcap: kernel trace without %s (CRASHCAP_TRACE_LEAVE_OUT: for measuring its cost; "
                           "without api-callbacks no CUDA error is seen)\n", left.c_str());
  }
  options.onStickyError = [in] {
    in->poisoned.store(true);
    writeTrace(true);
  };
  in->tracer = crashcap::cupti::startTracer(options);
  gInjection = in;
  writeTrace(true);  // unavailable: the reason is on disk at once; available: an empty trace
  if (!in->tracer->available()) return 1;
  std::atexit(atExit);
  std::thread([in] {
    int ms = intervalMs();
    while (!in->exiting.load()) {
      std::unique_lock<std::mutex> lk(in->waitMu);
      in->waitCv.wait_for(lk, std::chrono::milliseconds(ms), [in] { return in->exiting.load(); });
      lk.unlock();
      if (in->exiting.load()) break;
      // Once poisoned, a flush can block for good: the launch ring still changes, so write.
      if (!in->poisoned.load()) in->tracer->flushWithin(500, false);
      writeTrace(false);
    }
  }).detach();
  return 1;
}
