#include "crash_guard.hpp"

#include <cxxabi.h>
#include <execinfo.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <typeinfo>

#include "crashcap/recorder/signal_context.hpp"

#include "live_writer.hpp"

namespace crashcap::recorder::detail {
namespace {

/// SIGTERM is the request to stop that schedulers, launchers and `crashcap run` send a process
/// they end (a job's rank still waiting in a collective after another failed): where it stops
/// matters as much as where a crash does. It is guarded only where nothing else handles it.
constexpr int kSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTERM};
constexpr int kSignalCount = sizeof(kSignals) / sizeof(kSignals[0]);
/// Whether the guard took each signal over (SIGTERM keeps a handler the program installed).
bool gTaken[kSignalCount] = {};

std::mutex gInstallMu;
bool gInstalled = false;
struct sigaction gPrevious[kSignalCount];
std::terminate_handler gPrevTerminate = nullptr;
DescribeException gDescribe = nullptr;
/// Set once a terminal failure (signal or std::terminate) was handed to the writer, so the
/// SIGABRT that std::terminate raises next does not record a second crash.
std::atomic<bool> gHandled{false};
/// The process that installed the guard. A child it forks (a DataLoader worker) inherits the
/// handlers but not the writer's thread: there the handlers only pass the failure on.
pid_t gOwnerPid = 0;
alignas(16) char gAltStack[64 * 1024];

int slotOf(int sig) {
  for (int i = 0; i < kSignalCount; ++i)
    if (kSignals[i] == sig) return i;
  return -1;
}

void onFatalSignal(int sig, siginfo_t* info, void* /*context*/) {
  recorder::escapeSignalContextDump();  // a fault inside the interpreter's stack dump: back to before it
  if (::getpid() == gOwnerPid && !gHandled.exchange(true)) {
    if (LiveWriter* w = activeWriter()) {
      void* frames[64];
      int n = backtrace(frames, 64);  // warmed up at install time, so it does not allocate
      // si_code <= 0 (SI_USER, SI_TKILL, SI_QUEUE): sent by a process, whose pid is there instead
      // of a faulting address.
      // A sender in another pid namespace shows as pid 0: sent all the same (-1: not known).
      const bool sent = info && info->si_code <= 0;
      w->crashFromSignal(sig, info && !sent ? info->si_addr : nullptr, frames, n,
                         sent ? (info->si_pid > 0 ? info->si_pid : -1) : 0);
    }
  }
  // Die as the process would have: restore what was there before and deliver the signal
  // again. It is blocked while this handler runs, so it arrives as soon as we return; a
  // hardware fault would also simply recur.
  int slot = slotOf(sig);
  struct sigaction previous = gPrevious[slot];
  if (previous.sa_handler == SIG_IGN) previous.sa_handler = SIG_DFL;
  sigaction(sig, &previous, nullptr);
  raise(sig);
}

void onTerminate() {
  if (::getpid() == gOwnerPid && !gHandled.exchange(true)) {
    if (LiveWriter* w = activeWriter()) {
      formats::CrashData crash;
      crash.kind = "terminate";
      if (auto e = std::current_exception()) {
        describeCurrentException(e, crash);
        crash.error = fmt::format("terminate called after throwing an instance of '{}'\n  what():  {}",
                                  crash.errorType.empty() ? "unknown" : crash.errorType, crash.error);
      } else {
        crash.error = "std::terminate called without an active exception";
      }
      if (crash.stack.empty()) crash.stack = currentStack(1);
      crash.step = w->currentStep.load();
      crash.phase = phaseName(static_cast<Phase>(w->phase.load()));
      crash.timeNs = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
      crash.pid = static_cast<uint32_t>(::getpid());
      crash.thread = static_cast<uint64_t>(::syscall(SYS_gettid));
      w->crash(std::move(crash));
    }
  }
  if (gPrevTerminate)
    gPrevTerminate();
  std::abort();
}

}  // namespace

std::string exceptionTypeName(const std::exception& e) {
  int status = 0;
  char* name = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : typeid(e).name();
  std::free(name);
  return out;
}

std::vector<std::string> currentStack(int skip) {
  void* frames[64];
  int n = backtrace(frames, 64);
  skip = std::min(skip + 1, n);
  return symbolize(frames + skip, n - skip);
}

void describeCurrentException(std::exception_ptr e, formats::CrashData& crash) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    crash.errorType = exceptionTypeName(ex);
    crash.error = ex.what();
    if (gDescribe) gDescribe(ex, crash);
  } catch (...) {
    crash.errorType = "";
    crash.error = "unknown exception (not derived from std::exception)";
  }
}

void installCrashGuard(DescribeException describe) {
  std::lock_guard<std::mutex> lk(gInstallMu);
  gDescribe = describe;
  if (gInstalled) return;
  {
    // The first backtrace() loads libgcc_s (it allocates); do it here, not in a handler.
    void* warm[4];
    (void)backtrace(warm, 4);
  }
  // An alternate stack so a stack overflow can still be reported (this thread only).
  stack_t ss{};
  ss.ss_sp = gAltStack;
  ss.ss_size = sizeof gAltStack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = onFatalSignal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < kSignalCount; ++i) {
    gTaken[i] = false;
    if (kSignals[i] == SIGTERM) {
      struct sigaction current {};
      if (sigaction(SIGTERM, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL)
        continue;
    }
    gTaken[i] = sigaction(kSignals[i], &sa, &gPrevious[i]) == 0;
  }
  gPrevTerminate = std::set_terminate(onTerminate);
  gOwnerPid = ::getpid();
  gHandled = false;
  gInstalled = true;
}

void uninstallCrashGuard() {
  std::lock_guard<std::mutex> lk(gInstallMu);
  if (!gInstalled) return;
  for (int i = 0; i < kSignalCount; ++i) {
    if (!gTaken[i]) continue;
    // A handler the program installed after ours (a checkpoint on SIGTERM) stays.
    struct sigaction current {};
    if (sigaction(kSignals[i], nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == onFatalSignal)
      sigaction(kSignals[i], &gPrevious[i], nullptr);
  }
  std::set_terminate(gPrevTerminate);
  gInstalled = false;
}

}  // namespace crashcap::recorder::detail
