// The kernel tracer's conversion, from hand-built CUPTI activity buffers in CUDA 13's layouts
// (walked by the real libcupti, which needs no driver for that) to crashcap's kernel trace
// records: kernels, copies, memsets, runtime and driver API calls with their return codes,
// the kernel -> ATen op link through external correlation, long and mangled names, drops.
#include <catch2/catch.hpp>

#include <cupti.h>

#include <cstring>
#include <vector>

#include "crashcap/cupti/activity_collector.hpp"
#include "crashcap/cupti/tracer.hpp"
#include "crashcap/formats/records.hpp"

using namespace crashcap;
using Kind = formats::TraceActivityData::Kind;

/// A CUPTI activity buffer built by hand: records back to back, each 8-byte aligned, the way
/// CUPTI fills the buffers it hands to the completion callback.
struct Buffer {
  alignas(8) uint8_t bytes[1 << 16] = {};
  size_t used = 0;
  template <typename Record>
  Record& add() {
    used = (used + 7) & ~size_t(7);
    auto* r = new (bytes + used) Record{};
    used += sizeof(Record);
    return *r;
  }
};

TEST_CASE("CUPTI buffers: kernels, copies, memsets and API calls become trace activities", "[cupti]") {
  static Buffer buf;  // large: not on the stack
  buf = Buffer{};
  const std::string mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEviT0_T1_";
  auto& api = buf.add<CUpti_ActivityAPI>();
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
  api.start = 1000;
  api.end = 1400;
  api.correlationId = 7;
  api.threadId = 4242;
  api.returnValue = 0;
  auto& k = buf.add<CUpti_ActivityKernel10>();
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.name = mangled.c_str();
  k.start = 2000;
  k.end = 2600;
  k.deviceId = 0;
  k.streamId = 13;
  k.correlationId = 7;
  k.gridX = 120, k.gridY = 1, k.gridZ = 1;
  k.blockX = 128, k.blockY = 1, k.blockZ = 1;
  auto& m = buf.add<CUpti_ActivityMemcpy6>();
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  m.bytes = 1 << 20;
  m.start = 3000;
  m.end = 3500;
  m.streamId = 7;
  m.correlationId = 8;
  auto& s = buf.add<CUpti_ActivityMemset4>();
  s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  s.value = 0;
  s.bytes = 4096;
  s.start = 3600;
  s.end = 3700;
  s.correlationId = 9;
  auto& bad = buf.add<CUpti_ActivityAPI>();
  bad.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  bad.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020;
  bad.start = 4000;
  bad.end = 4100;
  bad.correlationId = 10;
  bad.returnValue = 715;  // cudaErrorIllegalInstruction, surfacing at the next sync
  auto& drv = buf.add<CUpti_ActivityAPI>();
  drv.kind = CUPTI_ACTIVITY_KIND_DRIVER;
  drv.cbid = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel;
  drv.start = 4200;
  drv.end = 4300;
  drv.correlationId = 11;
  drv.returnValue = 0;
  auto& over = buf.add<CUpti_ActivityOverhead3>();
  over.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
  over.overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH;
  over.start = 5000;
  over.end = 5050;
  // Record kinds crashcap does not keep are walked over, not misread.
  auto& marker = buf.add<CUpti_ActivityName>();
  marker.kind = CUPTI_ACTIVITY_KIND_NAME;

  cupti::ActivityCollector collector(64);
  collector.addBuffer(buf.bytes, buf.used, /*dropped=*/3);
  formats::KernelTraceData t;
  collector.fill(t);
  REQUIRE(t.activities.size() == 7);
  CHECK(t.totalActivities == 7);
  CHECK(t.droppedActivities == 3);

  const auto& launch = t.activities[0];
  CHECK(launch.kind == Kind::Runtime);
  CHECK(launch.name == "cudaLaunchKernel");  // the CUPTI callback name without its _v7000
  CHECK(launch.returnCode == 0);
  CHECK(launch.threadId == 4242);
  CHECK(launch.startNs == 1000);
  CHECK(launch.endNs == 1400);

  const auto& kernel = t.activities[1];
  CHECK(kernel.kind == Kind::Kernel);
  CHECK(kernel.name == mangled);  // kept as the driver gives it: the viewer demangles
  CHECK(kernel.correlationId == 7);
  CHECK(kernel.streamId == 13);
  CHECK(kernel.grid[0] == 120);
  CHECK(kernel.block[0] == 128);
  CHECK(kernel.startNs == 2000);
  CHECK(kernel.endNs == 2600);
  CHECK(kernel.opIndex == -1);  // no external correlation seen

  CHECK(t.activities[2].kind == Kind::Memcpy);
  CHECK(t.activities[2].name == "HtoD");
  CHECK(t.activities[2].bytes == (1u << 20));
  CHECK(t.activities[3].kind == Kind::Memset);
  CHECK(t.activities[3].bytes == 4096);

  CHECK(t.activities[4].name == "cudaDeviceSynchronize");
  CHECK(t.activities[4].returnCode == 715);
  CHECK(t.activities[5].kind == Kind::Driver);
  CHECK(t.activities[5].name == "cuLaunchKernel");
  CHECK(t.activities[6].kind == Kind::Overhead);
  CHECK(t.activities[6].name == "CUPTI buffer flush");
}

TEST_CASE("CUPTI buffers: external correlation links kernels to the ATen op that launched them", "[cupti]") {
  static Buffer first, second;
  first = Buffer{}, second = Buffer{};
  // The op's push arrives before its launch in one buffer...
  auto& x = first.add<CUpti_ActivityExternalCorrelation>();
  x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  x.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
  x.externalId = 412;  // the op index the recorder's observer pushed
  x.correlationId = 21;
  auto& api = first.add<CUpti_ActivityAPI>();
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000;
  api.correlationId = 21;
  // ... a correlation of another tool's kind is not ours ...
  auto& other = first.add<CUpti_ActivityExternalCorrelation>();
  other.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  other.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1;
  other.externalId = 9999;
  other.correlationId = 22;
  // ... and the kernels come later, in the next buffer, in any order.
  auto& k2 = second.add<CUpti_ActivityKernel10>();
  k2.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k2.name = "other_tool_kernel";
  k2.correlationId = 22;
  auto& k1 = second.add<CUpti_ActivityKernel10>();
  k1.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k1.name = "_Z17nll_loss_forwardPfPKlii";
  k1.correlationId = 21;

  cupti::ActivityCollector collector;
  collector.addBuffer(first.bytes, first.used);
  collector.addBuffer(second.bytes, second.used);
  formats::KernelTraceData t;
  collector.fill(t);
  REQUIRE(t.activities.size() == 3);  // the correlation records are links, not activities
  CHECK(t.activities[0].opIndex == 412);  // the launch call
  CHECK(t.activities[1].opIndex == -1);   // CUSTOM1 is not crashcap's
  CHECK(t.activities[2].name == "_Z17nll_loss_forwardPfPKlii");
  CHECK(t.activities[2].opIndex == 412);

  // The link survives the record round trip.
  t.status = "recorded";
  auto back = formats::decodeKernelTrace(formats::encodeMeta(t));
  CHECK(back.activities[2].opIndex == 412);
  CHECK(back.activities[2].name == "_Z17nll_loss_forwardPfPKlii");
}

TEST_CASE("CUPTI buffers: long names are kept to 4 KiB and counted; the ring keeps the newest", "[cupti]") {
  static Buffer buf;
  buf = Buffer{};
  std::string longName = "_ZN7cutlass6KernelI" + std::string(2980, 'x') + "EEvNT_6ParamsE";  // ~3000: kept whole
  std::string hugeName = "_Z" + std::string(6000, 'y');                                     // cut
  for (int i = 0; i < 10; ++i) {
    auto& k = buf.add<CUpti_ActivityKernel10>();
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.name = i == 8 ? longName.c_str() : i == 9 ? hugeName.c_str() : "small_kernel";
    k.correlationId = static_cast<uint32_t>(100 + i);
  }
  cupti::ActivityCollector collector(4);  // a ring of the last four
  collector.addBuffer(buf.bytes, buf.used, 0);
  formats::KernelTraceData t;
  collector.fill(t);
  CHECK(t.totalActivities == 10);
  REQUIRE(t.activities.size() == 4);
  CHECK(t.activities.front().correlationId == 106);
  CHECK(t.activities[2].name == longName);
  CHECK(t.activities[3].name.size() == formats::kMaxTraceNameBytes);
  CHECK(t.activities[3].name == hugeName.substr(0, formats::kMaxTraceNameBytes));
  CHECK(t.truncatedNames == 1);

  t.status = "recorded";
  auto back = formats::decodeKernelTrace(formats::encodeMeta(t));
  CHECK(back.activities[2].name == longName);
  CHECK(back.truncatedNames == 1);
}

TEST_CASE("kernel trace records: a trace too large for one record keeps its newest entries and counts the rest",
          "[cupti]") {
  formats::KernelTraceData t;
  t.status = "recorded";
  for (uint32_t i = 0; i < 20000; ++i) {
    formats::TraceActivityData a;
    a.name = "kernel_" + std::to_string(i) + std::string(200, 'k');  // every name distinct
    a.correlationId = i;
    t.activities.push_back(a);
  }
  t.totalActivities = 20000;
  auto meta = formats::encodeMeta(t);
  CHECK(meta.size() <= formats::kMaxMetaBytes);
  auto back = formats::decodeKernelTrace(meta);
  REQUIRE(!back.activities.empty());
  CHECK(back.activities.size() < 20000);
  CHECK(back.activities.back().correlationId == 19999);  // the newest stay
  CHECK(back.droppedActivities == 20000 - back.activities.size());
}

TEST_CASE("the tracer on a machine without a GPU: unavailable, with the reason, and no cost", "[cupti]") {
  if (cupti::gpuUnavailableReason().empty()) {
    WARN("this machine has a GPU: the unavailable path is not what runs here (./dev gpu-check covers it)");
    return;
  }
  auto tracer = cupti::startTracer();
  CHECK(!tracer->available());
  CHECK(tracer->status() == "unavailable: " + cupti::gpuUnavailableReason());
  CHECK(cupti::startTracer() == tracer);  // one per process
  cupti::pushOp(5);  // the op observer's calls do nothing without a tracer
  cupti::popOp();
  auto t = tracer->snapshot();
  CHECK(t.status == tracer->status());
  CHECK(t.activities.empty());
  CHECK(t.launches.empty());
  CHECK(!t.firstError);
}
