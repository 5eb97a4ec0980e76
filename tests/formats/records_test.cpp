// The recorder's record kinds: round trips through a real bundle, and decoders that refuse
// metas breaking their invariants.
#include <catch2/catch.hpp>

#include <cmath>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;

TEST_CASE("recorder records round-trip through a bundle, sealed and unsealed", "[formats][records]") {
  test::TempDir dir;
  auto path = dir.file("r.ccap");
  StepProgramData program{"torchscript", {"image", "label"}, {"w", "b"}, {"bn.running_mean"}, "program/ts", "cpu"};
  OptimizerSpecData spec{"adam", {{{"w", "b"}, {{"lr", 1e-3}, {"beta1", 0.9}}}}, 1.5, 2};
  StepBeginData begin{7, {"steps/7/batch/image"}, {"steps/7/rng/cpu"}, {0.25}, 123, 5};
  StepEndData end{7, std::nan(""), 3.5, true, true, 999};
  KeyframeData kf{5, {"keyframes/5/parameters/w"}, {}, {"keyframes/5/optimizer/w/exp_avg"}, {{"w/step", 5}}};
  OpTraceData ops{{{41, "aten::div", "forward", 17, 7, 1234, {{"float32", {8, 1}}, {"scalar", {}}}}}, 42, 256};
  CrashData crash{"nonfinite", 7, "forward", "non-finite loss", "NonFiniteError", 0, "", {"#0 f", "#1 g"}, 5, 42, 43};
  RunStatusData status{"crashed", 8, 7, 2, 100, {"queue full"}, 1};
  bool seal = GENERATE(true, false);
  {
    auto w = BundleWriter::create(path);
    writeMetaRecord(*w, program);
    writeMetaRecord(*w, spec);
    writeMetaRecord(*w, kf);
    writeMetaRecord(*w, begin);
    writeMetaRecord(*w, end);
    writeMetaRecord(*w, ops);
    writeMetaRecord(*w, crash);
    writeMetaRecord(*w, status);
    if (seal) w->seal();
  }
  auto reader = BundleReader::open(path);
  CHECK(reader->report().unknownTypes.empty());
  auto v = readRecording(*reader);
  CHECK(v.problems.empty());
  REQUIRE(v.program);
  CHECK(v.program->inputs == program.inputs);
  CHECK(v.program->buffers == program.buffers);
  CHECK(v.program->archive == "program/ts");
  REQUIRE(v.optimizer);
  CHECK(v.optimizer->kind == "adam");
  CHECK(v.optimizer->groups.at(0).option("beta1", 0) == 0.9);
  CHECK(v.optimizer->gradClipNorm == 1.5);
  REQUIRE(v.stepBegins.size() == 1);
  CHECK(v.stepBegins[0].keyframe == 5);
  CHECK(v.stepBegins[0].learningRates == std::vector<double>{0.25});
  REQUIRE(v.stepEnds.size() == 1);
  CHECK(std::isnan(v.stepEnds[0].loss));
  CHECK(v.stepEnds[0].nonFinite);
  REQUIRE(v.keyframes.size() == 1);
  CHECK(v.keyframes[0].optimizerScalars.at(0).second == 5);
  REQUIRE(v.opTrace);
  CHECK(v.opTrace->ops.at(0).name == "aten::div");
  CHECK(v.opTrace->ops.at(0).inputs.at(0).shape == std::vector<int64_t>{8, 1});
  REQUIRE(v.crash);
  CHECK(v.crash->stack.size() == 2);
  CHECK(v.crash->thread == 43);
  REQUIRE(v.status);
  CHECK(v.status->warnings == std::vector<std::string>{"queue full"});
  if (seal) CHECK(verifyBundle(path).ok());
}

TEST_CASE("recorder record decoders refuse broken invariants", "[formats][records]") {
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{-1, {}, {}, {}, 0, -1})), Error);
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {}, {}, {}, 0, 4})), Error);   // keyframe after step
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {""}, {}, {}, 0, 0})), Error);  // empty tensor name
  CHECK_THROWS_AS(decodeKeyframe(encodeMeta(KeyframeData{-5, {}, {}, {}, {}})), Error);
  CHECK_THROWS_AS(decodeOptimizerSpec(encodeMeta(OptimizerSpecData{"sgd", {}, -1, 2})), Error);
  CHECK_THROWS_AS(decodeCrash({1, 2, 3}), Error);  // not a Cap'n Proto message
  try {
    decodeStepEnd(encodeMeta(StepEndData{-2, 0, 0, false, false, 0}));
    FAIL("accepted a negative step");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Corrupt);
    CHECK(e.message().find("step -2") != std::string::npos);
  }
}

TEST_CASE("a damaged recorder record is reported and the rest still reads", "[formats][records]") {
  test::TempDir dir;
  auto path = dir.file("d.ccap");
  {
    auto w = BundleWriter::create(path);
    writeMetaRecord(*w, StepBeginData{1, {}, {}, {}, 0, -1});
    // A step_end whose meta is well-formed Cap'n Proto but breaks an invariant.
    w->writeRecord(static_cast<uint16_t>(RecordType::StepEnd), encodeMeta(StepBeginData{-3, {}, {}, {}, 0, -1}),
                   nullptr, 0, false);
    writeMetaRecord(*w, StepBeginData{2, {}, {}, {}, 0, -1});
  }
  auto reader = BundleReader::open(path);
  CHECK(reader->report().damage.size() == 1);  // the scan validates recorder metas
  auto v = readRecording(*reader);
  CHECK(v.stepBegins.size() == 2);
}

TEST_CASE("kernel trace names that would decode past the limit are trimmed by writers and refused by readers",
          "[formats][records][limits]") {
  // Each entry copies its name out of the record's string table: 12,000 launches naming one
  // 4 KiB kernel and one 4 KiB API fit in a 1 MiB meta but decode to ~98 MB.
  KernelTraceData t;
  t.status = "recorded";
  const std::string symbol = "_Z" + std::string(kMaxTraceNameBytes - 2, 'k'), api = std::string(kMaxTraceNameBytes, 'a');
  for (uint64_t i = 0; i < 12000; ++i) {
    KernelLaunchData l;
    l.index = i;
    l.symbol = symbol;
    l.api = api;
    t.launches.push_back(l);
  }
  t.totalLaunches = 12000;
  auto meta = encodeMeta(t);
  CHECK(meta.size() <= kMaxMetaBytes);
  auto back = decodeKernelTrace(meta);
  REQUIRE(!back.launches.empty());
  CHECK(back.launches.size() < 12000);
  CHECK(back.launches.size() * 2 * kMaxTraceNameBytes <= kMaxDecodedTraceNameBytes);
  CHECK(back.launches.back().index == 11999);  // the newest stay
  CHECK(back.launches.back().symbol == symbol);

  // A reader with a tighter limit refuses the record instead of allocating past it.
  ReaderLimits tight;
  tight.maxDecodedTraceNameBytes = 1 << 20;
  try {
    decodeKernelTrace(meta, tight);
    FAIL("decoded past maxDecodedTraceNameBytes");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::LimitExceeded);
    CHECK(std::string(e.what()).find("kernel trace names decode to more than 1048576 bytes") != std::string::npos);
  }
}

TEST_CASE("a kernel trace keeps its first error and its first sticky error apart", "[formats][records]") {
  KernelTraceData t;
  t.status = "recorded";
  ApiErrorData soft{"runtime", "cudaMalloc", 2, "cudaErrorMemoryAllocation", 10, 1000, 7, "", -1};
  ApiErrorData sticky{"runtime", "cudaDeviceSynchronize", 700, "cudaErrorIllegalAddress", 55, 9000, 7, "", 12};
  t.firstError = soft;
  t.stickyError = sticky;
  auto back = decodeKernelTrace(encodeMeta(t));
  REQUIRE(back.firstError);
  CHECK(back.firstError->code == 2);
  CHECK(back.firstError->api == "cudaMalloc");
  REQUIRE(back.stickyError);
  CHECK(back.stickyError->code == 700);
  CHECK(back.stickyError->opIndex == 12);
  KernelTraceData none;
  none.status = "recorded";
  auto empty = decodeKernelTrace(encodeMeta(none));
  CHECK(!empty.firstError);
  CHECK(!empty.stickyError);
}
