// Replay from real crash bundles of the sample trainings: the crash reproduces bit for bit on
// the same device, the first op whose output goes non-finite is named, and a departure from
// the recording is reported as divergence at its step.
#include <catch2/catch.hpp>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"
#include "crashcap/replayer/replay.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {

/// Runs a sample with a fault under the recorder and returns its crash bundle.
std::string crashBundle(const test::TempDir& dir, const std::string& sample, const std::string& fault,
                        int faultStep = 6) {
  auto r = test::run({test::binPath(sample), "--steps", "16", "--record", dir.path(), "--fault", fault, "--fault-step",
                      std::to_string(faultStep), "--fault-row", "2", "--keyframe-every", "4"},
                     300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".ccap") return e.path().string();
  FAIL("no crash bundle");
  return "";
}

}  // namespace

TEST_CASE("replay reproduces each sample crash bit for bit and names the first non-finite op", "[replayer]") {
  struct Case {
    std::string sample, fault, op, phase;
    bool inputAlreadyNonFinite;  ///< the op received the bad value (data) or made it (numerics)
  };
  const std::vector<Case> cases = {
      {"crashcap-sample-seg", "nan-sample", "convolution", "forward", true},
      {"crashcap-sample-seg", "dice-eps0", "aten::div", "forward", false},
      {"crashcap-sample-cls", "nan-sample", "convolution", "forward", true},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.sample << " " << c.fault) {
      test::TempDir dir;
      auto bundle = crashBundle(dir, c.sample, c.fault);
      auto r = replayer::replay(bundle);
      CHECK(r.verdict == "reproduced-bitwise");
      CHECK(r.step == 6);
      CHECK(r.keyframe == 4);
      CHECK(!r.divergedAt);
      REQUIRE(r.steps.size() == 3);
      for (const auto& s : r.steps) CHECK(s.bitwise);
      CHECK(r.error.find("non-finite loss at step 6") != std::string::npos);
      REQUIRE(r.firstNonFiniteOp);
      INFO(r.firstNonFiniteOp->name);
      CHECK(r.firstNonFiniteOp->name.find(c.op) != std::string::npos);
      CHECK(r.firstNonFiniteOp->phase == c.phase);
      int64_t inputNonFinite = 0;
      for (const auto& in : r.firstNonFiniteOp->inputs) inputNonFinite += in.nanCount + in.infCount;
      CHECK((inputNonFinite > 0) == c.inputAlreadyNonFinite);
      int64_t outputNonFinite = 0;
      for (const auto& out : r.firstNonFiniteOp->outputs) outputNonFinite += out.nanCount + out.infCount;
      CHECK(outputNonFinite > 0);
    }
  }
}

TEST_CASE("replay reproduces an exception with the same text, including the dropout RNG", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-cls", "bad-label");
  auto r = replayer::replay(bundle);
  CHECK(r.verdict == "reproduced-bitwise");  // steps 4, 5 bit for bit (dropout draws from the restored RNG)
  CHECK(r.error.find("Target 10 is out of bounds.") != std::string::npos);
}

TEST_CASE("a replay that departs from the recording is diverged at that step", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-seg", "nan-sample", 7);
  replayer::ReplayOptions o;
  o.perturbStep = 5;  // one weight, one ulp, as a nondeterministic kernel would
  auto r = replayer::replay(bundle, o);
  CHECK(r.verdict == "diverged");
  REQUIRE(r.divergedAt);
  CHECK(*r.divergedAt == 5);
  CHECK(r.steps.at(0).bitwise);   // step 4 still matches
  CHECK(!r.steps.at(1).bitwise);  // step 5 does not
}

TEST_CASE("replay of a healthy step matches the recording; a missing step is a clear error", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-cls", "nan-sample", 9);
  replayer::ReplayOptions o;
  o.step = 6;
  auto r = replayer::replay(bundle, o);
  CHECK(r.verdict == "reproduced-bitwise");
  CHECK(r.error.empty());
  CHECK(!r.firstNonFiniteOp);
  o.step = 400;
  try {
    replayer::replay(bundle, o);
    FAIL("replayed a step that is not there");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK(e.message().find("step 400") != std::string::npos);
  }
}

TEST_CASE("crashcap replay --json has the verdict, the step and the first non-finite op", "[replayer][cli]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-seg", "dice-eps0");
  auto r = test::run({test::binPath("crashcap"), "replay", bundle, "--json"}, 300);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["verdict"] == "reproduced-bitwise");
  CHECK(j["step"] == 6);
  CHECK(j["diverged_at"].is_null());
  CHECK(j["first_nonfinite_op"]["name"] == "aten::div");
  CHECK(j["first_nonfinite_op"]["phase"] == "forward");
  CHECK(j["first_nonfinite_op"]["outputs"][0]["nan_count"] == 1);
  CHECK(j["steps_replayed"] == 3);
  auto cuda = test::run({test::binPath("crashcap"), "replay", bundle, "--device", "cuda:0"});
  CHECK(cuda.exitCode == 2);
  CHECK(cuda.err.find("--device cpu") != std::string::npos);
}

TEST_CASE("bisect steps finds the first failing step and shows the weights running away", "[replayer][bisect]") {
  SECTION("a learning-rate blow-up: finite losses first, weights exploding, then non-finite") {
    test::TempDir dir;
    auto bundle = crashBundle(dir, "crashcap-sample-seg", "lr-blowup", 5);
    auto r = test::run({test::binPath("crashcap"), "bisect", "steps", bundle, "--json"}, 300);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["from_keyframe"] == 0);  // the whole retained history
    int64_t first = j["first_failing_step"];
    CHECK((first > 5 && first <= 9));
    CHECK(j["target"] == first);  // the recorder stopped the run at the first non-finite step
    const auto& steps = j["steps"];
    CHECK(steps[5]["lr"].get<double>() > 1e3 * steps[4]["lr"].get<double>());
    // The update of the step before the failure left the weights orders of magnitude larger.
    double before = steps[4]["weight_norm"], last = steps[first - 1]["weight_norm"];
    CHECK(last > 1000 * before);
  }
  SECTION("a corrupt sample: the failing step is the one that consumed it") {
    test::TempDir dir;
    auto bundle = crashBundle(dir, "crashcap-sample-cls", "nan-sample", 6);
    auto r = test::run({test::binPath("crashcap"), "bisect", "steps", bundle, "--json"}, 300);
    REQUIRE(r.exitCode == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["first_failing_step"] == 6);
    CHECK(j["reason"] == "loss");
  }
}
