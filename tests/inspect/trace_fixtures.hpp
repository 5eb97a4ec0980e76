#pragma once
// Helpers for the kernel-trace tests: a crashed step's op trace and kernel trace written into
// a real bundle and read back, mangled kernel names, checks on Trace Event Format output, and
// the built `crashcap` binary.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"
#include "test_support.hpp"

namespace crashcap::inspect::testing {

/// The traced process, and the thread that launched everything.
inline constexpr uint32_t kPid = 4242;
/// Tracer clock near a CLOCK_REALTIME epoch (1.7e18 ns): absolute microseconds in a double
/// would lose the nanoseconds, so these times check that the export keeps them.
inline constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
/// CLOCK_MONOTONIC at kT0 (1000 s of uptime).
inline constexpr int64_t kM0 = 1'000'000'000'000;
inline constexpr int64_t kOffset = kM0 - static_cast<int64_t>(kT0);  // monotonic = tracer + offset

/// A valid Itanium-mangled kernel name of exactly `length` characters (>= 100), a template
/// the way PyTorch's are: `void at::native::kernel<at::native::ElementwiseFunctor_000, ...>(float*, int)`.
std::string templatedKernelName(size_t length);

/// The conv kernel's symbol: 3000 characters, longer than libstdc++'s demangler accepts.
std::string longMangledName();

/// A cudaLaunchKernel of `symbol` by thread kPid (grid 64x1x1, block 128x1x1, stream
/// 0xdead00) at tracer time kT0 + `time`, returning `rc` (-1: not returned), launched by op
/// `op` (-1: none).
formats::KernelLaunchData launch(uint64_t index, std::string symbol, uint64_t time, uint32_t correlation, int32_t rc,
                                 int64_t op);

/// The ops of step 12 on CLOCK_MONOTONIC: conv2d and relu finished, add still running at the
/// crash, and an older op without times.
formats::OpTraceData opTrace();

/// pid 4242's trace: a copy, a memset and a conv kernel (3000-char name) launched by conv2d, a
/// relu kernel on a second GPU, a kernel no API call explains, CUPTI overhead, and a launch by
/// aten::add that failed with cudaErrorIllegalInstruction before its kernel ran.
formats::KernelTraceData recordedTrace();

/// What writeBundle puts into a bundle; `crash` adds a crash record naming kPid.
struct BundleParts {
  std::optional<formats::OpTraceData> ops;
  std::vector<formats::KernelTraceData> traces;
  std::optional<formats::SupervisionData> supervision;
  bool crash = true;
};

/// Writes `parts` into a sealed bundle at `path`.
void writeBundle(const std::string& path, const BundleParts& parts);

/// Writes `parts` into a real bundle and reads it back, as the CLI does.
formats::BundleRecords roundTrip(const BundleParts& parts);

/// The crash of opTrace() and recordedTrace(), through a real bundle.
formats::BundleRecords tracedCrash();

/// tracedCrash() where a cudaMalloc failed and was recovered from (the caching allocator frees
/// and retries) before the illegal instruction that poisoned the context: the first error is
/// soft, the sticky one is the failure.
formats::BundleRecords softErrorBeforeSticky();

/// Checks what every viewer needs of every event; returns flow ids -> {starts, ends}.
std::map<uint64_t, std::pair<int, int>> checkEvents(const nlohmann::json& trace);

/// The events with this ph and name.
std::vector<nlohmann::json> find(const nlohmann::json& trace, const std::string& ph, const std::string& name);

/// The one event with this ph and name (fails the test unless there is exactly one).
nlohmann::json only(const nlohmann::json& trace, const std::string& ph, const std::string& name);

/// The pid of the process named `name` by a process_name metadata event.
int64_t processNamed(const nlohmann::json& trace, const std::string& name);

/// Whether a thread_name metadata event names (pid, tid) `name`.
bool threadNamed(const nlohmann::json& trace, int64_t pid, int64_t tid, const std::string& name);

/// Runs the built `crashcap` with `args` (120 s at most).
crashcap::test::RunResult runCrashcap(std::vector<std::string> args);

}  // namespace crashcap::inspect::testing
