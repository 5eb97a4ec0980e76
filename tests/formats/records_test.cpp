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
