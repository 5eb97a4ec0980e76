// The Chrome/Perfetto export (`crashcap export B --chrome`), on real bundles written with
// BundleWriter, and through the built `crashcap` binary.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/chrome_trace.hpp"
#include "crashcap/inspect/demangle.hpp"
#include "trace_fixtures.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using namespace crashcap::inspect::testing;
using nlohmann::json;

TEST_CASE("the Chrome export puts ops, API calls and GPU work on one time line with paired flows",
          "[inspect][trace]") {
  auto v = tracedCrash();
  // Through text and back: what a viewer parses, not what the builder holds.
  json trace = json::parse(inspect::chromeTrace(v).dump());
  auto flows = checkEvents(trace);

  // Four launches reached the GPU through an API call of the process: copy, memset, conv, relu.
  // The unlinked kernel and the failed launch have no pair, so no flow.
  CHECK(flows.size() == 4);
  CHECK(trace["otherData"]["flows"] == 4);
  CHECK(trace["otherData"]["kernels"] == 3);
  CHECK(trace["otherData"]["memcpys"] == 1);
  CHECK(trace["otherData"]["memsets"] == 1);
  CHECK(trace["otherData"]["ops"] == 3);
  CHECK(trace["otherData"]["ops_without_time"] == 1);
  CHECK(trace["otherData"]["kernel_trace"] == "pid 4242: recorded");

  // Processes: the host, and one pseudo-process per GPU with a thread per stream.
  const int64_t host = processNamed(trace, "pid 4242"), gpu0 = processNamed(trace, "GPU 0"),
                gpu1 = processNamed(trace, "GPU 1");
  CHECK(host == kPid);
  CHECK(gpu0 != host);
  CHECK(gpu1 != gpu0);
  CHECK(threadNamed(trace, gpu0, 7, "stream 7"));
  CHECK(threadNamed(trace, gpu1, 9, "stream 9"));
  CHECK(threadNamed(trace, host, kPid, "thread 4242 (main)"));

  // The conv kernel: its whole name (demangled when the demangler takes it), on its stream,
  // carrying the op that launched it.
  const std::string demangled = inspect::demangleSymbol(longMangledName());
  auto conv = only(trace, "X", demangled);
  CHECK(conv["pid"] == gpu0);
  CHECK(conv["tid"] == 7);
  CHECK(conv["args"]["op"] == "aten::conv2d");
  CHECK(conv["args"]["op index"] == 100);
  CHECK(conv["args"]["grid"] == json::array({128, 1, 1}));
  CHECK(conv["args"]["block"] == json::array({256, 1, 1}));
  if (demangled != longMangledName()) CHECK(conv["args"]["mangled"] == longMangledName());
  CHECK(conv["dur"].get<double>() == Approx(3.999).epsilon(1e-12));
  auto relu = only(trace, "X", "relu_kernel(float*, int)");
  CHECK(relu["pid"] == gpu1);
  CHECK(relu["args"]["op"] == "aten::relu");
  CHECK(only(trace, "X", "unlinked_kernel")["args"].contains("op") == false);
  CHECK(only(trace, "X", "Memcpy HtoD")["args"]["bytes"] == 24576);
  CHECK(only(trace, "X", "Memset DEVICE")["args"]["bytes"] == 4096);
  CHECK(only(trace, "X", "BUFFER_FLUSH")["tid"] != kPid);

  // The launching call: on the host thread, its flow starts there and ends at the kernel.
  auto launches = find(trace, "X", "cudaLaunchKernel");
  REQUIRE(launches.size() == 3);
  const json& convLaunch = launches[0];
  CHECK(convLaunch["pid"] == kPid);
  CHECK(convLaunch["tid"] == kPid);
  CHECK(convLaunch["args"]["correlation"] == 12);
  CHECK(convLaunch["args"]["op"] == "aten::conv2d");
  // 1001 ns apart on a clock at 1.7e18 ns: the export keeps nanoseconds.
  CHECK(conv["ts"].get<double>() - convLaunch["ts"].get<double>() == Approx(1.001).epsilon(1e-12));
  const json& failing = launches[2];
  CHECK(failing["args"]["return code"] == "715 (cudaErrorIllegalInstruction)");
  CHECK(failing["args"]["op"] == "aten::add");
  bool convFlow = false;
  for (const auto& s : find(trace, "s", "launch")) {
    if (s["ts"] != convLaunch["ts"]) continue;
    CHECK(s["pid"] == kPid);
    CHECK(s["tid"] == kPid);
    for (const auto& f : find(trace, "f", "launch"))
      if (f["id"] == s["id"]) {
        CHECK(f["pid"] == gpu0);
        CHECK(f["tid"] == 7);
        CHECK(f["ts"] == conv["ts"]);
        convFlow = true;
      }
  }
  CHECK(convFlow);

  // Ops moved from CLOCK_MONOTONIC onto the tracer clock: conv2d began 2 us before its launch.
  auto conv2d = only(trace, "X", "aten::conv2d");
  CHECK(conv2d["pid"] == kPid);
  CHECK(conv2d["tid"] == kPid);
  CHECK(convLaunch["ts"].get<double>() - conv2d["ts"].get<double>() == Approx(2.0).epsilon(1e-12));
  CHECK(conv2d["dur"].get<double>() == Approx(8.0).epsilon(1e-12));
  CHECK(conv2d["args"]["step"] == 12);
  CHECK(conv2d["args"]["phase"] == "forward");
  CHECK(conv2d["args"]["sequence number"] == 40);
  CHECK(conv2d["args"]["input shapes"] == json::array({json::array({8, 3, 32, 32}), json::array({16, 3, 3, 3})}));
  // Still running at the crash: an instant on its thread.
  auto add = only(trace, "i", "aten::add");
  CHECK(add["s"] == "t");
  CHECK(add["ts"].get<double>() - conv2d["ts"].get<double>() == Approx(12.0).epsilon(1e-12));
  CHECK(find(trace, "X", "aten::copy_").empty());
  CHECK(find(trace, "i", "aten::copy_").empty());

  // The launch ring, and the first error as a global marker.
  auto ringAdd = only(trace, "i", "launch add_kernel(float*, float*, int)");
  CHECK(ringAdd["args"]["return code"] == "715 (cudaErrorIllegalInstruction)");
  CHECK(ringAdd["args"]["grid"] == json::array({64, 1, 1}));
  CHECK(ringAdd["args"]["stream"] == "0xdead00");
  CHECK(ringAdd["args"]["op"] == "aten::add");
  CHECK(find(trace, "i", "launch " + demangled).size() == 1);
  auto error = only(trace, "i", "first CUDA error: cudaErrorIllegalInstruction in cudaLaunchKernel");
  CHECK(error["s"] == "g");
  CHECK(error["args"]["kernel"] == "add_kernel(float*, float*, int)");
  CHECK(error["args"]["op"] == "aten::add");
  CHECK(error["args"]["sticky"] == true);
}

TEST_CASE("a bundle without a usable kernel trace still exports valid JSON, with the ops and the reason",
          "[inspect][trace]") {
  SECTION("unavailable trace") {
    KernelTraceData t;
    t.status = "unavailable: CUPTI could not subscribe (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)";
    t.pid = kPid;
    json trace = json::parse(inspect::chromeTrace(roundTrip({opTrace(), {t}, std::nullopt, false})).dump());
    auto flows = checkEvents(trace);
    CHECK(flows.empty());
    CHECK_THAT(trace["otherData"]["kernel_trace"].get<std::string>(),
               Catch::Contains("pid 4242: unavailable: CUPTI could not subscribe"));
    CHECK(trace["otherData"]["kernels"] == 0);
    for (const auto& e : trace["traceEvents"])
      if (e["ph"] != "M") CHECK(e["cat"] == "cpu_op");
    // The ops keep their own clock; the first one starts the time line.
    CHECK(only(trace, "X", "aten::conv2d")["ts"] == 0);
    CHECK(only(trace, "X", "aten::relu")["ts"].get<double>() == Approx(9.0).epsilon(1e-12));
    CHECK(processNamed(trace, "pid 4242") == kPid);
  }
  SECTION("no trace record, and crashcap run said why") {
    SupervisionData s;
    s.command = {"python", "train.py"};
    s.pid = kPid;
    s.trace = "unavailable: no NVIDIA driver here (libcuda.so.1: cannot open shared object file)";
    json trace = json::parse(inspect::chromeTrace(roundTrip({opTrace(), {}, s, false})).dump());
    checkEvents(trace);
    CHECK_THAT(trace["otherData"]["kernel_trace"].get<std::string>(),
               Catch::StartsWith("absent") && Catch::Contains("no NVIDIA driver here"));
    CHECK(find(trace, "X", "aten::conv2d").size() == 1);
  }
  SECTION("times no clock gives (a damaged bundle) are left out and counted") {
    auto t = recordedTrace();
    t.activities[7].startNs = UINT64_MAX;           // the conv kernel
    t.launches[0].timeNs = uint64_t(1) << 63;
    auto ops = opTrace();
    ops.ops[1].startNs = -5;                        // aten::conv2d
    json trace = json::parse(inspect::chromeTrace(roundTrip({ops, {t}, std::nullopt, true})).dump());
    auto flows = checkEvents(trace);
    CHECK(flows.size() == 3);
    CHECK(trace["otherData"]["trace_entries_without_time"] == 2);
    CHECK(trace["otherData"]["gpu_activities_without_time"] == 1);
    CHECK(trace["otherData"]["kernels_without_time"] == 1);
    CHECK(trace["otherData"]["ops_without_time"] == 2);
    CHECK(trace["otherData"]["kernels"] == 2);
  }
  SECTION("a context that faulted: CUPTI gave the GPU activities no time; the launches keep theirs") {
    // What an H100 gave for a kernel that trapped: every kernel, copy and memset of the process
    // with start and end 0, the API calls and the launch ring timed as usual.
    auto t = recordedTrace();
    uint64_t gpu = 0, kernels = 0;
    for (auto& a : t.activities) {
      using K = TraceActivityData::Kind;
      if (a.kind == K::Runtime || a.kind == K::Driver || a.kind == K::Overhead) continue;
      a.startNs = a.endNs = 0;
      ++gpu;
      kernels += a.kind == K::Kernel;
    }
    REQUIRE(kernels == 3);
    json trace = json::parse(inspect::chromeTrace(roundTrip({opTrace(), {t}, std::nullopt, true})).dump());
    checkEvents(trace);
    CHECK(trace["otherData"]["kernels"] == 0);
    CHECK(trace["otherData"]["kernels_without_time"] == kernels);
    CHECK(trace["otherData"]["gpu_activities_without_time"] == gpu);
    CHECK(trace["otherData"]["launches"] == t.launches.size());
    CHECK(trace["otherData"]["flows"] == 0);
  }
  SECTION("nothing at all") {
    json trace = json::parse(inspect::chromeTrace(roundTrip({std::nullopt, {}, std::nullopt, false})).dump());
    checkEvents(trace);
    CHECK(trace["traceEvents"].empty());
    CHECK_THAT(trace["otherData"]["kernel_trace"].get<std::string>(), Catch::StartsWith("absent"));
  }
}

TEST_CASE("the Chrome export marks a soft first CUDA error and the sticky one that came after it apart",
          "[inspect][trace]") {
  json trace = inspect::chromeTrace(softErrorBeforeSticky());
  auto first = only(trace, "i", "first CUDA error: cudaErrorMemoryAllocation in cudaMalloc");
  CHECK(first["args"]["sticky"] == false);
  auto sticky = only(trace, "i", "sticky CUDA error: cudaErrorIllegalInstruction in cudaLaunchKernel");
  CHECK(sticky["args"]["sticky"] == true);
  CHECK(sticky["args"]["op"] == "aten::add");
}

TEST_CASE("crashcap export --chrome writes a trace a strict parser loads, and refuses what it cannot export",
          "[inspect][trace][cli]") {
  test::TempDir dir;
  const auto bundle = dir.file("crash.ccap"), out = dir.file("trace.json");
  writeBundle(bundle, {opTrace(), {recordedTrace()}, std::nullopt, true});

  auto exp = runCrashcap({"export", bundle, "--chrome", out});
  INFO("stdout: " << exp.out << "\nstderr: " << exp.err);
  REQUIRE(exp.exitCode == 0);
  json trace = json::parse(test::readText(out));
  checkEvents(trace);
  CHECK(exp.out == "wrote " + out + " (" + std::to_string(trace["traceEvents"].size()) +
                       " events: 3 kernels, 4 flows); load it in https://ui.perfetto.dev or chrome://tracing\n");
  CHECK(exp.err.empty());
  CHECK_FALSE(std::filesystem::exists(out + ".partial"));
  // A second, strict parser (Python's json rejects NaN, bad escapes, trailing garbage).
  auto py = test::run({"/usr/bin/python3", "-c",
                       "import json, sys\nd = json.load(open(sys.argv[1]))\n"
                       "print(len(d['traceEvents']), d['otherData']['kernel_trace'])",
                       out},
                      60);
  INFO(py.err);
  CHECK(py.exitCode == 0);
  CHECK(py.out == std::to_string(trace["traceEvents"].size()) + " pid 4242: recorded\n");

  auto asJson = runCrashcap({"export", bundle, "--chrome", out, "--json"});
  REQUIRE(asJson.exitCode == 0);
  auto summary = json::parse(asJson.out);
  CHECK(summary["kernels"] == 3);
  CHECK(summary["flows"] == 4);
  CHECK(summary["output"] == out);

  // Bad combinations say what to do instead, with exit 2.
  auto both = runCrashcap({"export", bundle, "batch/images", "--chrome", out});
  CHECK(both.exitCode == 2);
  CHECK_THAT(both.err, Catch::Contains("--chrome exports the whole trace, not a tensor"));
  auto neither = runCrashcap({"export", bundle});
  CHECK(neither.exitCode == 2);
  CHECK_THAT(neither.err, Catch::Contains("export needs a tensor name (or --chrome OUT.json"));
  auto noDir = runCrashcap({"export", bundle, "--chrome", dir.file("missing/trace.json")});
  CHECK(noDir.exitCode == 2);
  CHECK_THAT(noDir.err, Catch::Contains("cannot create " + dir.file("missing/trace.json.partial")));
  auto help = runCrashcap({"export", "--help"});
  CHECK(help.exitCode == 0);
  CHECK_THAT(help.out, Catch::Contains("--chrome") && Catch::Contains("https://ui.perfetto.dev"));
}
