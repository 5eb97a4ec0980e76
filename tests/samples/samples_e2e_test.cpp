// End to end with the real sample binaries: each fault makes the training fail, and the crash
// bundle names the step and the error and holds what a replay needs — the failing step's
// batch bit for bit as the sample fed it, its generator state, and a keyframe at or before it.
// LibTorch first: glog's CHECK must not replace Catch's.
#include <torch/torch.h>
#undef CHECK

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/inspect/story.hpp"
#include "models.hpp"
#include "train.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {

struct FaultCase {
  std::string binary;
  std::string fault;
  std::string errorPart;     ///< text the crash error must contain
  std::string kind;          ///< crash kind
  bool exactStep;            ///< the crash is at the fault step (else later: lr-blowup)
};

std::string onlyBundle(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".ccap") out.push_back(e.path().string());
  REQUIRE(out.size() == 1);
  return out[0];
}

}  // namespace

TEST_CASE("every sample fault leaves a crash bundle with the step, the error and the step's inputs",
          "[samples][e2e]") {
  const std::vector<FaultCase> cases = {
      {"crashcap-sample-seg", "nan-sample", "non-finite loss at step 5", "nonfinite", true},
      {"crashcap-sample-seg", "dice-eps0", "non-finite loss at step 5", "nonfinite", true},
      {"crashcap-sample-seg", "lr-blowup", "non-finite", "nonfinite", false},
      {"crashcap-sample-cls", "bad-label", "out of bounds", "exception", true},
      {"crashcap-sample-cls", "nan-sample", "non-finite loss at step 5", "nonfinite", true},
      {"crashcap-sample-cls", "lr-blowup", "non-finite", "nonfinite", false},
  };
  const uint64_t seed = 3;
  const int64_t faultStep = 5, row = 2;
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.binary << " --fault " << c.fault) {
      test::TempDir dir;
      auto r = test::run({test::binPath(c.binary), "--steps", "14", "--record", dir.path(), "--fault", c.fault,
                          "--fault-step", std::to_string(faultStep), "--fault-row", std::to_string(row), "--seed",
                          std::to_string(seed), "--keyframe-every", "4"},
                         300);
      INFO(r.out << r.err);
      REQUIRE(r.exitCode == 1);  // the fault made training fail
      auto bundle = onlyBundle(dir.path());
      REQUIRE(formats::verifyBundle(bundle).ok());
      auto reader = formats::BundleReader::open(bundle);
      auto story = inspect::storyJson(*reader);
      INFO(story["crash"].dump(2));
      REQUIRE(!story["crash"].is_null());
      int64_t step = story["crash"]["step"];
      if (c.exactStep)
        CHECK(step == faultStep);
      else
        CHECK((step >= faultStep && step <= faultStep + 6));
      CHECK(story["crash"]["kind"] == c.kind);
      CHECK(story["crash"]["error"].get<std::string>().find(c.errorPart) != std::string::npos);
      CHECK(r.err.find("crash bundle: " + bundle) != std::string::npos);

      // The failing step's batch, bit for bit as the sample generated it.
      auto view = formats::readRecords(*reader);
      REQUIRE(view.program);
      samples::FaultPlan plan{samples::parseFault(c.fault), faultStep, row};
      auto fed = c.binary == "crashcap-sample-seg" ? samples::makeSegBatch(seed, step, 8, plan)
                                                   : samples::makeClsBatch(seed, step, 32, 10, plan);
      REQUIRE(fed.size() == view.program->inputs.size());
      for (size_t i = 0; i < fed.size(); ++i) {
        auto stored = formats::torch::readTensor(*reader, formats::batchTensorName(step, view.program->inputs[i]));
        INFO(view.program->inputs[i]);
        REQUIRE(stored.sizes() == fed[i].sizes());
        REQUIRE(stored.scalar_type() == fed[i].scalar_type());
        auto a = fed[i].contiguous();
        CHECK(std::memcmp(stored.data_ptr(), a.data_ptr(), a.numel() * a.element_size()) == 0);
      }
      // Its generator state, and the state at step 0 is the one the sample seeded.
      auto rng = formats::torch::readTensor(*reader, formats::rngTensorName(step, "cpu"));
      CHECK(rng.numel() > 0);
      if (reader->find(formats::rngTensorName(0, "cpu"))) {
        torch::manual_seed(seed);
        auto expected = at::detail::getDefaultCPUGenerator().get_state();
        CHECK(formats::torch::readTensor(*reader, formats::rngTensorName(0, "cpu")).equal(expected));
      }
      // A keyframe at or before the step, holding every parameter of the program.
      const formats::KeyframeData* kf = nullptr;
      for (const auto& k : view.keyframes)
        if (k.step <= step) kf = &k;
      REQUIRE(kf);
      CHECK(kf->parameters.size() == view.program->parameters.size());
      for (const auto& name : kf->parameters) CHECK(reader->find(name));
      CHECK(!kf->optimizerState.empty() == (kf->step > 0));  // SGD momentum exists after the first update
      // The learning rate each step used is on record (lr-blowup changes it at the fault step).
      for (const auto& b : view.stepBegins) {
        REQUIRE(b.learningRates.size() == 1);
        double base = c.binary == "crashcap-sample-seg" ? 0.02 : 0.05;
        CHECK(b.learningRates[0] == Approx(samples::learningRate(base, b.step, plan)));
      }
    }
  }
}

TEST_CASE("a sample without a fault trains, and without --record writes nothing", "[samples][e2e]") {
  test::TempDir dir;
  auto r = test::run({test::binPath("crashcap-sample-cls"), "--steps", "6"}, 300);
  INFO(r.out << r.err);
  CHECK(r.exitCode == 0);
  CHECK(r.out.find("not recorded") != std::string::npos);
  auto bad = test::run({test::binPath("crashcap-sample-seg"), "--fault", "bad-label"});
  CHECK(bad.exitCode == 2);
  CHECK(bad.err.find("crashcap-sample-cls") != std::string::npos);
  auto unrecorded = test::run({test::binPath("crashcap-sample-seg"), "--steps", "8", "--fault", "nan-sample"}, 300);
  CHECK(unrecorded.exitCode == 1);  // the sample's own check still fails the run
}

TEST_CASE("the wide model trains, and its NaN sample ends a recorded run in a bundle that replays bit for bit",
          "[samples][wide]") {
  samples::TrainOptions clean;
  clean.task = samples::Task::Wide;
  clean.wideWidth = 64;
  clean.wideLayers = 3;
  clean.steps = 20;
  clean.optimizer = "adam";
  clean.printEvery = 0;
  auto trained = samples::train(clean);
  REQUIRE_FALSE(trained.failed);
  REQUIRE(trained.losses.size() == 20);
  for (double l : trained.losses) CHECK(std::isfinite(l));
  CHECK(trained.losses.back() < trained.losses.front());  // it learns

  test::TempDir dir;
  samples::TrainOptions faulty = clean;
  faulty.steps = 8;
  faulty.recordDir = dir.path();
  faulty.policy.quiet = true;
  faulty.fault.fault = samples::Fault::NanSample;
  faulty.fault.step = 6;
  faulty.fault.row = 2;
  auto failed = samples::train(faulty);
  CHECK(failed.failed);
  CHECK(failed.failedStep == 6);
  REQUIRE_FALSE(failed.bundle.empty());
  auto story = inspect::storyJson(*formats::BundleReader::open(failed.bundle));
  CHECK(story["crash"]["step"] == 6);
  auto r = test::run({test::binPath("crashcap"), "replay", failed.bundle, "--json"}, 300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  auto replay = nlohmann::json::parse(r.out);
  CHECK(replay["verdict"] == "reproduced-bitwise");
  CHECK(replay["step"] == 6);
}
