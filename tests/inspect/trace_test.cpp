// The kernel-trace viewers: the Chrome/Perfetto export and `inspect --trace`, on real bundles
// written with BundleWriter, and through the built `crashcap` binary.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/trace.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
using nlohmann::json;
using Kind = TraceActivityData::Kind;

namespace {

constexpr uint32_t kPid = 4242;
/// Tracer clock near a CLOCK_REALTIME epoch (1.7e18 ns): absolute microseconds in a double
/// would lose the nanoseconds, so these times check that the export keeps them.
constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
/// CLOCK_MONOTONIC at kT0 (1000 s of uptime).
constexpr int64_t kM0 = 1'000'000'000'000;
constexpr int64_t kOffset = kM0 - static_cast<int64_t>(kT0);  // monotonic = tracer + offset

/// A valid Itanium-mangled kernel name of exactly `length` characters (>= 100), a template
/// the way PyTorch's are: `void at::native::kernel<at::native::ElementwiseFunctor_000, ...>(float*, int)`.
std::string templatedKernelName(size_t length) {
  const std::string head = "_ZN2at6native6kernelI", tail = "EEvPfi";
  std::string args;
  for (int i = 0;; ++i) {
    std::string digits = std::to_string(i);
    std::string id = "ElementwiseFunctor_" + std::string(3 - std::min<size_t>(3, digits.size()), '0') + digits;
    std::string arg = "NS0_" + std::to_string(id.size()) + id + "E";
    const size_t remaining = length - head.size() - tail.size() - args.size();
    if (remaining >= arg.size() + 60) {
      args += arg;
      continue;
    }
    // The last argument's identifier fills the name to `length`: "NS0_" + digits(n) + n + "E".
    for (size_t n = 21;; ++n)
      if (5 + std::to_string(n).size() + n == remaining)
        return head + args + "NS0_" + std::to_string(n) + "ElementwiseFunctorEnd" + std::string(n - 21, 'x') + "E" +
               tail;
  }
}

/// A mangled name whose demangled form doubles with each level: `f(a, p<a, a>, p<p<a, a>,
/// p<a, a> >, ...)`, 2^levels characters from 11 bytes a level.
std::string exponentialName(int levels) {
  auto substitution = [](int i) {
    if (i == 0) return std::string("S_");
    const char* digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    std::string seq;
    for (int n = i - 1;; n /= 36) {
      seq.insert(seq.begin(), digits[n % 36]);
      if (n < 36) break;
    }
    return "S" + seq + "_";
  };
  std::string s = "_Z1f1a1pIS_S_E";  // candidates: S_ = a, S0_ = p, S1_ = p<a, a>
  for (int k = 0; k < levels; ++k) s += "S0_I" + substitution(k + 2) + substitution(k + 2) + "E";
  return s;
}

/// The conv kernel's symbol: 3000 characters, longer than libstdc++'s demangler accepts.
std::string longMangledName() { return templatedKernelName(3000); }

TraceActivityData activity(Kind kind, std::string name, uint64_t start, uint64_t end, uint32_t correlation,
                           int64_t op) {
  TraceActivityData a;
  a.kind = kind;
  a.name = std::move(name);
  a.startNs = kT0 + start;
  a.endNs = kT0 + end;
  a.correlationId = correlation;
  a.opIndex = op;
  a.threadId = kPid;
  return a;
}

TraceActivityData onStream(TraceActivityData a, uint32_t device, uint32_t stream) {
  a.deviceId = device;
  a.streamId = stream;
  a.threadId = 0;
  return a;
}

KernelLaunchData launch(uint64_t index, std::string symbol, uint64_t time, uint32_t correlation, int32_t rc,
                        int64_t op) {
  KernelLaunchData l;
  l.index = index;
  l.symbol = std::move(symbol);
  l.api = "cudaLaunchKernel";
  l.grid[0] = 64;
  l.grid[1] = l.grid[2] = 1;
  l.block[0] = 128;
  l.block[1] = l.block[2] = 1;
  l.stream = 0xdead00;
  l.correlationId = correlation;
  l.timeNs = kT0 + time;
  l.threadId = kPid;
  l.returnCode = rc;
  l.opIndex = op;
  return l;
}

OpData op(uint64_t index, std::string name, int64_t start, int64_t end) {
  OpData o;
  o.index = index;
  o.name = std::move(name);
  o.phase = "forward";
  o.sequenceNr = int64_t(index) - 60;
  o.step = 12;
  o.thread = kPid;
  o.inputs = {{"float32", {8, 3, 32, 32}}, {"float32", {16, 3, 3, 3}}};
  o.startNs = start ? kM0 + start : 0;
  o.endNs = end ? kM0 + end : 0;
  return o;
}

/// The ops of step 12 on CLOCK_MONOTONIC: conv2d and relu finished, add still running at the
/// crash, and an older op without times.
OpTraceData opTrace() {
  OpTraceData t;
  t.ops = {op(99, "aten::copy_", 0, 0), op(100, "aten::conv2d", 1000, 9000), op(101, "aten::relu", 10000, 12000),
           op(102, "aten::add", 13000, 0)};
  t.totalOps = 103;
  t.capacity = 256;
  return t;
}

/// pid 4242's trace: a copy, a memset and a conv kernel (3000-char name) launched by conv2d, a
/// relu kernel on a second GPU, a kernel no API call explains, CUPTI overhead, and a launch by
/// aten::add that failed with cudaErrorIllegalInstruction before its kernel ran.
KernelTraceData recordedTrace() {
  KernelTraceData t;
  t.status = "recorded";
  t.pid = kPid;
  t.clockOffsetNs = kOffset;
  t.cuptiVersion = 26;
  t.totalActivities = 500;
  t.droppedActivities = 3;
  t.totalLaunches = 43;
  auto memcpy = onStream(activity(Kind::Memcpy, "HtoD", 1500, 2500, 10, 100), 0, 7);
  memcpy.bytes = 24576;
  auto memset = onStream(activity(Kind::Memset, "DEVICE", 2800, 2900, 11, 100), 0, 7);
  memset.bytes = 4096;
  auto conv = onStream(activity(Kind::Kernel, longMangledName(), 4001, 8000, 12, 100), 0, 7);
  conv.grid[0] = 128;
  conv.grid[1] = conv.grid[2] = 1;
  conv.block[0] = 256;
  conv.block[1] = conv.block[2] = 1;
  auto failing = activity(Kind::Runtime, "cudaLaunchKernel", 13100, 13200, 15, 102);
  failing.returnCode = 715;
  t.activities = {activity(Kind::Overhead, "BUFFER_FLUSH", 500, 600, 0, -1),
                  activity(Kind::Runtime, "cudaMemcpyAsync", 1100, 1400, 10, 100),
                  memcpy,
                  activity(Kind::Runtime, "cudaMemsetAsync", 2600, 2700, 11, 100),
                  memset,
                  activity(Kind::Runtime, "cudaLaunchKernel", 3000, 3500, 12, 100),
                  activity(Kind::Driver, "cuCtxSynchronize", 3600, 3700, 13, -1),
                  conv,
                  onStream(activity(Kind::Kernel, "unlinked_kernel", 9000, 9500, 99, -1), 0, 7),
                  activity(Kind::Runtime, "cudaLaunchKernel", 10100, 10300, 14, 101),
                  onStream(activity(Kind::Kernel, "_Z11relu_kernelPfi", 10500, 11000, 14, 101), 1, 9),
                  failing};
  t.launches = {launch(40, longMangledName(), 3000, 12, 0, 100), launch(41, "_Z11relu_kernelPfi", 10100, 14, 0, 101),
                launch(42, "_Z10add_kernelPfS_i", 13100, 15, 715, 102)};
  ApiErrorData e;
  e.domain = "runtime";
  e.api = "cudaLaunchKernel";
  e.code = 715;
  e.name = "cudaErrorIllegalInstruction";
  e.correlationId = 15;
  e.timeNs = kT0 + 13200;
  e.threadId = kPid;
  e.symbol = "_Z10add_kernelPfS_i";
  e.opIndex = 102;
  t.firstError = e;
  t.stickyError = e;  // it poisoned the context itself
  return t;
}

struct BundleParts {
  std::optional<OpTraceData> ops;
  std::vector<KernelTraceData> traces;
  std::optional<SupervisionData> supervision;
  bool crash = true;
};

void writeBundle(const std::string& path, const BundleParts& parts) {
  auto w = BundleWriter::create(path);
  if (parts.ops) writeMetaRecord(*w, *parts.ops);
  for (const auto& t : parts.traces) writeMetaRecord(*w, t);
  if (parts.supervision) writeMetaRecord(*w, *parts.supervision);
  if (parts.crash) {
    CrashData c;
    c.kind = "exception";
    c.step = 12;
    c.phase = "forward";
    c.error = "CUDA error: an illegal instruction was encountered";
    c.pid = kPid;
    c.thread = kPid;
    writeMetaRecord(*w, c);
  }
  w->seal();
}

/// Writes `parts` into a real bundle and reads it back, as the CLI does.
RecordingView roundTrip(const BundleParts& parts) {
  test::TempDir dir;
  writeBundle(dir.file("b.ccap"), parts);
  auto reader = BundleReader::open(dir.file("b.ccap"));
  auto v = readRecording(*reader);
  REQUIRE(v.problems.empty());
  return v;
}

RecordingView tracedCrash() { return roundTrip({opTrace(), {recordedTrace()}, std::nullopt, true}); }

/// Checks what every viewer needs of every event; returns flow ids -> {starts, ends}.
std::map<uint64_t, std::pair<int, int>> checkEvents(const json& trace) {
  REQUIRE(trace.is_object());
  REQUIRE(trace["traceEvents"].is_array());
  CHECK(trace["displayTimeUnit"] == "ns");
  REQUIRE(trace["otherData"].is_object());
  std::map<uint64_t, std::pair<int, int>> flows;
  for (const auto& e : trace["traceEvents"]) {
    INFO(e.dump());
    REQUIRE(e.contains("ph"));
    REQUIRE(e["ts"].is_number());
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    CHECK(e["ts"].get<double>() >= 0);
    if (e["ph"] == "X") {
      REQUIRE(e["dur"].is_number());
      CHECK(e["dur"].get<double>() >= 0);
    }
    if (e["ph"] == "s") ++flows[e["id"].get<uint64_t>()].first;
    if (e["ph"] == "f") {
      CHECK(e["bp"] == "e");
      ++flows[e["id"].get<uint64_t>()].second;
    }
  }
  for (const auto& [id, ends] : flows) {
    INFO("flow " << id);
    CHECK(ends.first == 1);
    CHECK(ends.second == 1);
  }
  return flows;
}

/// The events with this ph and name.
std::vector<json> find(const json& trace, const std::string& ph, const std::string& name) {
  std::vector<json> found;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == ph && e.value("name", "") == name) found.push_back(e);
  return found;
}

json only(const json& trace, const std::string& ph, const std::string& name) {
  auto found = find(trace, ph, name);
  INFO(ph << " " << name);
  REQUIRE(found.size() == 1);
  return found[0];
}

/// The pid of the process named `name` by a process_name metadata event.
int64_t processNamed(const json& trace, const std::string& name) {
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == name) return e["pid"];
  FAIL("no process named " << name);
  return -1;
}

bool threadNamed(const json& trace, int64_t pid, int64_t tid, const std::string& name) {
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid && e["tid"] == tid && e["args"]["name"] == name)
      return true;
  return false;
}

}  // namespace

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
    CHECK(trace["otherData"]["ops_without_time"] == 2);
    CHECK(trace["otherData"]["kernels"] == 2);
  }
  SECTION("nothing at all") {
    json trace = json::parse(inspect::chromeTrace(roundTrip({std::nullopt, {}, std::nullopt, false})).dump());
    checkEvents(trace);
    CHECK(trace["traceEvents"].empty());
    CHECK_THAT(trace["otherData"]["kernel_trace"].get<std::string>(), Catch::StartsWith("absent"));
  }
}

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
  // A cudaMalloc that failed and was recovered from (the caching allocator frees and retries),
  // then the illegal instruction that poisoned the context.
  auto v = tracedCrash();
  auto& t = v.kernelTraces[0];
  ApiErrorData oom;
  oom.domain = "runtime";
  oom.api = "cudaMalloc";
  oom.code = 2;
  oom.name = "cudaErrorMemoryAllocation";
  oom.correlationId = 9;
  oom.timeNs = kT0 + 900;
  oom.threadId = kPid;
  t.firstError = oom;  // the stickyError stays the 715 launch

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

  json trace = inspect::chromeTrace(v);
  auto first = only(trace, "i", "first CUDA error: cudaErrorMemoryAllocation in cudaMalloc");
  CHECK(first["args"]["sticky"] == false);
  auto sticky = only(trace, "i", "sticky CUDA error: cudaErrorIllegalInstruction in cudaLaunchKernel");
  CHECK(sticky["args"]["sticky"] == true);
  CHECK(sticky["args"]["op"] == "aten::add");
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

TEST_CASE("kernel symbols are demangled and CUDA result codes named", "[inspect][trace]") {
  CHECK(inspect::demangleSymbol("_Z11relu_kernelPfi") == "relu_kernel(float*, int)");
  CHECK(inspect::demangleSymbol("relu_kernel") == "relu_kernel");
  CHECK(inspect::demangleSymbol("_Znot a mangled name") == "_Znot a mangled name");
  CHECK(inspect::demangleSymbol("") == "");
  // PyTorch-style template kernels demangle; libstdc++ refuses names over 1024 characters (a
  // stack guard), and those come back whole, never cut.
  const auto name1000 = templatedKernelName(1000), name3000 = templatedKernelName(3000);
  REQUIRE(name1000.size() == 1000);
  REQUIRE(name3000.size() == 3000);
  CHECK_THAT(inspect::demangleSymbol(name1000),
             Catch::StartsWith("void at::native::kernel<at::native::ElementwiseFunctor_000, "
                               "at::native::ElementwiseFunctor_001, ") &&
                 Catch::EndsWith(">(float*, int)"));
  const auto long3000 = inspect::demangleSymbol(name3000);
  CHECK((long3000 == name3000 || Catch::endsWith(long3000, ">(float*, int)")));

  // Untrusted names: a small exponential one demangles; one of 100 MB stays mangled; one that
  // would never finish is given up on, and the names after it in the batch still demangle.
  auto small = inspect::demangleSymbol(exponentialName(8));
  CHECK_THAT(small, Catch::StartsWith("f(a, p<a, a>, p<p<a, a>, p<a, a> >, "));
  CHECK(small.size() > 5000);
  CHECK(inspect::demangleSymbol(exponentialName(22)) == exponentialName(22));
  const auto start = std::chrono::steady_clock::now();
  auto batch = inspect::demangleSymbols({"_Z11relu_kernelPfi", exponentialName(80), "relu", "_Z10add_kernelPfS_i"});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(batch == std::vector<std::string>{"relu_kernel(float*, int)", exponentialName(80), "relu",
                                          "add_kernel(float*, float*, int)"});
  CHECK(inspect::cudaResultName("cudaLaunchKernel", 715) == "cudaErrorIllegalInstruction");
  CHECK(inspect::cudaResultName("cuLaunchKernel", 715) == "CUDA_ERROR_ILLEGAL_INSTRUCTION");
  CHECK(inspect::cudaResultName("cuMemAlloc", 2) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(inspect::cudaResultName("cudaMalloc", 2) == "cudaErrorMemoryAllocation");
  CHECK(inspect::cudaResultName("cudaMalloc", 12345).empty());
}

TEST_CASE("crashcap export --chrome and inspect --trace work end to end", "[inspect][trace][cli]") {
  test::TempDir dir;
  const auto bundle = dir.file("crash.ccap"), out = dir.file("trace.json");
  writeBundle(bundle, {opTrace(), {recordedTrace()}, std::nullopt, true});
  auto cli = [](std::vector<std::string> args) {
    args.insert(args.begin(), test::binPath("crashcap"));
    return test::run(args, 120);
  };

  auto exp = cli({"export", bundle, "--chrome", out});
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

  auto asJson = cli({"export", bundle, "--chrome", out, "--json"});
  REQUIRE(asJson.exitCode == 0);
  auto summary = json::parse(asJson.out);
  CHECK(summary["kernels"] == 3);
  CHECK(summary["flows"] == 4);
  CHECK(summary["output"] == out);

  auto inspectJson = cli({"inspect", bundle, "--trace", "--json", "--launches", "1"});
  INFO(inspectJson.err);
  REQUIRE(inspectJson.exitCode == 0);
  auto j = json::parse(inspectJson.out);
  CHECK(j["bundle"] == bundle);
  CHECK(j["traces"][0]["first_error"]["op"]["name"] == "aten::add");
  CHECK(j["traces"][0]["launches"].size() == 1);
  auto text = cli({"inspect", bundle, "--trace"});
  CHECK(text.exitCode == 0);
  CHECK_THAT(text.out, Catch::Contains("FIRST ERROR") && Catch::Contains("crashcap export " + bundle + " --chrome"));

  auto story = cli({"inspect", bundle});
  CHECK(story.exitCode == 0);
  CHECK_THAT(story.out, Catch::Contains("trace      pid 4242: recorded; first sticky CUDA error cudaErrorIllegalInstruction in "
                                        "cudaLaunchKernel  (crashcap inspect " + bundle + " --trace)"));

  // Bad combinations say what to do instead, with exit 2.
  auto both = cli({"export", bundle, "batch/images", "--chrome", out});
  CHECK(both.exitCode == 2);
  CHECK_THAT(both.err, Catch::Contains("--chrome exports the whole trace, not a tensor"));
  auto neither = cli({"export", bundle});
  CHECK(neither.exitCode == 2);
  CHECK_THAT(neither.err, Catch::Contains("export needs a tensor name (or --chrome OUT.json"));
  auto launchesAlone = cli({"inspect", bundle, "--launches", "5"});
  CHECK(launchesAlone.exitCode == 2);
  CHECK_THAT(launchesAlone.err, Catch::Contains("--trace"));
  auto noDir = cli({"export", bundle, "--chrome", dir.file("missing/trace.json")});
  CHECK(noDir.exitCode == 2);
  CHECK_THAT(noDir.err, Catch::Contains("cannot create " + dir.file("missing/trace.json.partial")));
  auto help = cli({"export", "--help"});
  CHECK(help.exitCode == 0);
  CHECK_THAT(help.out, Catch::Contains("--chrome") && Catch::Contains("https://ui.perfetto.dev"));
}
