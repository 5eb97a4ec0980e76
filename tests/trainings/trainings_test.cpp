// What replay, bisect and triage say about trainings that are not the samples (tests/trainings/
// trainings.cpp): each checks one class of statement that a rule tuned to the samples' models got
// wrong — an op's own values under the TorchScript interpreter, evidence that names the value
// outside the failing op's domain and never an ordinary one, a legitimate input the loss cannot
// handle, the learning-rate jump that precedes divergence, and autocast's cache in replay.
// And TorchScript's optimising graph executor (LibTorch's default) under replay.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/investigate/bisect.hpp"
#include "crashcap/replayer/replay.hpp"
#include "test_support.hpp"
#include "../investigate/triage_support.hpp"

using namespace crashcap;
using nlohmann::json;
using test::evidenceHas;
using test::hypothesis;

namespace {

/// Runs a training until it fails and returns its crash bundle.
std::string crashBundle(const test::TempDir& dir, const std::string& training, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {test::binPath("crashcap-test-trainings"), "--training", training, "--record",
                                   dir.path()};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = test::run(args, 300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  return bundles[0];
}

json triage(const std::string& bundle) {
  auto t = test::run({test::binPath("crashcap"), "triage", bundle, "--json"}, 900);
  INFO(t.err);
  REQUIRE(t.exitCode == 0);
  return json::parse(t.out);
}

bool anyEvidenceHas(const json& triage, const std::string& text) {
  for (const auto& h : triage["hypotheses"])
    if (evidenceHas(h, text)) return true;
  return false;
}

}  // namespace

TEST_CASE("an op the TorchScript interpreter calls is seen with its own arguments and results, so bisect ops names "
          "aten::pow",
          "[trainings]") {
  // tanh(h) + pow(h, 2.0): the interpreter keeps tanh's result on its stack while pow runs.
  test::TempDir dir;
  auto bundle = crashBundle(dir, "pow-overflow");

  auto r = replayer::replay(bundle);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
  REQUIRE(r.firstNonFiniteOp);
  CHECK(r.firstNonFiniteOp->name == "aten::pow");
  CHECK(r.firstNonFiniteOp->inputs.size() == 1);   // pow(Tensor self, Scalar exponent): one tensor
  CHECK(r.firstNonFiniteOp->outputs.size() == 1);
  REQUIRE(!r.firstNonFiniteOp->outputs.empty());
  CHECK(r.firstNonFiniteOp->outputs[0].infCount > 0);

  auto ops = investigate::bisectOps(bundle);
  REQUIRE(ops.firstDeparting);
  CHECK(ops.firstDeparting->name == "aten::pow");

  // The recorder's op trace keeps the same: pow's two arguments, not the interpreter's stack.
  auto reader = formats::BundleReader::open(bundle);
  auto records = formats::readRecords(*reader);
  REQUIRE(records.opTrace);
  int pows = 0;
  for (const auto& op : records.opTrace->ops)
    if (op.name == "aten::pow" && op.phase == "forward") {
      ++pows;
      REQUIRE(op.inputs.size() == 2);
      CHECK(op.inputs[0].dtype == "float32");
      CHECK(op.inputs[0].shape.size() == 2);  // pow(h, 2.0) on [8,16], the loss's square on [8,1]
      CHECK(op.inputs[1].dtype == "scalar");
    }
  CHECK(pows > 0);
}

TEST_CASE("triage names the far outlier that overflows aten::pow as invalid data", "[trainings][triage]") {
  test::TempDir dir;
  auto j = triage(crashBundle(dir, "pow-overflow"));
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "invalid-data");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "row 3 of steps/6/batch/x reaches 1e+20 in magnitude, while the batch's other rows stay within"));
  CHECK_FALSE(evidenceHas(h, "batch/y"));  // the targets are ordinary
  CHECK(hypothesis(j, "loss-numerics")["verdict"] == "refuted");
  CHECK(evidenceHas(hypothesis(j, "loss-numerics"), "the culprit rows' values carry them there"));
  CHECK(j["culprit"]["op"] == "aten::pow");
  CHECK(j["culprit"]["rows"] == json::array({3}));
}

TEST_CASE("triage names the token id outside the embedding, and no ordinary label", "[trainings][triage]") {
  test::TempDir dir;
  auto j = triage(crashBundle(dir, "embedding-oob"));
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "invalid-data");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "row 3 of steps/6/batch/tokens holds 40, outside 0..31: the embedding (aten::embedding) has 32 "
                       "rows (table [32,8])"));
  CHECK_FALSE(anyEvidenceHas(j, "batch/label"));  // the culprit row's label is 0: ordinary
  CHECK(j["culprit"]["rows"] == json::array({3}));
  CHECK(j["culprit"]["dataset_indices"] == json::array({603}));
}

TEST_CASE("triage reports rows that trigger a Dice loss's 0/0 as a legitimate input the loss cannot handle",
          "[trainings][triage]") {
  test::TempDir dir;
  auto j = triage(crashBundle(dir, "dice-valid0"));
  INFO(j.dump(2));
  const auto& data = hypothesis(j, "invalid-data");
  CHECK(data["verdict"] != "confirmed");
  CHECK(evidenceHas(data, "step 6 fails with batch row [3] alone and passes without it"));
  CHECK(evidenceHas(data, "but nothing in it was found invalid"));
  CHECK(evidenceHas(data, "row 3 of steps/6/batch/valid is all zeros, unlike the batch's other rows"));
  const auto& numerics = hypothesis(j, "loss-numerics");
  CHECK(numerics["verdict"] == "confirmed");
  CHECK(evidenceHas(numerics, "aten::div (forward, step 6) turns finite inputs into NaN/Inf"));
  CHECK(evidenceHas(numerics, "the loss cannot handle a legitimate edge case"));
  CHECK(j["culprit"]["op"] == "aten::div");
  CHECK(j["culprit"]["rows"] == json::array({3}));
}

TEST_CASE("triage reports in-range features that drive a Gaussian NLL's variance to 0 as an edge case of the loss, "
          "at aten::log",
          "[trainings][triage]") {
  test::TempDir dir;
  auto j = triage(crashBundle(dir, "gaussian-nll"));
  INFO(j.dump(2));
  CHECK(hypothesis(j, "invalid-data")["verdict"] != "confirmed");
  const auto& numerics = hypothesis(j, "loss-numerics");
  CHECK(numerics["verdict"] == "confirmed");
  CHECK(evidenceHas(numerics, "aten::log (forward, step 6) turns finite inputs into NaN/Inf"));
  CHECK(evidenceHas(numerics, "an input of aten::log reaches 0"));
  CHECK(evidenceHas(numerics, "batch row [3] triggers it with values in range"));
  CHECK(hypothesis(j, "optimizer-divergence")["verdict"] == "refuted");
  CHECK(j["culprit"]["rows"] == json::array({3}));
}

TEST_CASE("triage names the learning-rate jump before the divergence, not the warm-up, and autocast does not leak "
          "across replayed steps",
          "[trainings][triage]") {
  // Warm-up 0.002 .. 0.01 by step 4, then 100 from step 12; the loss goes non-finite at step 25.
  // Under autocast, replay without clearing the cache of cast weights ran every step on the first
  // step's weights, so the step "passed" with torch.autocast=true.
  test::TempDir dir;
  auto j = triage(crashBundle(dir, "warmup-jump", {"--steps", "40", "--fault-step", "12", "--keyframe-every", "8"}));
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "optimizer-divergence");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "the learning rate jumps from 0.01 to 100 at step 12"));
  CHECK_FALSE(evidenceHas(h, "from 0.002"));
  CHECK(hypothesis(j, "config-dependent")["verdict"] != "confirmed");
  CHECK_FALSE(anyEvidenceHas(j, "torch.autocast=true"));
  // ... because the flip ran and the step failed under it, not because config bisection did not run.
  bool configRan = false;
  for (const auto& e : j["experiments"])
    if (e["name"] == "bisect-config") configRan = e["outcome"] == "ok";
  CHECK(configRan);
  CHECK(evidenceHas(hypothesis(j, "config-dependent"), "the step fails under each of"));
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "refuted");
}

TEST_CASE("every training replays bit for bit with TorchScript's graph executor optimising", "[trainings]") {
  for (const char* training : {"pow-overflow", "embedding-oob", "dice-valid0", "gaussian-nll"}) {
    DYNAMIC_SECTION(training) {
      test::TempDir dir;
      auto bundle = crashBundle(dir, training, {"--jit-optimize", "--steps", "16", "--fault-step", "10"});
      auto r = replayer::replay(bundle);
      CHECK(r.keyframe == 8);
      CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
    }
  }
}

namespace {

json replayJson(const std::vector<std::string>& args, int timeout = 300) {
  std::vector<std::string> argv = {test::binPath("crashcap")};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = test::run(argv, timeout);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  return json::parse(r.out);
}

void checkBitwise(const json& replay) {
  for (const auto& s : replay["steps"]) {
    INFO("step " << s["step"]);
    if (s["recorded_loss"].is_null()) continue;  // the target of an exception has no fingerprint
    CHECK(s["bitwise"] == true);
  }
}

}  // namespace

TEST_CASE("a setModel training with a step function replays, bisects and triages from the command line, bit for bit",
          "[trainings][triage]") {
  // crashcap runs the recorded program again in replay mode; its Recorder runs the step function.
  test::TempDir dir;
  auto bundle = crashBundle(dir, "module-amsgrad");
  {
    formats::BundleRecords view = formats::readRecords(*formats::BundleReader::open(bundle));
    REQUIRE(view.program);
    CHECK(view.program->format == "module");
    CHECK(view.program->servesReplay);
  }
  auto r = replayJson({"replay", bundle, "--json"});
  INFO(r.dump(2));
  CHECK(r["verdict"] == "reproduced-bitwise");
  CHECK(r["step"] == 6);
  CHECK(r["keyframe"] == 4);
  checkBitwise(r);
  REQUIRE(r["first_nonfinite_op"].is_object());
  CHECK(r["first_nonfinite_op"]["phase"] == "forward");

  auto steps = replayJson({"bisect", "steps", bundle, "--json"});
  CHECK(steps["from_keyframe"] == 0);
  CHECK(steps["first_failing_step"] == 6);
  CHECK(steps["steps"].size() == 7);
  checkBitwise(steps);

  auto ops = replayJson({"bisect", "ops", bundle, "--json"});
  INFO(ops.dump(2));
  CHECK(ops["replay"]["verdict"] == "reproduced-bitwise");
  CHECK(ops["reference"]["dtype"] == "float64 (target step)");
  CHECK(ops["ops_compared"].get<int>() > 0);
  CHECK(ops["first_nonfinite_op"]["name"] == r["first_nonfinite_op"]["name"]);

  auto j = triage(bundle);
  INFO(j.dump(2));
  CHECK(j["reproduced"] == true);
  CHECK(j["culprit"]["step"] == 6);
  CHECK(j["culprit"]["rows"] == json::array({3}));
  CHECK(j["culprit"]["dataset_indices"] == json::array({603}));
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "confirmed");
  CHECK(evidenceHas(hypothesis(j, "invalid-data"), "NaN"));
  CHECK(hypothesis(j, "config-dependent")["verdict"] == "refuted");
}

TEST_CASE("a setModel training given as named tensors, with batch norm and clipping, replays bit for bit and triage "
          "names the label outside nll_loss's classes",
          "[trainings][triage]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "module-batchnorm");
  auto r = replayJson({"replay", bundle, "--json"});
  INFO(r.dump(2));
  CHECK(r["verdict"] == "reproduced-bitwise");
  CHECK_THAT(r["error"].get<std::string>(), Catch::Contains("Target 7 is out of bounds"));
  checkBitwise(r);

  auto j = triage(bundle);
  INFO(j.dump(2));
  CHECK(j["reproduced"] == true);
  CHECK(j["culprit"]["rows"] == json::array({3}));
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "confirmed");
  CHECK(evidenceHas(hypothesis(j, "invalid-data"), "7"));
  CHECK_FALSE(anyEvidenceHas(j, "all zeros"));
}

TEST_CASE("a setModel recording without a step function: replay and triage say why it cannot run", "[trainings][triage]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "module-amsgrad", {"--no-step-function"});
  auto r = test::run({test::binPath("crashcap"), "replay", bundle}, 120);
  CHECK(r.exitCode != 0);
  CHECK_THAT(r.err, Catch::Contains("without Recorder::setStep"));
  CHECK_THAT(r.err, Catch::Contains("rec.setStep"));

  auto j = triage(bundle);
  INFO(j.dump(2));
  CHECK(j["reproduced"] == false);
  CHECK(j["step"] == 6);
  CHECK(j["culprit"]["step"] == 6);
  CHECK(j["experiments"].empty());  // each would fail the same way
  for (const auto& h : j["hypotheses"]) {
    INFO(h["id"]);
    CHECK(h["verdict"] == "inconclusive");
    CHECK_THAT(h["evidence"][0].get<std::string>(), Catch::StartsWith("replay could not run ("));
    CHECK(evidenceHas(h, "without Recorder::setStep"));
    CHECK_FALSE(evidenceHas(h, "does not reproduce"));
  }
}

TEST_CASE("a program that no longer gives its step function, dies of a signal or is gone: replay says which",
          "[trainings]") {
  test::TempDir dir;
  // A copy of the training program, so that it can be removed after it recorded.
  const std::string program = dir.path() + "/training-copy";
  REQUIRE(test::run({"/bin/cp", test::binPath("crashcap-test-trainings"), program}).exitCode == 0);
  const std::string out = dir.path() + "/out";
  auto rec = test::run({program, "--training", "module-amsgrad", "--record", out}, 300);
  REQUIRE(rec.exitCode == 1);
  auto bundles = test::bundlesIn(out);
  REQUIRE(bundles.size() == 1);

  // The program reaches its training loop without setStep (the test training skips it when told).
  auto skipped = test::run({"/usr/bin/env", "CRASHCAP_TEST_SKIP_SET_STEP=1", test::binPath("crashcap"), "replay",
                            bundles[0]},
                           300);
  CHECK(skipped.exitCode != 0);
  CHECK_THAT(skipped.err, Catch::Contains("the program began step 0 without calling Recorder::setStep"));

  // The program dies of a signal while it replays: crashcap replay ends by the same signal, as an
  // in-process replay would; SIGKILL comes from outside and is an error.
  auto segv = test::run({"/usr/bin/env", "CRASHCAP_TEST_SIGNAL_IN_STEP=11", test::binPath("crashcap"), "replay",
                         bundles[0]},
                        300);
  CHECK(segv.exitCode == -SIGSEGV);
  CHECK_THAT(segv.err, Catch::Contains("died of SIGSEGV while it replayed"));
  auto killed = test::run({"/usr/bin/env", "CRASHCAP_TEST_SIGNAL_IN_STEP=9", test::binPath("crashcap"), "replay",
                           bundles[0]},
                          300);
  CHECK(killed.exitCode > 0);
  CHECK_THAT(killed.err, Catch::Contains("was killed (SIGKILL) while it replayed"));

  REQUIRE(std::remove(program.c_str()) == 0);
  auto gone = test::run({test::binPath("crashcap"), "replay", bundles[0]}, 120);
  CHECK(gone.exitCode != 0);
  CHECK_THAT(gone.err, Catch::Contains("the recorded program " + program + " is not there any more"));
}

TEST_CASE("a training resumed at step 100 replays bit for bit from its first step with the graph executor optimising",
          "[trainings]") {
  // The process made no program call before step 100: replay from keyframe 100 must make none
  // either, whatever the step number says.
  test::TempDir dir;
  auto bundle = crashBundle(dir, "dice-valid0",
                            {"--jit-optimize", "--first-step", "100", "--steps", "12", "--fault-step", "110"});
  replayer::ReplayOptions o;
  o.fromEarliestKeyframe = true;
  auto r = replayer::replay(bundle, o);
  CHECK(r.keyframe == 100);
  for (const auto& s : r.steps) {
    INFO("step " << s.step);
    CHECK(s.bitwise);
  }
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
}
