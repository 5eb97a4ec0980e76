// The recorder's record kinds: round trips through a real bundle, decoders that refuse metas
// breaking their invariants, and the record table (record_types.def) handled everywhere.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

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
  StepBeginData begin{7, {"steps/7/batch/image"}, {"steps/7/rng/cpu"}, {0.25}, 123, 5, 6};
  StepEndData end{7, std::nan(""), 3.5, true, true, 999};
  end.gradNormMethod = GradNormMethod::Blocked;
  end.updateLearningRates = {0.5};
  KeyframeData kf{5, {"keyframes/5/parameters/w"}, {}, {"keyframes/5/optimizer/w/exp_avg"}, {{"w/step", 5}}};
  OpTraceData ops{{{41, "aten::div", "forward", 17, 7, 1234, {{"float32", {8, 1}}, {"scalar", {}}}}}, 42, 256};
  ops.collectives.push_back({11, "gloo:all_reduce", 7, 1235, {{"float32", {4096}}}, 100, 0});
  ops.totalCollectives = 12;
  CrashData crash{"nonfinite", 7, "forward", "non-finite loss", "NonFiniteError", 0, "", {"#0 f", "#1 g"}, 5, 42, 43};
  crash.loadingIndices = {4, 0, 9};
  crash.loadingDatasetIndices = {40, 10, 90};
  RunStatusData status{"crashed", 8, 7, 2, 100, {"queue full"}, 1, {3, 4}, 2, 1};
  status.keyframesWrittenRaw = 2;
  status.lastOp = "aten::linear";
  status.collectivesIssued = 12;
  status.lastCollective = "gloo:all_reduce";
  status.lastCollectiveStep = 6;
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
  auto v = readRecords(*reader);
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
  CHECK(v.stepBegins[0].previousStep == 6);
  REQUIRE(v.stepEnds.size() == 1);
  CHECK(std::isnan(v.stepEnds[0].loss));
  CHECK(v.stepEnds[0].nonFinite);
  CHECK(v.stepEnds[0].gradNormMethod == GradNormMethod::Blocked);
  CHECK(v.stepEnds[0].updateLearningRates == std::vector<double>{0.5});
  // The update's learning rates are the end's when it kept them, else the begin's.
  CHECK(updateLearningRates(v.stepBegins[0], &v.stepEnds[0]) == std::vector<double>{0.5});
  CHECK(updateLearningRates(v.stepBegins[0], nullptr) == std::vector<double>{0.25});
  StepEndData unchanged;
  CHECK(updateLearningRates(v.stepBegins[0], &unchanged) == std::vector<double>{0.25});
  REQUIRE(v.keyframes.size() == 1);
  CHECK(v.keyframes[0].optimizerScalars.at(0).second == 5);
  REQUIRE(v.opTrace);
  CHECK(v.opTrace->ops.at(0).name == "aten::div");
  CHECK(v.opTrace->ops.at(0).inputs.at(0).shape == std::vector<int64_t>{8, 1});
  REQUIRE(v.opTrace->collectives.size() == 1);
  CHECK(v.opTrace->collectives[0].seq == 11);
  CHECK(v.opTrace->collectives[0].name == "gloo:all_reduce");
  CHECK(v.opTrace->collectives[0].step == 7);
  CHECK(v.opTrace->collectives[0].inputs.at(0).shape == std::vector<int64_t>{4096});
  CHECK(v.opTrace->collectives[0].startNs == 100);
  CHECK(v.opTrace->collectives[0].endNs == 0);  // still waiting when the trace was taken
  CHECK(v.opTrace->totalCollectives == 12);
  REQUIRE(v.crash);
  CHECK(v.crash->stack.size() == 2);
  CHECK(v.crash->thread == 43);
  CHECK(v.crash->loadingIndices == std::vector<int64_t>{4, 0, 9});
  CHECK(v.crash->loadingDatasetIndices == std::vector<int64_t>{40, 10, 90});
  REQUIRE(v.status);
  CHECK(v.status->warnings == std::vector<std::string>{"queue full"});
  CHECK(v.status->lostSteps == std::vector<int64_t>{3, 4});
  CHECK(v.status->lostStepCount == 2);
  CHECK(v.status->keyframesSkipped == 1);
  CHECK(v.status->keyframesWrittenRaw == 2);
  CHECK(v.status->lastOp == "aten::linear");
  CHECK(v.status->collectivesIssued == 12);
  CHECK(v.status->lastCollective == "gloo:all_reduce");
  CHECK(v.status->lastCollectiveStep == 6);
  if (seal) CHECK(verifyBundle(path).ok());
}

TEST_CASE("loading indices that do not pair with their dataset indices place by place are not written",
          "[formats][records]") {
  CrashData c;
  c.kind = "exception";
  c.step = 3;
  c.phase = "loading";
  c.loadingIndices = {1, 2};
  c.loadingDatasetIndices = {1};
  auto d = decodeCrash(encodeMeta(c));
  CHECK(d.loadingIndices.empty());
  CHECK(d.loadingDatasetIndices.empty());
}

TEST_CASE("an op trace keeps the index ops beyond its ring, and which ops declare an index domain",
          "[formats][records]") {
  OpTraceData trace;
  trace.capacity = 2;
  trace.totalOps = 90;
  trace.ops = {{88, "aten::add_", "backward", -1, 3, 7, {}}, {89, "aten::mul", "backward", -1, 3, 7, {}}};
  trace.indexOps = {{12, "aten::embedding", "forward", 4, 3, 7, {{"float32", {100, 32}}, {"int64", {32, 32}}}}};
  auto d = decodeOpTrace(encodeMeta(trace));
  REQUIRE(d.indexOps.size() == 1);
  CHECK(d.indexOps[0].index == 12);
  CHECK(d.indexOps[0].name == "aten::embedding");
  CHECK(d.indexOps[0].inputs[1].shape == std::vector<int64_t>{32, 32});
  CHECK(d.ops.size() == 2);
  for (const char* name : {"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag", "aten::nll_loss_nd",
                           "aten::nll_loss2d", "aten::cross_entropy_loss", "aten::gather", "aten::scatter_add_",
                           "aten::take_along_dim"})
    CHECK(declaresIndexDomain(name));
  for (const char* name : {"aten::embedding_dense_backward", "aten::nll_loss_backward", "aten::gather_backward",
                           "aten::linear", "aten::gathers", "EmbeddingBackward0", "aten::", "", "gather"})
    CHECK_FALSE(declaresIndexDomain(name));
  CHECK_FALSE(declaresIndexDomain(nullptr));
}

TEST_CASE("a crash keeps another loader's batch by its crash/batch/ names, read back as a step's batch",
          "[formats][records]") {
  CrashData c;
  c.kind = "exception";
  c.step = 9;
  c.phase = "between-steps";
  CHECK_FALSE(otherBatchBegin(decodeCrash(encodeMeta(c))));  // none kept
  CHECK(decodeCrash(encodeMeta(c)).otherLoader == -1);
  c.otherLoader = 1;
  c.otherBatch = {batchTensorName(kCrashBatchStep, "0"), batchTensorName(kCrashBatchStep, "index")};
  c.otherStructure = R"({"tuple": ["0"]})";
  c.otherRowDims = {0, 0};
  auto d = decodeCrash(encodeMeta(c));
  CHECK(d.otherLoader == 1);
  CHECK(d.otherBatch == std::vector<std::string>{"crash/batch/0", "crash/batch/index"});
  CHECK(d.otherStructure == c.otherStructure);
  CHECK(d.otherRowDims == std::vector<int8_t>{0, 0});
  auto begin = otherBatchBegin(d);
  REQUIRE(begin);
  CHECK(begin->step == kCrashBatchStep);
  CHECK(begin->batch == d.otherBatch);
  CHECK(begin->rowDims == d.otherRowDims);
  CHECK(batchTensorName(begin->step, kDatasetIndexName) == "crash/batch/index");
  // Row dimensions that do not pair with the tensors: the encoder leaves the batch out.
  c.otherRowDims = {0};
  CHECK_FALSE(otherBatchBegin(decodeCrash(encodeMeta(c))));
  // A name outside crash/batch/ is no other batch's tensor: the record is damaged.
  c.otherRowDims = {};
  c.otherBatch = {batchTensorName(9, "0")};
  CHECK_THROWS_AS(decodeCrash(encodeMeta(c)), Error);
}

TEST_CASE("recorder record decoders refuse broken invariants", "[formats][records]") {
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{-1, {}, {}, {}, 0, -1})), Error);
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {}, {}, {}, 0, 4})), Error);   // keyframe after step
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {""}, {}, {}, 0, 0})), Error);  // empty tensor name
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {}, {}, {}, 0, 0, 3})), Error);  // previous step not before it
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(StepBeginData{3, {}, {}, {}, 0, 0, -3})), Error);
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

TEST_CASE("a rank's distributed record round-trips, and the last one written holds", "[formats][records]") {
  test::TempDir dir;
  auto path = dir.file("r.ccap");
  DistributedData fromLauncher{"job-1", "crashcap run", 1, 2, -1, "", "env://127.0.0.1:29500", "environment"};
  DistributedData fromGroup{"job-1", "crashcap run", 1, 2, 1, "gloo", "env://127.0.0.1:29500", "torch.distributed"};
  {
    auto w = BundleWriter::create(path);
    writeMetaRecord(*w, fromLauncher);
    writeMetaRecord(*w, fromGroup);
    w->seal();
  }
  auto v = readRecords(*BundleReader::open(path));
  CHECK(v.problems.empty());
  REQUIRE(v.distributed);
  CHECK(v.distributed->jobId == "job-1");
  CHECK(v.distributed->jobIdSource == "crashcap run");
  CHECK(v.distributed->rank == 1);
  CHECK(v.distributed->worldSize == 2);
  CHECK(v.distributed->localRank == 1);
  CHECK(v.distributed->backend == "gloo");
  CHECK(v.distributed->rendezvous == "env://127.0.0.1:29500");
  CHECK(v.distributed->source == "torch.distributed");
  CHECK(verifyBundle(path).ok());
}

TEST_CASE("a distributed record's rank must lie in its world", "[formats][records]") {
  auto with = [](int32_t rank, int32_t world, int32_t local) {
    DistributedData d;
    d.rank = rank;
    d.worldSize = world;
    d.localRank = local;
    return encodeMeta(d);
  };
  CHECK_NOTHROW(decodeDistributed(with(3, 4, -1)));
  CHECK_NOTHROW(decodeDistributed(with(0, 1, 0)));
  CHECK_THROWS_AS(decodeDistributed(with(0, 0, -1)), Error);   // no world
  CHECK_THROWS_AS(decodeDistributed(with(4, 4, -1)), Error);   // rank past the world
  CHECK_THROWS_AS(decodeDistributed(with(-1, 4, -1)), Error);
  CHECK_THROWS_AS(decodeDistributed(with(0, 4, -2)), Error);   // local rank below "not known"
  CHECK_THROWS_AS(decodeDistributed(with(0, 4, 4)), Error);
  try {
    decodeDistributed(with(5, 2, -1));
    FAIL("accepted rank 5 of 2");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Corrupt);
    CHECK(e.message().find("rank 5 of world size 2") != std::string::npos);
  }
}

TEST_CASE("lostSteps finds what the recorder dropped inside the retained window, not what retention deleted",
          "[formats][records]") {
  auto begin = [](int64_t step, int64_t previous) { return StepBeginData{step, {}, {}, {}, 0, -1, previous}; };
  BundleRecords r;
  r.keyframes = {KeyframeData{10, {}, {}, {}, {}}, KeyframeData{14, {}, {}, {}, {}}};
  // 8 and 9 precede the earliest keyframe (retention deleted them); 12 and 14 were dropped.
  r.stepBegins = {begin(10, 9), begin(11, 10), begin(13, 12), begin(15, 14), begin(16, 15)};
  CHECK(lostSteps(r) == std::vector<int64_t>{12, 14});
  // Steps that skip numbers on purpose are not lost: previousStep says what came before.
  r.stepBegins = {begin(10, 8), begin(14, 10), begin(20, 14)};
  CHECK(lostSteps(r).empty());
  // Bundles from before previousStep existed (-2) only lose keyframe steps and listed ones.
  r.stepBegins = {begin(10, -2), begin(13, -2)};
  r.status = RunStatusData{};
  r.status->lostSteps = {17, 11};
  CHECK(lostSteps(r) == std::vector<int64_t>{11, 14, 17});
  // The step the process crashed in began, even when its records did not reach the file.
  r.crash = CrashData{};
  r.crash->step = 18;
  CHECK(lostSteps(r) == std::vector<int64_t>{11, 14, 17, 18});
  r.crash->step = 13;  // recorded: not lost
  CHECK(lostSteps(r) == std::vector<int64_t>{11, 14, 17});
}

TEST_CASE("lostSteps names the steps a killed process still had queued when its steps go one by one",
          "[formats][records]") {
  auto begin = [](int64_t step, int64_t previous) { return StepBeginData{step, {}, {}, {}, 0, -1, previous}; };
  BundleRecords r;
  r.keyframes = {KeyframeData{0, {}, {}, {}, {}}};
  r.stepBegins = {begin(0, -1), begin(1, 0)};
  // SIGKILLed in step 3 (the progress file's step and count, sealed into the run status): step
  // 2 was in the writer's queue with it.
  r.status = RunStatusData{};
  r.status->state = "interrupted";
  r.status->stepsBegun = 4;
  r.status->lastStep = 3;
  CHECK(lostSteps(r) == std::vector<int64_t>{2, 3});
  // Four steps begun, the last of them step 3, are exactly 0..3, even when none of their
  // records reached the file but the keyframe.
  r.stepBegins.clear();
  CHECK(lostSteps(r) == std::vector<int64_t>{0, 1, 2, 3});
  // Without a keyframe nothing can be replayed, and nothing is named.
  r.keyframes.clear();
  CHECK(lostSteps(r).empty());
  r.keyframes = {KeyframeData{0, {}, {}, {}, {}}};
  // A count of steps begun with no room for the gap names only the step the process was in.
  r.stepBegins = {begin(0, -1), begin(1, 0)};
  r.status->stepsBegun = 3;
  CHECK(lostSteps(r) == std::vector<int64_t>{3});
  // A recording that began at step 1000 (a resumed training): the steps go one by one, and the
  // count (begun since the recorder started) has room for 1002..1004.
  r.keyframes = {KeyframeData{1000, {}, {}, {}, {}}};
  r.stepBegins = {begin(1000, -1), begin(1001, 1000)};
  r.status->stepsBegun = 6;
  r.status->lastStep = 1005;
  CHECK(lostSteps(r) == std::vector<int64_t>{1002, 1003, 1004, 1005});
  // A training whose steps skip numbers: nothing says which of 2..9 began.
  r.keyframes = {KeyframeData{0, {}, {}, {}, {}}};
  r.status->stepsBegun = 100;
  r.status->lastStep = 10;
  r.stepBegins = {begin(0, -1), begin(1, 0), begin(3, 1)};
  CHECK(lostSteps(r) == std::vector<int64_t>{10});
  // The next step, with nothing between: only it.
  r.stepBegins = {begin(0, -1), begin(1, 0), begin(2, 1)};
  r.status->lastStep = 3;
  CHECK(lostSteps(r) == std::vector<int64_t>{3});
  // A damaged run status cannot make the list unbounded.
  r.status->lastStep = INT64_MAX;
  r.status->stepsBegun = static_cast<uint64_t>(INT64_MAX) + 1;
  CHECK(lostSteps(r).size() <= (size_t(1) << 16) + 1);
  r.status->stepsBegun = 100;
  CHECK(lostSteps(r).size() <= (size_t(1) << 16) + 1);
}

TEST_CASE("killedInStep is the step of a run status never closed, with no crash record", "[formats][records]") {
  BundleRecords r;
  CHECK_FALSE(killedInStep(r));  // no run status
  r.status = RunStatusData{};
  r.status->state = "interrupted";
  CHECK_FALSE(killedInStep(r));  // no step begun
  r.status->stepsBegun = 8;
  r.status->lastStep = 7;
  CHECK(killedInStep(r) == 7);
  r.status->state = "finished";
  CHECK_FALSE(killedInStep(r));
  r.status->state = "crashed";
  CHECK_FALSE(killedInStep(r));
  r.status->state = "interrupted";
  r.crash = CrashData{};  // the recorder said what happened
  r.crash->step = 7;
  CHECK_FALSE(killedInStep(r));
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
  auto v = readRecords(*reader);
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

namespace {

/// How many records of its type a BundleRecords member holds.
template <typename T>
size_t keptCount(const std::optional<T>& member) {
  return member ? 1 : 0;
}
template <typename T>
size_t keptCount(const std::vector<T>& member) {
  return member.size();
}

/// A meta no decoder accepts: a Cap'n Proto message (one segment of one word, a null root)
/// followed by a word that belongs to no segment.
std::vector<uint8_t> malformedMeta() {
  std::vector<uint8_t> meta(24, 0);
  meta[4] = 1;  // segment table: one segment of one word
  meta[16] = 0xab;
  return meta;
}

/// Writes a record of one recorder row's type whose meta is malformed, then two intact ones,
/// and checks that the scan, verify and readRecords all handle the type as the table says.
template <typename Data, typename Count>
void checkRecorderRow(uint16_t type, const std::string& name, KeepPolicy keep, Count count) {
  INFO("record type " << type << " (" << name << ")");
  CHECK(isRecorderRecord(type));
  CHECK(static_cast<uint16_t>(recordTypeOf(Data{})) == type);
  test::TempDir dir;
  auto path = dir.file("row.ccap");
  {
    auto w = BundleWriter::create(path);  // record #0 is the recording info
    w->writeRecord(type, malformedMeta(), nullptr, 0, false);
    writeMetaRecord(*w, Data{});
    writeMetaRecord(*w, Data{});
    w->seal();
  }
  for (bool scan : {false, true}) {
    INFO((scan ? "scanned" : "opened through the index"));
    auto reader = scan ? BundleReader::scan(path) : BundleReader::open(path);
    CHECK(reader->report().unknownTypes.empty());
    auto view = readRecords(*reader);
    CHECK(count(view) == (keep == KeepPolicy::All ? 2u : 1u));
    if (scan) {
      // The scan checks recorder metas itself, so the malformed record never reaches the view.
      REQUIRE(reader->report().damage.size() == 1);
      CHECK_THAT(reader->report().damage[0].what, Catch::Contains(name));
      CHECK(view.problems.empty());
    } else {
      CHECK(reader->report().damage.empty());
      REQUIRE(view.problems.size() == 1);
      CHECK_THAT(view.problems[0], Catch::StartsWith(name + " record #1"));
    }
  }
  auto report = verifyBundle(path);
  CHECK(report.notices.empty());
  REQUIRE(report.problems.size() == 1);
  CHECK_THAT(report.problems[0].where, Catch::Contains("record #1 (" + name + ")"));
  CHECK_THAT(report.problems[0].what, Catch::Contains("trailing bytes"));
}

}  // namespace

TEST_CASE("every type in the record table is named, checked by verify and the scan, and kept by readRecords",
          "[formats][records][table]") {
  for (const auto& row : kRecordTypes) {
    INFO("record type " << row.number);
    CHECK(recordTypeName(row.number) == row.name);
    CHECK(findRecordType(row.number) == &row);
    CHECK(isRecorderRecord(row.number) == row.recorder);
  }
  size_t recorderRows = 0;
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member)                          \
  ++recorderRows;                                                                                           \
  checkRecorderRow<Data>(number, name, KeepPolicy::keep,                                                    \
                         [](const BundleRecords& view) { return keptCount(view.member); });
#include "crashcap/formats/record_types.def"
  CHECK(recorderRows == size_t(std::count_if(std::begin(kRecordTypes), std::end(kRecordTypes),
                                             [](const RecordTypeInfo& row) { return row.recorder; })));
}

TEST_CASE("readRecords keeps the first crash and the last run status, as their table rows say",
          "[formats][records][table]") {
  test::TempDir dir;
  auto path = dir.file("twice.ccap");
  {
    auto w = BundleWriter::create(path);
    CrashData first, second;
    first.kind = "signal";
    second.kind = "exception";
    RunStatusData running, finished;
    running.state = "crashed";
    finished.state = "finished";
    writeMetaRecord(*w, first);
    writeMetaRecord(*w, running);
    writeMetaRecord(*w, second);
    writeMetaRecord(*w, finished);
    w->seal();
  }
  auto v = readRecords(*BundleReader::open(path));
  REQUIRE(v.crash);
  CHECK(v.crash->kind == "signal");
  REQUIRE(v.status);
  CHECK(v.status->state == "finished");
}

TEST_CASE("a record type one past the table is skipped and reported as a newer writer's, unless marked required",
          "[formats][records][table][evolution]") {
  uint16_t next = 0;
  for (const auto& row : kRecordTypes) next = std::max<uint16_t>(next, row.number);
  ++next;
  CHECK(findRecordType(next) == nullptr);
  CHECK(!isRecorderRecord(next));
  CHECK(recordTypeName(next) == "unknown(" + std::to_string(next) + ")");

  test::TempDir dir;
  std::vector<uint8_t> emptyMessage(16, 0);  // one segment of one word holding a null root
  emptyMessage[4] = 1;
  {
    auto w = BundleWriter::create(dir.file("newer.ccap"));
    float x[2] = {1, 2};
    w->writeTensor("x", DType::Float32, {2}, x, sizeof x);
    writeMetaRecord(*w, StepBeginData{3, {}, {}, {}, 0, -1});
    w->writeRecord(next, emptyMessage, "from a newer crashcap", 21, false);
    writeMetaRecord(*w, StepEndData{3, 0.5, 0, false, false, 10});
    w->seal();
  }
  for (bool scan : {false, true}) {
    INFO((scan ? "scanned" : "opened through the index"));
    auto reader = scan ? BundleReader::scan(dir.file("newer.ccap")) : BundleReader::open(dir.file("newer.ccap"));
    CHECK(reader->report().unknownTypes == std::map<uint16_t, uint64_t>{{next, 1}});
    CHECK(reader->report().damage.empty());
    CHECK(reader->report().complete());
    CHECK(reader->readTensor(reader->get("x")).size() == 8);
    auto v = readRecords(*reader);
    CHECK(v.problems.empty());
    CHECK(v.stepBegins.size() == 1);
    CHECK(v.stepEnds.size() == 1);
  }
  auto report = verifyBundle(dir.file("newer.ccap"));
  CHECK(report.ok());
  REQUIRE(report.notices.size() == 1);
  CHECK_THAT(report.notices[0], Catch::Contains("unknown record type " + std::to_string(next) + " skipped"));
  // recover copies it verbatim: a newer crashcap reading the copy still finds it.
  recoverBundle(dir.file("newer.ccap"), dir.file("copy.ccap"));
  CHECK(BundleReader::open(dir.file("copy.ccap"))->report().unknownTypes.at(next) == 1);

  {
    auto w = BundleWriter::create(dir.file("required.ccap"));
    w->writeRecord(next, emptyMessage, "x", 1, false, kFlagRequired);
    w->seal();
  }
  for (bool scan : {false, true}) {
    try {
      scan ? BundleReader::scan(dir.file("required.ccap")) : BundleReader::open(dir.file("required.ccap"));
      FAIL("a required record of an unknown type was not refused");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::IncompatibleVersion);
      CHECK_THAT(e.message(), Catch::Contains("type " + std::to_string(next)));
    }
  }
  auto required = verifyBundle(dir.file("required.ccap"));
  REQUIRE(required.problems.size() == 1);
  CHECK_THAT(required.problems[0].what, Catch::Contains("marked required"));
}

TEST_CASE("a batch's rows are found in each tensor's sample dimension, and older bundles fall back to dimension 0",
          "[formats][records]") {
  using Shapes = std::vector<std::vector<int64_t>>;
  // A sequence-first batch: tokens (time 30, batch 8), lengths (8), labels (8), a scalar.
  const Shapes shapes{{30, 8}, {8}, {8}, {}};
  CHECK(rowDimensions(shapes, 8) == std::vector<int8_t>{1, 0, 0, -1});
  // Without the loader's count: dimension 0 of the first tensor, as bundles always read it.
  CHECK(rowDimensions(shapes, -1) == std::vector<int8_t>{0, -1, -1, -1});
  CHECK(rowDimensions({{8, 3, 32, 32}, {8}, {5, 5}}, -1) == std::vector<int8_t>{0, 0, -1});
  // A [1, N] tensor is one broadcast row (position ids), not N samples of one time step.
  CHECK(rowDimensions({{30, 8}, {1, 8}, {8}}, 8) == std::vector<int8_t>{1, -1, 0});
  // Dimension 0 first when both would fit (a square batch), and never a third dimension.
  CHECK(rowDimensions({{8, 8}, {2, 3, 8}}, 8) == std::vector<int8_t>{0, -1});
  // In doubt, the tensor's row dimension at an earlier step decides: tokens whose 8 time steps
  // happen to be the batch's 8 samples stay sequence-first.
  CHECK(rowDimensionInDoubt({8, 8}, 8));
  CHECK_FALSE(rowDimensionInDoubt({30, 8}, 8));
  CHECK(rowDimensions({{8, 8}, {8}}, 8, {1, 0}) == std::vector<int8_t>{1, 0});
  CHECK(rowDimensions({{8, 8}, {8}}, 8, {-1, 0}) == std::vector<int8_t>{0, 0});
  CHECK(rowDimensions({{30, 8}, {8}}, 8, {0, 0}) == std::vector<int8_t>{1, 0});  // not in doubt: the shape says

  StepBeginData begin{4, {"steps/4/batch/0", "steps/4/batch/1", "steps/4/batch/2", "steps/4/batch/3"}, {}, {}, 0, 0};
  begin.rowDims = rowDimensions(shapes, 8);
  auto decoded = decodeStepBegin(encodeMeta(begin));
  CHECK(decoded.rowDims == begin.rowDims);
  auto rows = batchRows(decoded, shapes);
  CHECK(rows.count == 8);
  CHECK(rows.dims == std::vector<int>{1, 0, 0, -1});
  // A bundle written before row dimensions: the first tensor's dimension 0 is the batch.
  decoded.rowDims.clear();
  rows = batchRows(decoded, shapes);
  CHECK(rows.count == 30);
  CHECK(rows.dims == std::vector<int>{0, -1, -1, -1});
  // A row dimension past a tensor's shape (a damaged record) is no row dimension.
  decoded.rowDims = {3, 0, 0, -1};
  rows = batchRows(decoded, shapes);
  CHECK(rows.count == 8);
  CHECK(rows.dims == std::vector<int>{-1, 0, 0, -1});

  // As many row dimensions as batch tensors, each -1 or more; none at all is an older writer.
  begin.rowDims = {1, 0};
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(begin)), Error);
  begin.rowDims = {1, 0, 0, -2};
  CHECK_THROWS_AS(decodeStepBegin(encodeMeta(begin)), Error);
  begin.rowDims.clear();
  CHECK(decodeStepBegin(encodeMeta(begin)).rowDims.empty());
}

TEST_CASE("the step a process failed in is the crash's or the killed one's, when its phase lies in a step",
          "[formats][records]") {
  CHECK(phaseInStep("forward"));
  CHECK(phaseInStep("backward"));
  CHECK(phaseInStep("optimizer"));
  CHECK(phaseInStep(""));  // a recording from before phases were kept
  CHECK_FALSE(phaseInStep("setup"));
  CHECK_FALSE(phaseInStep("between-steps"));
  CHECK_FALSE(phaseInStep("loading"));
  CHECK(std::string(stepPreposition("backward")) == "at");
  CHECK(std::string(stepPreposition("")) == "at");
  CHECK(std::string(stepPreposition("between-steps")) == "after");
  CHECK(std::string(stepPreposition("loading")) == "after");

  BundleRecords r;
  CHECK_FALSE(failedInStep(r));  // nothing failed
  auto crashIn = [](const std::string& phase) {
    CrashData c;
    c.kind = "exception";
    c.step = 3;
    c.phase = phase;
    return c;
  };
  auto killedIn = [](const std::string& phase) {
    RunStatusData s;
    s.state = "interrupted";
    s.stepsBegun = 4;
    s.lastStep = 3;
    s.lastPhase = phase;
    return s;
  };
  r.crash = crashIn("backward");
  CHECK(failedInStep(r) == 3);
  r.crash = crashIn("loading");
  CHECK_FALSE(failedInStep(r));
  r.crash = crashIn("forward");
  r.crash->step = -1;  // before the first step
  CHECK_FALSE(failedInStep(r));
  r.crash.reset();
  r.status = killedIn("forward");
  CHECK(failedInStep(r) == 3);
  r.status = killedIn("between-steps");
  CHECK_FALSE(failedInStep(r));
  r.status->state = "finished";
  r.status->lastPhase = "forward";
  CHECK_FALSE(failedInStep(r));  // a run that ended cleanly failed nowhere
}
