// The branches of bisect and triage that need a device, a setting or a nondeterministic kernel,
// exercised on this CPU-only machine through the fault-injection hook (testing/): a chosen op
// computes NaN only under a chosen setting or on a chosen device, in the training that records
// the crash and in every replay of it.
#include <catch2/catch.hpp>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"
#include "crashcap/testing/fault_injection.hpp"
#include "test_support.hpp"
#include "triage_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using nlohmann::json;
using test::evidenceHas;
using test::hypothesis;

namespace {

/// Runs `argv` with CRASHCAP_FAULT_INJECT=spec in its environment.
test::RunResult runWithFault(const std::string& spec, std::vector<std::string> argv, int timeout = 300) {
  argv.insert(argv.begin(), {"/usr/bin/env", "CRASHCAP_FAULT_INJECT=" + spec});
  return test::run(argv, timeout);
}

/// A seg training whose step 6 fails through the hook; returns the crash bundle.
std::string faultyRun(const test::TempDir& dir, const std::string& spec, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {test::binPath("crashcap-sample-seg"), "--steps", "12", "--record", dir.path(),
                                   "--keyframe-every", "4"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = runWithFault(spec, argv);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  CHECK(r.err.find("training failed at step 6") != std::string::npos);
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".ccap") return e.path().string();
  FAIL("no crash bundle");
  return "";
}

}  // namespace

TEST_CASE("fault specs parse, and a bad one is an error naming the part", "[fault]") {
  auto s = testing::parseFaultSpec("op=aten::conv2d;step=6;when=cudnn.benchmark=true;when=torch.threads=1;device=cpu;"
                                   "mode=perturb;fake_devices=cuda:0,cuda:1");
  CHECK(s.op == "aten::conv2d");
  CHECK(s.step == 6);
  CHECK(s.device == "cpu");
  CHECK(s.mode == "perturb");
  REQUIRE(s.when.size() == 2);
  CHECK(s.when[0] == std::make_pair(std::string("cudnn.benchmark"), std::string("true")));
  CHECK(s.fakeDevices == std::vector<std::string>{"cuda:0", "cuda:1"});
  for (const char* bad : {"step=6", "op=aten::div;mode=explode", "op=aten::div;when=nosuch=1", "op=aten::div;step=x",
                          "op=aten::div;colour=red", "op"}) {
    INFO(bad);
    CHECK_THROWS_AS(testing::parseFaultSpec(bad), Error);
  }
}

TEST_CASE("config-dependent: an op that fails only under cudnn.benchmark is found by bisect config and triage",
          "[investigate][fault][e2e]") {
  const std::string spec = "op=aten::conv2d;step=6;when=cudnn.benchmark=true";
  test::TempDir dir;
  auto bundle = faultyRun(dir, spec, {"--set", "cudnn.benchmark=true"});

  auto cfg = runWithFault(spec, {test::binPath("crashcap"), "bisect", "config", bundle, "--json"});
  INFO(cfg.err);
  REQUIRE(cfg.exitCode == 0);
  auto c = json::parse(cfg.out);
  CHECK(c["baseline"]["fails"] == true);
  CHECK(c["baseline"]["settings"]["cudnn.benchmark"] == "true");  // the recorded value, applied again
  // On the CPU the cudnn and TF32 settings change nothing, so they are not tried; but the hook reads
  // cudnn.benchmark here, so it is.
  CHECK(c["flips"].size() == 4);
  CHECK(c["not_tried"] ==
        json::array({"cudnn.enabled", "cudnn.deterministic", "cudnn.allow_tf32", "cuda.matmul.allow_tf32"}));
  CHECK(c["changes_outcome"] == json::array({"cudnn.benchmark=false"}));
  for (const auto& f : c["flips"])
    CHECK(f["command"].get<std::string>().find("--set " + f["setting"].get<std::string>() + "=") != std::string::npos);

  auto tri = runWithFault(spec, {test::binPath("crashcap"), "triage", bundle, "--json"}, 900);
  INFO(tri.err);
  REQUIRE(tri.exitCode == 0);
  auto j = json::parse(tri.out);
  INFO(j.dump(2));
  CHECK(j["reproduced"] == true);
  const auto& h = hypothesis(j, "config-dependent");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "cudnn.benchmark=false (recorded true)"));
  CHECK(evidenceHas(h, "changed for step 6 alone from the state the recorded settings give it"));
  CHECK(hypothesis(j, "device-specific")["verdict"] == "inconclusive");  // only the CPU here
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "refuted");         // any row fails
  CHECK(hypothesis(j, "loss-numerics")["verdict"] == "inconclusive");   // the kernel under a setting
  CHECK(j["culprit"]["op"] == "aten::conv2d");
  CHECK(j["culprit"]["changes"] == json::array({"cudnn.benchmark=false"}));

  // Without the hook the recorded failure does not come back: replay says so, it does not guess.
  auto clean = test::run({test::binPath("crashcap"), "replay", bundle, "--json"});
  REQUIRE(clean.exitCode == 0);
  CHECK(json::parse(clean.out)["verdict"] == "not-reproduced");
}

TEST_CASE("bisect config changes a setting for the failing step alone: the steps before it replay as recorded",
          "[investigate][fault][e2e]") {
  // Fails at step 6 under any setting; the keyframe is at step 4, so steps 4 and 5 come before.
  const std::string spec = "op=aten::conv2d;step=6";
  test::TempDir dir;
  auto bundle = faultyRun(dir, spec);
  auto replayWith = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {test::binPath("crashcap"), "replay", bundle, "--json", "--no-instrument"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto r = runWithFault(spec, argv);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    return json::parse(r.out);
  };
  // Autocast changes every step's numbers. From the keyframe on, the steps before the failing one
  // depart from the recording; at the target alone, they match it bit for bit and the target
  // step itself runs under autocast.
  auto throughout = replayWith({"--set", "torch.autocast=true"});
  auto atTarget = replayWith({"--set", "torch.autocast=true", "--set-at-target"});
  CHECK(throughout["settings_at_target"] == false);
  CHECK(atTarget["settings_at_target"] == true);
  CHECK(atTarget["settings"]["torch.autocast"] == "true");
  CHECK(atTarget["recorded_settings"]["torch.autocast"] == "false");
  CHECK(atTarget["same_setup"] == false);
  REQUIRE(throughout["steps"].size() == 3);
  REQUIRE(atTarget["steps"].size() == 3);
  for (int i = 0; i < 2; ++i) {
    INFO("step " << atTarget["steps"][i]["step"]);
    CHECK(atTarget["steps"][i]["bitwise"] == true);
    CHECK(throughout["steps"][i]["bitwise"] == false);
  }
  CHECK(atTarget["verdict"] == "reproduced");  // the injected fault still fires at step 6
  const std::string usage = test::run({test::binPath("crashcap"), "replay", bundle, "--set-at-target"}).err;
  CHECK(usage.find("--set-at-target changes nothing without a --set") != std::string::npos);

  auto cfg = runWithFault(spec, {test::binPath("crashcap"), "bisect", "config", bundle, "--json"});
  INFO(cfg.err);
  REQUIRE(cfg.exitCode == 0);
  auto c = json::parse(cfg.out);
  CHECK(c["flips_at_target"] == true);
  // The settings that act on the CPU: the cudnn and TF32 ones would replay the same bits again.
  REQUIRE(c["flips"].size() == 3);
  CHECK(c["not_tried"] == json::array({"cudnn.enabled", "cudnn.benchmark", "cudnn.deterministic", "cudnn.allow_tf32",
                                       "cuda.matmul.allow_tf32"}));
  for (const auto& f : c["flips"]) CHECK(f["command"].get<std::string>().find("--set-at-target") != std::string::npos);
  CHECK(c["changes_outcome"].empty());  // the fault ignores every setting
  auto text = runWithFault(spec, {test::binPath("crashcap"), "bisect", "config", bundle});
  CHECK(text.out.find("each setting below is changed for step 6 alone") != std::string::npos);
  CHECK(text.out.find("not tried on cpu: cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, "
                      "cuda.matmul.allow_tf32, which change only CUDA kernels") != std::string::npos);

  // A setting of the thread's own (autocast) that the failure needs: recorded on, the fault fires
  // only under it, and turning it off for step 6 alone is what makes the step run clean.
  const std::string underAutocast = "op=aten::conv2d;step=6;when=torch.autocast=true";
  test::TempDir dir2;
  auto recordedOn = faultyRun(dir2, underAutocast, {"--set", "torch.autocast=true"});
  auto cfg2 = runWithFault(underAutocast, {test::binPath("crashcap"), "bisect", "config", recordedOn, "--json"});
  INFO(cfg2.err);
  REQUIRE(cfg2.exitCode == 0);
  auto c2 = json::parse(cfg2.out);
  CHECK(c2["baseline"]["fails"] == true);
  CHECK(c2["changes_outcome"] == json::array({"torch.autocast=false"}));
}

TEST_CASE("device-specific: an op that fails only on the CPU, with a second (fake) device to compare",
          "[investigate][fault][e2e]") {
  const std::string spec = "op=aten::conv2d;step=6;device=cpu;fake_devices=cuda:0";
  test::TempDir dir;
  auto bundle = faultyRun(dir, spec);

  auto fake = runWithFault(spec, {test::binPath("crashcap"), "replay", bundle, "--device", "cuda:0", "--json"});
  INFO(fake.err);
  REQUIRE(fake.exitCode == 0);
  auto f = json::parse(fake.out);
  CHECK(f["device"] == "cuda:0");
  CHECK(f["recorded_device"] == "cpu");
  CHECK(f["same_setup"] == false);
  CHECK(f["verdict"] == "not-reproduced");

  auto tri = runWithFault(spec, {test::binPath("crashcap"), "triage", bundle, "--json"}, 900);
  INFO(tri.err);
  REQUIRE(tri.exitCode == 0);
  auto j = json::parse(tri.out);
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "device-specific");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "fails on cpu and runs clean on cuda:0"));
  CHECK(hypothesis(j, "config-dependent")["verdict"] == "refuted");
  CHECK(j["culprit"]["changes"] == json::array({"device=cuda:0"}));
}

TEST_CASE("bisect ops: the first non-finite op and the first op departing from float64", "[investigate][bisect][e2e]") {
  auto crash = [](const test::TempDir& dir, const std::string& fault, int step) {
    auto r = test::run({test::binPath("crashcap-sample-seg"), "--steps", "14", "--record", dir.path(), "--fault", fault,
                        "--fault-step", std::to_string(step), "--keyframe-every", "4"},
                       300);
    REQUIRE(r.exitCode == 1);
    for (const auto& e : fs::directory_iterator(dir.path()))
      if (e.path().extension() == ".ccap") return e.path().string();
    return std::string();
  };
  SECTION("0/0 in the Dice loss: the same NaN in float64, so no op departs; the division is named") {
    test::TempDir dir;
    auto r = test::run({test::binPath("crashcap"), "bisect", "ops", crash(dir, "dice-eps0", 6), "--json"}, 300);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    auto j = json::parse(r.out);
    CHECK(j["step"] == 6);
    CHECK(j["first_nonfinite_op"]["name"] == "aten::div");
    CHECK(j["fails_in_float64"] == true);
    CHECK(j["first_departing_op"].is_null());
    CHECK(j["stopped_because"].is_null());
    CHECK(j["ops_compared"].get<int>() > 100);  // forward and backward
  }
  SECTION("a learning-rate blow-up: float32 overflows where float64 does not") {
    test::TempDir dir;
    auto r = test::run({test::binPath("crashcap"), "bisect", "ops", crash(dir, "lr-blowup", 5), "--json"}, 300);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    auto j = json::parse(r.out);
    CHECK(j["fails_in_float64"] == false);
    REQUIRE(j["first_departing_op"].is_object());
    CHECK(j["first_departing_op"]["phase"] == "forward");
    CHECK(j["first_departing_op"]["elements"].get<int64_t>() > 0);
    CHECK(j["reference"]["dtype"] == "float64 (target step)");
  }
}
