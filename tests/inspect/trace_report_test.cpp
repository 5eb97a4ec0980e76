// `crashcap inspect B --trace`: the first CUDA error with its kernel and op, the last launches
// and kernels per op, on real bundles written with BundleWriter, and through the built
// `crashcap` binary.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>

#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/demangle.hpp"
#include "crashcap/inspect/trace_report.hpp"
#include "trace_fixtures.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using namespace crashcap::inspect::testing;
using nlohmann::json;

namespace {

/// The name `inspect --trace --json` gives the return code of a launch through `api` that
/// returned `code`.
std::string returnName(const std::string& api, int32_t code) {
  KernelTraceData t;
  t.status = "recorded";
  t.pid = kPid;
  t.launches = {launch(0, "launched_kernel", 0, 1, code, -1)};
  t.launches[0].api = api;
  BundleRecords v;
  v.kernelTraces = {t};
  return inspect::traceJson(v)["traces"][0]["launches"][0]["return_name"].get<std::string>();
}

}  // namespace

TEST_CASE("inspect --trace names the first error's kernel and op, the last launches and kernels per op",
          "[inspect][trace]") {
  auto v = tracedCrash();
  inspect::TraceReportOptions options;
  options.lastLaunches = 2;
  json j = inspect::traceJson(v, options);
  REQUIRE(j["traces"].size() == 1);
  CHECK(j["note"].is_null());
  const json& t = j["traces"][0];
  CHECK(t["pid"] == kPid);
  CHECK(t["status"] == "recorded");
  CHECK(t["available"] == true);
  CHECK(t["reason"].is_null());
  CHECK(t["clock_offset_ns"] == kOffset);
  CHECK(t["activities"]["total"] == 500);
  CHECK(t["activities"]["dropped"] == 3);
  CHECK(t["activities"]["kept"] == 12);
  CHECK(t["activities"]["kernel"] == 3);
  CHECK(t["activities"]["runtime"] == 5);
  CHECK(t["activities"]["driver"] == 1);
  CHECK(t["activities"]["overhead"] == 1);
  CHECK(t["launch_counts"] == json({{"total", 43}, {"kept", 3}, {"shown", 2}}));

  const json& e = t["first_error"];
  CHECK(e["name"] == "cudaErrorIllegalInstruction");
  CHECK(e["code"] == 715);
  CHECK(e["api"] == "cudaLaunchKernel");
  CHECK(e["sticky"] == true);
  CHECK(e["kernel"]["demangled"] == "add_kernel(float*, float*, int)");
  CHECK(e["kernel"]["grid"] == json::array({64, 1, 1}));
  CHECK(e["kernel"]["stream"] == "0xdead00");
  CHECK(e["op"] == json({{"index", 102}, {"name", "aten::add"}, {"phase", "forward"}, {"step", 12}}));

  // The last two launches, oldest first.
  REQUIRE(t["launches"].size() == 2);
  CHECK(t["launches"][0]["index"] == 41);
  CHECK(t["launches"][0]["demangled"] == "relu_kernel(float*, int)");
  CHECK(t["launches"][0]["op"] == "aten::relu");
  CHECK(t["launches"][1]["index"] == 42);
  CHECK(t["launches"][1]["return_code"] == 715);
  CHECK(t["launches"][1]["return_name"] == "cudaErrorIllegalInstruction");
  CHECK(t["launches"][1]["op"] == "aten::add");
  json all = inspect::traceJson(v)["traces"][0]["launches"];
  REQUIRE(all.size() == 3);
  CHECK(all[0]["symbol"].get<std::string>().size() == 3000);
  CHECK(all[0]["demangled"] == inspect::demangleSymbol(longMangledName()));

  // Newest first: add (its launch only), relu, conv2d.
  const json& perOp = t["kernels_per_op"];
  REQUIRE(perOp.size() == 3);
  CHECK(perOp[0]["op"] == "aten::add");
  CHECK(perOp[0]["kernels"] == 0);
  CHECK(perOp[0]["launches"] == 1);
  CHECK(perOp[1]["op"] == "aten::relu");
  CHECK(perOp[1]["kernels"] == 1);
  CHECK(perOp[1]["gpu_ns"] == 500);
  CHECK(perOp[2]["op"] == "aten::conv2d");
  CHECK(perOp[2]["gpu_ns"] == 3999);
  CHECK(perOp[2]["last_kernel"] == inspect::demangleSymbol(longMangledName()));

  auto text = inspect::traceText(v, options);
  CHECK_THAT(text, Catch::Contains("kernel trace  pid 4242: recorded (CUPTI 26)"));
  CHECK_THAT(text, Catch::Contains("FIRST ERROR   cudaErrorIllegalInstruction (715) returned by cudaLaunchKernel"));
  CHECK_THAT(text, Catch::Contains("  kernel      add_kernel(float*, float*, int)  grid 64x1x1 block 128x1x1"));
  CHECK_THAT(text, Catch::Contains("  op          #102 aten::add (forward, step 12)"));
  CHECK_THAT(text, Catch::Contains("last 2 launches (of 43 seen)"));
  CHECK_THAT(text, Catch::Contains("715 cudaErrorIllegalInstruction"));
  CHECK_THAT(text, Catch::Contains("kernels per op"));
}

TEST_CASE("a soft CUDA error before the sticky one: both are shown, and the sticky one is the failure",
          "[inspect][trace]") {
  auto v = softErrorBeforeSticky();
  json j = inspect::traceJson(v);
  const json& tj = j["traces"][0];
  CHECK(tj["first_error"]["code"] == 2);
  CHECK(tj["first_error"]["sticky"] == false);
  REQUIRE(tj["sticky_error"].is_object());
  CHECK(tj["sticky_error"]["code"] == 715);
  CHECK(tj["sticky_error"]["sticky"] == true);
  CHECK(tj["sticky_error"]["kernel"]["demangled"] == "add_kernel(float*, float*, int)");
  CHECK(tj["sticky_error"]["op"]["name"] == "aten::add");

  auto text = inspect::traceText(v);
  CHECK_THAT(text, Catch::Contains("FIRST ERROR   cudaErrorMemoryAllocation (2) returned by cudaMalloc"));
  CHECK_THAT(text, Catch::Contains("sticky      no: the context survived it"));
  CHECK_THAT(text, Catch::Contains("STICKY ERROR  cudaErrorIllegalInstruction (715) returned by cudaLaunchKernel"));
  CHECK(text.find("FIRST ERROR") < text.find("STICKY ERROR"));
}

TEST_CASE("inspect --trace says why a trace is unavailable or absent", "[inspect][trace]") {
  KernelTraceData t;
  t.status = "unavailable: no NVIDIA driver here";
  t.pid = 7;
  auto unavailable = inspect::traceJson(roundTrip({std::nullopt, {t}, std::nullopt, false}));
  REQUIRE(unavailable["traces"].size() == 1);
  CHECK(unavailable["traces"][0]["available"] == false);
  CHECK(unavailable["traces"][0]["reason"] == "no NVIDIA driver here");
  CHECK(unavailable["traces"][0]["first_error"].is_null());
  CHECK(unavailable["traces"][0]["launches"].empty());

  auto absent = roundTrip({std::nullopt, {}, std::nullopt, false});
  CHECK(inspect::traceJson(absent)["traces"].empty());
  CHECK_THAT(inspect::traceJson(absent)["note"].get<std::string>(), Catch::Contains("no kernel trace"));
  CHECK_THAT(inspect::traceText(absent), Catch::StartsWith("kernel trace  none: "));
}

TEST_CASE("CUDA result codes get the runtime's names for cuda* calls and CUresult names for driver calls",
          "[inspect][trace]") {
  CHECK(returnName("cudaLaunchKernel", 715) == "cudaErrorIllegalInstruction");
  CHECK(returnName("cuLaunchKernel", 715) == "CUDA_ERROR_ILLEGAL_INSTRUCTION");
  CHECK(returnName("cuMemAlloc", 2) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(returnName("cudaMalloc", 2) == "cudaErrorMemoryAllocation");
  CHECK(returnName("cudaMalloc", 12345).empty());
}

TEST_CASE("crashcap inspect --trace works end to end, and the inspect story points to it", "[inspect][trace][cli]") {
  test::TempDir dir;
  const auto bundle = dir.file("crash.ccap");
  writeBundle(bundle, {opTrace(), {recordedTrace()}, std::nullopt, true});

  auto inspectJson = runCrashcap({"inspect", bundle, "--trace", "--json", "--launches", "1"});
  INFO(inspectJson.err);
  REQUIRE(inspectJson.exitCode == 0);
  auto j = json::parse(inspectJson.out);
  CHECK(j["bundle"] == bundle);
  CHECK(j["traces"][0]["first_error"]["op"]["name"] == "aten::add");
  CHECK(j["traces"][0]["launches"].size() == 1);
  auto text = runCrashcap({"inspect", bundle, "--trace"});
  CHECK(text.exitCode == 0);
  CHECK_THAT(text.out, Catch::Contains("FIRST ERROR") && Catch::Contains("crashcap export " + bundle + " --chrome"));

  auto story = runCrashcap({"inspect", bundle});
  CHECK(story.exitCode == 0);
  CHECK_THAT(story.out, Catch::Contains("trace      pid 4242: recorded; first sticky CUDA error cudaErrorIllegalInstruction in "
                                        "cudaLaunchKernel  (crashcap inspect " + bundle + " --trace)"));

  // --launches without --trace is a usage error (exit 2) that names what is missing.
  auto launchesAlone = runCrashcap({"inspect", bundle, "--launches", "5"});
  CHECK(launchesAlone.exitCode == 2);
  CHECK_THAT(launchesAlone.err, Catch::Contains("--trace"));
}

TEST_CASE("the HTML report summarises a bundle's kernel trace: its errors and its most expensive kernels",
          "[inspect][trace][cli]") {
  test::TempDir dir;
  const auto bundle = dir.file("crash.ccap");
  writeBundle(bundle, {opTrace(), {recordedTrace()}, std::nullopt, true});
  const auto page = dir.file("report.html");
  auto r = runCrashcap({"report", bundle, "--html", "-o", page, "--no-triage"});
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  const std::string html = test::readText(page);
  CHECK_THAT(html, Catch::Contains("<h2>GPU kernel trace</h2>"));
  CHECK_THAT(html, Catch::Contains("context-poisoning error: <code>cudaErrorIllegalInstruction</code>"));
  CHECK_THAT(html, Catch::Contains("<th>kernel</th><th>launches</th><th>total ms</th>"));
}
