// The child-process boundary: what an experiment prints with --json reads back as the same
// struct, non-finite numbers included, and a result with a missing key is an error naming it.
// LibTorch first: its glog CHECK gives way to Catch's.
#include "crashcap/replayer/program_replay.hpp"

#include <catch2/catch.hpp>

#include <cmath>

#include "crashcap/formats/error.hpp"
#include "crashcap/investigate/results_json.hpp"

using namespace crashcap;
using namespace crashcap::investigate;
using nlohmann::json;

namespace {

replayer::ReplayResult sampleReplay() {
  replayer::ReplayResult r;
  r.verdict = replayer::Verdict::Reproduced;
  r.step = 6;
  r.keyframe = 4;
  r.error = "Traceback...\nTarget 10 is out of bounds.";
  r.recordedError = r.error;
  r.divergedAt = 5;
  replayer::ProbedOp op;
  op.name = "aten::div";
  op.phase = "backward";
  op.seq = 42;
  op.index = 17;
  op.began = 9;
  replayer::ValueStats v;
  v.dtype = "float32";
  v.shape = {8, 1};
  v.nanCount = 3;
  v.min = -1.5;
  v.max = INFINITY;
  op.inputs = {v};
  op.outputs = {v, v};
  r.firstNonFiniteOp = op;
  r.firstNonFiniteOp->afterGivenInfinity = true;
  r.firstNonFiniteOp->unalignable = {{3, 7, 9, 8}};
  r.firstNonFiniteOp->emptyMean = replayer::EmptyMean{false, 16, 10, -100, ""};
  r.firstNonFiniteOp->node = "SqrtBackward0";
  op.name = "aten::nll_loss";
  op.outputs.clear();
  r.raisingOp = op;
  r.raisingOp->emptyMean = replayer::EmptyMean{true, 0, 0, std::nullopt, "aten::mse_loss"};
  for (int64_t s = 4; s <= 6; ++s) {
    replayer::StepReplay sr;
    sr.step = s;
    sr.loss = s == 6 ? NAN : 0.25 * s;
    sr.hasLoss = s != 5;  // step 5 raised before its loss
    sr.hasGradNorm = s < 6;
    sr.gradNorm = 1.5;
    sr.recorded = s != 5;
    sr.recordedLoss = sr.loss;
    sr.recordedGradNorm = -INFINITY;
    sr.bitwise = s == 4;
    sr.learningRate = 0.1;
    if (s < 6) sr.weightNorm = 3.0 * s;
    sr.weightsFinite = s != 5;
    sr.error = s == 6 ? "boom" : "";
    r.steps.push_back(sr);
  }
  r.batchSize = 8;
  r.rows = {0, 3};
  r.loadMs = 12.5;
  r.replayMs = 40;
  r.threads = 2;
  r.device = "cpu";
  r.recordedDevice = "cuda:0";
  r.dtype = "as-recorded";
  r.settings = {{"cudnn.benchmark", "false"}};
  r.recordedSettings = {{"cudnn.benchmark", "true"}};
  r.sameSetup = false;
  return r;
}

bool sameBits(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

}  // namespace

TEST_CASE("a replay result reads back from its JSON, NaN and infinities included", "[investigate][json]") {
  auto r = sampleReplay();
  auto j = toJson(r);
  CHECK(j["verdict"] == "reproduced");
  CHECK(j["steps"][2]["loss"] == "nan");
  auto back = replayResultFromJson(json::parse(j.dump()));
  CHECK(back.verdict == r.verdict);
  CHECK(back.step == 6);
  CHECK(back.keyframe == 4);
  CHECK(back.error == r.error);
  CHECK(back.divergedAt == 5);
  REQUIRE(back.firstNonFiniteOp);
  CHECK(back.firstNonFiniteOp->name == "aten::div");
  CHECK(back.firstNonFiniteOp->seq == 42);
  CHECK(back.firstNonFiniteOp->began == 9);
  CHECK(back.firstNonFiniteOp->outputs.size() == 2);
  CHECK(std::isinf(*back.firstNonFiniteOp->inputs[0].max));
  CHECK(back.firstNonFiniteOp->afterGivenInfinity);
  REQUIRE(back.firstNonFiniteOp->unalignable.size() == 1);
  REQUIRE(back.firstNonFiniteOp->emptyMean);
  CHECK(back.firstNonFiniteOp->emptyMean->targets == 16);
  CHECK(back.firstNonFiniteOp->emptyMean->ignored == 10);
  CHECK(back.firstNonFiniteOp->emptyMean->ignoreIndex == -100);
  CHECK(back.firstNonFiniteOp->emptyMean->of.empty());
  CHECK(back.firstNonFiniteOp->node == "SqrtBackward0");
  CHECK(back.raisingOp->node.empty());  // a forward op has none (null in the JSON)
  CHECK(j["raising_op"]["node"].is_null());
  CHECK(j["first_nonfinite_op"]["node"] == "SqrtBackward0");
  REQUIRE(back.raisingOp->emptyMean);
  CHECK(back.raisingOp->emptyMean->empty);
  CHECK_FALSE(back.raisingOp->emptyMean->ignoreIndex);
  CHECK(back.raisingOp->emptyMean->of == "aten::mse_loss");
  CHECK(back.firstNonFiniteOp->unalignable[0].element == 3);
  CHECK(back.firstNonFiniteOp->unalignable[0].targetLength == 7);
  CHECK(back.firstNonFiniteOp->unalignable[0].framesNeeded == 9);
  CHECK(back.firstNonFiniteOp->unalignable[0].inputLength == 8);
  REQUIRE(back.raisingOp);
  CHECK_FALSE(back.raisingOp->afterGivenInfinity);
  CHECK(back.raisingOp->name == "aten::nll_loss");
  CHECK(back.raisingOp->outputs.empty());
  CHECK(j["steps"][1]["loss"].is_null());
  REQUIRE(back.steps.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    INFO("step " << r.steps[i].step);
    if (r.steps[i].hasLoss) CHECK(sameBits(back.steps[i].loss, r.steps[i].loss));
    CHECK(back.steps[i].hasGradNorm == r.steps[i].hasGradNorm);
    CHECK(back.steps[i].hasLoss == r.steps[i].hasLoss);
    CHECK(back.steps[i].recorded == r.steps[i].recorded);
    CHECK(back.steps[i].bitwise == r.steps[i].bitwise);
    CHECK(back.steps[i].weightNorm == r.steps[i].weightNorm);
    CHECK(back.steps[i].weightsFinite == r.steps[i].weightsFinite);
    CHECK(back.steps[i].error == r.steps[i].error);
  }
  CHECK(std::isinf(back.steps[0].recordedGradNorm));
  CHECK(back.rows == std::vector<int64_t>{0, 3});
  CHECK(back.settings == r.settings);
  CHECK(back.recordedSettings == r.recordedSettings);
  CHECK(back.sameSetup == false);
  CHECK(back.recordedDevice == "cuda:0");
  CHECK_FALSE(back.skippedKeyframe);
  CHECK(j["skipped_keyframe"].is_null());
}

TEST_CASE("a replay that skipped a newer keyframe names it and where its replay departed, in JSON and back",
          "[investigate][json]") {
  auto r = sampleReplay();
  r.keyframe = 0;
  r.skippedKeyframe = replayer::ReplayResult::SkippedKeyframe{60, 61};
  auto j = toJson(r);
  CHECK(j["skipped_keyframe"] == json({{"step", 60}, {"diverged_at", 61}}));
  auto back = replayResultFromJson(json::parse(j.dump()));
  REQUIRE(back.skippedKeyframe);
  CHECK(back.skippedKeyframe->step == 60);
  CHECK(back.skippedKeyframe->divergedAt == 61);
  CHECK(back.keyframe == 0);
  j.erase("skipped_keyframe");  // a replay's JSON from before it existed
  CHECK_FALSE(replayResultFromJson(j).skippedKeyframe);
}

TEST_CASE("sample, config, step and op bisections read back from their JSON", "[investigate][json]") {
  SampleBisection s;
  s.step = 6;
  s.batchSize = 8;
  s.reproduced = true;
  s.rows = {3, 5};
  s.triggers = {5};
  s.datasetIndices = std::vector<int64_t>{51};
  s.replays = 7;
  s.replayBound = 8;
  s.trials.push_back({{0, 1, 2, 3}, Trial{true, "fails (boom)", 1.5, "crashcap replay B --step 6 --rows 0,1,2,3"}});
  s.trials.push_back({{0, 1, 2, 3, 4, 6, 7}, Trial{false, "passes", 1.2, "crashcap replay B --step 6 --rows 0,1,2,3,4,6,7", true}});
  auto sb = sampleBisectionFromJson(toJson(s));
  CHECK(sb.rows == s.rows);
  CHECK(sb.triggers == s.triggers);
  CHECK(sb.culprits() == std::vector<int64_t>{5});
  CHECK(sb.datasetIndices == s.datasetIndices);
  CHECK(sb.replays == 7);
  REQUIRE(sb.trials.size() == 2);
  CHECK(sb.trials[0].first == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(sb.trials[0].second.outcome == "fails (boom)");
  CHECK(!sb.trials[0].second.passes);
  CHECK(sb.trials[1].second.passes);
  CHECK(sb.cutsFail.empty());

  // A batch no part of which can run: each experiment's other error, and the search's.
  s.cutsFail = "RuntimeError: Expected hidden size (1, 4, 16), got [1, 8, 16]";
  s.trials[0].second = Trial{false, "fails another way (...): counted as a pass", 1.0, "crashcap replay B", false,
                             "RuntimeError: Expected hidden size (1, 4, 16), got [1, 8, 16]"};
  auto cut = sampleBisectionFromJson(toJson(s));
  CHECK(cut.cutsFail == s.cutsFail);
  CHECK(cut.trials[0].second.otherFailure == s.cutsFail);
  CHECK(cut.trials[1].second.otherFailure.empty());
  // Results written before either was: read as none.
  auto older = toJson(s);
  older.erase("cuts_fail");
  for (auto& e : older["experiments"]) e.erase("other_failure");
  auto old = sampleBisectionFromJson(older);
  CHECK(old.cutsFail.empty());
  CHECK(old.trials[0].second.otherFailure.empty());
  // Searched again in batches of the whole size: why, read back; absent from older results.
  s.cutsFail.clear();
  s.filledBecause = "ValueError: Target size (torch.Size([32, 1])) must be the same as input size";
  CHECK(sampleBisectionFromJson(toJson(s)).filledBecause == s.filledBecause);
  CHECK(toJson(sb)["filled_because"].is_null());
  auto beforeFilling = toJson(s);
  beforeFilling.erase("filled_because");
  CHECK(sampleBisectionFromJson(beforeFilling).filledBecause.empty());

  ConfigBisection c;
  c.step = 6;
  c.baseline.device = "cpu";
  c.baseline.fails = true;
  c.baseline.settings = {{"torch.threads", "2"}};
  c.baseline.command = "crashcap replay B --json";
  ConfigTrial t;
  t.setting = "torch.threads";
  t.recorded = "2";
  t.value = "1";
  t.fails = false;
  t.outcome = "ok";
  t.command = "crashcap replay B --set torch.threads=1";
  c.flips = {t};
  ConfigTrial d;
  d.device = "cuda:0";
  d.fails = true;
  d.outcome = "child killed by signal 11";
  d.otherFailure = "step 4 throws: no kernel";
  c.devices = {d};
  c.changesOutcome = {"torch.threads=1"};
  c.notTried = {"cudnn.enabled", "cuda.matmul.allow_tf32"};
  auto cb = configBisectionFromJson(toJson(c));
  CHECK(cb.notTried == c.notTried);
  auto withoutNotTried = toJson(c);
  withoutNotTried.erase("not_tried");  // results written before it existed
  CHECK(configBisectionFromJson(withoutNotTried).notTried.empty());
  CHECK(cb.baseline.fails);
  CHECK(cb.baseline.settings == c.baseline.settings);
  REQUIRE(cb.flips.size() == 1);
  CHECK(cb.flips[0].setting == "torch.threads");
  CHECK(cb.flips[0].value == "1");
  CHECK_FALSE(cb.flips[0].fails);
  REQUIRE(cb.devices.size() == 1);
  CHECK(cb.devices[0].device == "cuda:0");
  CHECK(cb.devices[0].fails);
  CHECK(cb.devices[0].otherFailure == "step 4 throws: no kernel");
  CHECK(cb.flips[0].otherFailure.empty());
  CHECK(cb.changesOutcome == c.changesOutcome);

  StepBisection st;
  st.fromKeyframe = 0;
  st.target = 6;
  st.firstFailure = replayer::FirstFailure{5, "weights"};
  st.steps = sampleReplay().steps;
  st.replays = 3;
  auto stb = stepBisectionFromJson(toJson(st));
  CHECK(stb.replays == 3);
  REQUIRE(stb.firstFailure);
  CHECK(stb.firstFailure->step == 5);
  CHECK(stb.firstFailure->reason == "weights");
  CHECK(stb.steps.size() == 3);

  OpBisection ob;
  ob.step = 6;
  ob.replay.error = "non-finite loss at step 6: nan";
  ob.reference.error = "non-finite loss at step 6: -nan";
  ob.reference.firstNonFiniteOp = sampleReplay().firstNonFiniteOp;
  for (auto& out : ob.reference.firstNonFiniteOp->outputs) out.dtype = "Double";  // it ran widened
  ob.tolerance = 1e-3;
  auto obb = opBisectionFromJson(toJson(ob));
  CHECK(obb.failsInFloat64());
  CHECK_FALSE(obb.referenceFailedOtherwise());
  CHECK_FALSE(obb.firstDeparting);
  REQUIRE(obb.reference.firstNonFiniteOp);
  CHECK(obb.reference.firstNonFiniteOp->name == "aten::div");
  CHECK(toJson(ob)["reference_narrowed"].is_null());

  // A reference whose first non-finite op ran narrow (the step's own .float() of values past
  // float32's range) did not fail in float64, and its JSON says where it narrowed.
  auto narrowed = ob;
  auto& cast = *narrowed.reference.firstNonFiniteOp;
  cast.name = "aten::_to_copy";
  cast.inputs = {replayer::ValueStats{"Double", {4}, 0, 0, -1e300, 1e300}};
  cast.outputs = {replayer::ValueStats{"Float", {4}, 0, 2, -1, 1}};
  const auto nj = toJson(narrowed);
  CHECK(nj["fails_in_float64"] == false);
  CHECK(nj["reference_narrowed"] == nlohmann::json{{"dtype", "Float"}, {"op", "aten::_to_copy"}, {"past_range", true}});
  CHECK(opBisectionFromJson(nj).referenceNarrowsPastRange());
  // A to(other) is judged by the tensor it casts, not by `other`; an integer tensor cast past a
  // narrow float's range is the range too.
  cast.inputs.push_back(replayer::ValueStats{"Float", {4}, 1, 0, 0, 0});
  CHECK(narrowed.referenceNarrowsPastRange());
  cast.inputs = {replayer::ValueStats{"Long", {4}, 0, 0, 0, 70000}};
  cast.outputs = {replayer::ValueStats{"Half", {4}, 0, 1, 0, 1}};
  CHECK(narrowed.referenceNarrowsPastRange());
  // Not a cast: an op that ran narrow, nothing said about the range.
  cast.name = "aten::mul";
  CHECK(narrowed.referenceNarrowedTo() == "Half");
  CHECK_FALSE(narrowed.referenceNarrowsPastRange());
  // A reference that failed another way is no narrowed failure at all.
  narrowed.reference.error = "RuntimeError: mat1 and mat2 must have the same dtype";
  CHECK_FALSE(narrowed.referenceNarrowedTo());
  CHECK(toJson(narrowed)["reference_narrowed"].is_null());

  // A reference that broke on its own (a float32 tensor the step makes meets float64 weights)
  // says nothing about precision.
  ob.reference.error = "RuntimeError: expected scalar type Double but found Float";
  CHECK_FALSE(ob.failsInFloat64());
  CHECK(ob.referenceFailedOtherwise());
  // Nor does one that departed before the target.
  ob.reference.error = ob.replay.error;
  ob.reference.verdict = replayer::Verdict::Diverged;
  CHECK_FALSE(ob.failsInFloat64());
}

TEST_CASE("a replay request and the program's outcome read back from their JSON", "[investigate][json]") {
  replayer::ReplayRequest q;
  q.bundle = "/runs/crash.ccap";
  q.options.step = 6;
  q.options.instrument = false;
  q.options.settings = {{"torch.autocast", "true"}};
  q.options.rows = {0, 3};
  q.options.fromEarliestKeyframe = true;
  q.compare = true;
  q.tolerance = 1e-4;
  q.side = replayer::ComparisonSide::Reference;
  q.referenceOutputs = "/tmp/x/reference-outputs.pt";
  q.resultPath = "/tmp/x/result.json";
  auto qb = replayer::replayRequestFromJson(json::parse(toJson(q).dump()));
  CHECK(qb.side == replayer::ComparisonSide::Reference);
  CHECK(qb.referenceOutputs == q.referenceOutputs);
  // A request written before a program could serve one side asks for both.
  auto older = json::parse(toJson(q).dump());
  older.erase("side");
  older.erase("reference_outputs");
  CHECK(replayer::replayRequestFromJson(older).side == replayer::ComparisonSide::Both);
  auto odd = json::parse(toJson(q).dump());
  odd["side"] = "sideways";
  CHECK_THROWS_AS(replayer::replayRequestFromJson(odd), Error);
  CHECK(qb.bundle == q.bundle);
  CHECK(qb.options.step == 6);
  CHECK_FALSE(qb.options.instrument);
  CHECK(qb.options.settings == q.options.settings);
  CHECK(qb.options.rows == q.options.rows);
  CHECK(qb.options.fromEarliestKeyframe);
  CHECK(qb.compare);
  CHECK(qb.tolerance == 1e-4);
  CHECK(qb.resultPath == q.resultPath);

  replayer::ReplayOutcome replayed;
  replayed.replay = sampleReplay();
  auto rb = replayer::replayOutcomeFromJson(json::parse(toJson(replayed).dump()));
  REQUIRE(rb.replay);
  CHECK(rb.replay->step == 6);
  CHECK_FALSE(rb.comparison);
  CHECK_FALSE(rb.error);

  replayer::ReplayOutcome compared;
  compared.comparison = replayer::ReferenceComparison{};
  compared.comparison->replay = sampleReplay();
  compared.comparison->reference = sampleReplay();
  compared.comparison->opsCompared = 12;
  replayer::DepartingOp op;
  op.name = "aten::pow";
  op.phase = "forward";
  op.index = 4;
  op.error = INFINITY;
  op.elements = 2;
  compared.comparison->firstDeparting = op;
  auto cb = replayer::replayOutcomeFromJson(json::parse(toJson(compared).dump()));
  REQUIRE(cb.comparison);
  CHECK(cb.comparison->opsCompared == 12);
  REQUIRE(cb.comparison->firstDeparting);
  CHECK(cb.comparison->firstDeparting->name == "aten::pow");
  CHECK(std::isinf(cb.comparison->firstDeparting->error));

  replayer::ReplayOutcome failed;
  failed.error = Error(ErrorCode::NotFound, "step 99 is not in B", "it holds steps 0..6");
  failed.error->with("while replaying");
  auto eb = replayer::replayOutcomeFromJson(json::parse(toJson(failed).dump()));
  REQUIRE(eb.error);
  CHECK(eb.error->code() == ErrorCode::NotFound);
  CHECK(eb.error->message() == "step 99 is not in B");
  CHECK(eb.error->hint() == "it holds steps 0..6");
  CHECK(eb.error->context() == std::vector<std::string>{"while replaying"});
}

TEST_CASE("a loading crash's batch, loaded again, reads back from the replay's JSON", "[investigate][json]") {
  auto r = sampleReplay();
  CHECK(toJson(r)["batch_load"].is_null());
  CHECK_FALSE(replayResultFromJson(json::parse(toJson(r).dump())).batchLoad);
  replayer::BatchLoad load;
  load.indices = {3, 1, 7};
  load.datasetIndices = {30, 10, 70};
  load.error = "RuntimeError: stack expects each tensor to be equal size";
  replayer::LoadCulprit c;
  c.position = 2;
  c.index = 7;
  c.datasetIndex = 70;
  c.error = "RuntimeError: stack expects each tensor to be equal size";
  load.culprits = {c};
  load.culpritsBy = "collated with the rest";
  load.searched = true;
  r.batchLoad = load;
  auto j = toJson(r);
  CHECK(j["batch_load"]["culprits"][0]["dataset_index"] == 70);
  auto back = replayResultFromJson(json::parse(j.dump()));
  REQUIRE(back.batchLoad);
  CHECK(back.batchLoad->indices == load.indices);
  CHECK(back.batchLoad->datasetIndices == load.datasetIndices);
  CHECK(back.batchLoad->error == load.error);
  CHECK(back.batchLoad->culpritsBy == "collated with the rest");
  CHECK(back.batchLoad->searched);
  REQUIRE(back.batchLoad->culprits.size() == 1);
  CHECK(back.batchLoad->culprits[0].position == 2);
  CHECK(back.batchLoad->culprits[0].index == 7);
  CHECK(back.batchLoad->culprits[0].datasetIndex == 70);
  CHECK(back.batchLoad->culprits[0].error == c.error);
  // A result whose culprits are not a list is refused, naming the key.
  j["batch_load"]["culprits"] = "70";
  CHECK_THROWS_WITH(replayResultFromJson(j), Catch::Contains("culprits"));
}

TEST_CASE("the rows matched to the sampler's samples read back from a replay's and a sample bisection's JSON",
          "[investigate][json]") {
  auto r = sampleReplay();
  CHECK(toJson(r)["row_order"].is_null());
  auto none = toJson(r);
  none.erase("row_order");  // a result written before it existed
  CHECK_FALSE(replayResultFromJson(none).rowOrder);
  r.rowOrder = replayer::RowOrder{"reordered", {14, 9, 3}, ""};
  auto j = toJson(r);
  CHECK(j["row_order"]["order"] == "reordered");
  CHECK(j["row_order"]["why"].is_null());
  auto back = replayResultFromJson(json::parse(j.dump()));
  REQUIRE(back.rowOrder);
  CHECK(back.rowOrder->order == "reordered");
  CHECK(back.rowOrder->checked());
  CHECK(back.rowOrder->datasetIndices == std::vector<int64_t>{14, 9, 3});
  r.rowOrder = replayer::RowOrder{"unchecked", {}, "rows 0, 1 each match several of the samples loaded again"};
  back = replayResultFromJson(json::parse(toJson(r).dump()));
  REQUIRE(back.rowOrder);
  CHECK_FALSE(back.rowOrder->checked());
  CHECK_FALSE(back.rowOrder->matched());
  CHECK(back.rowOrder->why == r.rowOrder->why);
  r.rowOrder = replayer::RowOrder{"partial", {14, -1, -1}, "rows 1, 2 match several of the samples loaded again"};
  back = replayResultFromJson(json::parse(toJson(r).dump()));
  REQUIRE(back.rowOrder);
  CHECK(back.rowOrder->matched());
  CHECK(back.rowOrder->datasetIndices == std::vector<int64_t>{14, -1, -1});
  // An order that is none of the three is refused, naming the key.
  j["row_order"]["order"] = "sorted";
  CHECK_THROWS_WITH(replayResultFromJson(j), Catch::Contains("order"));

  SampleBisection s;
  s.step = 4;
  s.batchSize = 3;
  s.reproduced = true;
  s.rows = {1};
  s.datasetIndices = std::vector<int64_t>{9};
  s.rowOrder = replayer::RowOrder{"reordered", {14, 9, 3}, ""};
  auto sb = sampleBisectionFromJson(json::parse(toJson(s).dump()));
  REQUIRE(sb.rowOrder);
  CHECK(sb.rowOrder->datasetIndices == s.rowOrder->datasetIndices);
  auto older = toJson(s);
  older.erase("row_order");
  CHECK_FALSE(sampleBisectionFromJson(older).rowOrder);
}

TEST_CASE("a result without a key it needs is an error that names the key", "[investigate][json]") {
  auto j = toJson(sampleReplay());
  j.erase("batch_size");
  try {
    replayResultFromJson(j);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Corrupt);
    CHECK_THAT(e.what(), Catch::Contains("'batch_size'"));
  }
  auto k = toJson(sampleReplay());
  k["verdict"] = "maybe";
  CHECK_THROWS_AS(replayResultFromJson(k), Error);
}

TEST_CASE("a job's replay reads back from its JSON, and an experiment reads the asked rank's replay from it",
          "[investigate][json]") {
  JobReplay job;
  job.jobId = "run-1-2-1";
  job.worldSize = 3;
  job.rank = 2;
  job.step = 6;
  job.keyframe = 4;
  job.notes = {"rank 2 kept rows [0,3] of step 6's batch; every other rank its whole batch"};
  job.ranks.push_back({0, "/runs/a.ccap", sampleReplay(), "", "reproduced", std::nullopt});
  job.ranks.push_back({1, "/runs/b.ccap", std::nullopt, "killed by SIGKILL again, as in the recording", "reproduced", std::nullopt});
  job.ranks.push_back({2, "/runs/c.ccap", sampleReplay(), "", "reproduced", std::nullopt});
  job.ranks[2].result->rows = {0, 3};
  job.ranks[1].diedInStep = 6;
  auto back = jobReplayFromJson(json::parse(toJson(job).dump()));
  CHECK(back.jobId == job.jobId);
  CHECK(back.worldSize == 3);
  CHECK(back.rank == 2);
  CHECK(back.step == 6);
  CHECK(back.keyframe == 4);
  CHECK(back.notes == job.notes);
  REQUIRE(back.ranks.size() == 3);
  CHECK(back.ranks[1].bundle == "/runs/b.ccap");
  CHECK_FALSE(back.ranks[1].result);
  CHECK(back.ranks[1].verdict == "reproduced");
  CHECK(back.ranks[1].error == job.ranks[1].error);
  CHECK(back.ranks[1].diedInStep == 6);
  CHECK_FALSE(back.ranks[0].diedInStep);
  CHECK_FALSE(back.ranks[1].stoppedInStep);
  // A rank stopped without an answer (a hang, again) says the step it was in.
  JobReplay hung = job;
  hung.ranks[1] = {1, "/runs/b.ccap", std::nullopt, "had not ended 30 s after another rank's replay ended, as in the "
                   "recording (where crashcap run stopped it in step 6): stopped again in step 6", "reproduced",
                   std::nullopt, 6};
  auto hungBack = jobReplayFromJson(json::parse(toJson(hung).dump()));
  CHECK(hungBack.ranks[1].stoppedInStep == 6);
  CHECK_FALSE(hungBack.ranks[1].diedInStep);
  REQUIRE(back.ranks[2].result);
  CHECK(back.ranks[2].result->rows == std::vector<int64_t>{0, 3});

  // The asked rank's own replay, its notes led by the job's and a line on every other rank.
  auto asked = bundleReplayFromJson(json::parse(toJson(job).dump()));
  CHECK(asked.rows == std::vector<int64_t>{0, 3});
  CHECK(asked.verdict == replayer::Verdict::Reproduced);
  REQUIRE(asked.notes.size() >= 2);
  CHECK(asked.notes[0] == job.notes[0]);
  CHECK(asked.notes[1] == "replayed with the 3 ranks of job run-1-2-1: rank 0 reproduced, rank 1 reproduced");
  // A single replay's JSON reads as it is.
  CHECK(bundleReplayFromJson(toJson(sampleReplay())).rows == std::vector<int64_t>{0, 3});

  // A rank killed again has no replay of its own: the failure, reproduced, and nothing compared.
  job.rank = 1;
  auto killed = bundleReplayFromJson(json::parse(toJson(job).dump()));
  CHECK(killed.verdict == replayer::Verdict::Reproduced);
  CHECK(killed.step == 6);
  CHECK(killed.keyframe == 4);
  CHECK(killed.error == job.ranks[1].error);
  CHECK(killed.diedInStep == 6);
  CHECK_FALSE(killed.sameSetup);
  CHECK(replayer::showsFailure(killed));

  // A rank stopped again in its hang has no replay of its own either: the hang, and the step it was
  // stopped in, which survives the ReplayResult's own JSON.
  hung.rank = 1;
  auto stopped = bundleReplayFromJson(json::parse(toJson(hung).dump()));
  CHECK(stopped.verdict == replayer::Verdict::Reproduced);
  CHECK(stopped.stoppedInStep == 6);
  CHECK_FALSE(stopped.diedInStep);
  auto stoppedBack = bundleReplayFromJson(json::parse(toJson(stopped).dump()));
  CHECK(stoppedBack.stoppedInStep == 6);
  CHECK_FALSE(stoppedBack.diedInStep);
  CHECK_FALSE(killed.stoppedInStep);

  // A rank that gave nothing is no replay: an error with its reason.
  job.ranks[1].verdict = "";
  job.ranks[1].error = "rank 1 had not ended 30 s after another rank's replay ended";
  try {
    bundleReplayFromJson(json::parse(toJson(job).dump()));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Unsupported);
    CHECK_THAT(e.what(), Catch::Contains("rank 1's replay within its job gave no result: rank 1 had not ended"));
  }
  auto j = toJson(job);
  j.erase("rank");
  CHECK_THROWS_AS(jobReplayFromJson(j), Error);
}
