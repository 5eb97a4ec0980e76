#include "trace_fixtures.hpp"

#include <algorithm>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"

namespace crashcap::inspect::testing {

using namespace crashcap::formats;
using nlohmann::json;
using Kind = TraceActivityData::Kind;

namespace {

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

/// A CUDA runtime call by thread kPid that returned `code` (`name`) at tracer time kT0 + `time`.
ApiErrorData runtimeError(std::string api, int32_t code, std::string name, uint32_t correlation, uint64_t time) {
  ApiErrorData e;
  e.domain = "runtime";
  e.api = std::move(api);
  e.code = code;
  e.name = std::move(name);
  e.correlationId = correlation;
  e.timeNs = kT0 + time;
  e.threadId = kPid;
  return e;
}

}  // namespace

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

std::string longMangledName() { return templatedKernelName(3000); }

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

OpTraceData opTrace() {
  OpTraceData t;
  t.ops = {op(99, "aten::copy_", 0, 0), op(100, "aten::conv2d", 1000, 9000), op(101, "aten::relu", 10000, 12000),
           op(102, "aten::add", 13000, 0)};
  t.totalOps = 103;
  t.capacity = 256;
  return t;
}

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
  ApiErrorData e = runtimeError("cudaLaunchKernel", 715, "cudaErrorIllegalInstruction", 15, 13200);
  e.symbol = "_Z10add_kernelPfS_i";
  e.opIndex = 102;
  t.firstError = e;
  t.stickyError = e;  // it poisoned the context itself
  return t;
}

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

BundleRecords roundTrip(const BundleParts& parts) {
  test::TempDir dir;
  writeBundle(dir.file("b.ccap"), parts);
  auto reader = BundleReader::open(dir.file("b.ccap"));
  auto v = readRecords(*reader);
  REQUIRE(v.problems.empty());
  return v;
}

BundleRecords tracedCrash() { return roundTrip({opTrace(), {recordedTrace()}, std::nullopt, true}); }

BundleRecords softErrorBeforeSticky() {
  auto v = tracedCrash();
  // The sticky error stays the 715 launch.
  v.kernelTraces[0].firstError = runtimeError("cudaMalloc", 2, "cudaErrorMemoryAllocation", 9, 900);
  return v;
}

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

crashcap::test::RunResult runCrashcap(std::vector<std::string> args) {
  args.insert(args.begin(), crashcap::test::binPath("crashcap"));
  return crashcap::test::run(args, 120);
}

}  // namespace crashcap::inspect::testing
