// Triage on real crash bundles of every sample fault: the hypothesis table names the cause.
#include <catch2/catch.hpp>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/investigate/report.hpp"
#include "test_support.hpp"
#include "triage_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using nlohmann::json;
using test::evidenceHas;
using test::hypothesis;

namespace {

json triage(const std::string& sample, const std::string& fault, int64_t faultStep, int64_t row) {
  test::TempDir dir;
  auto r = test::run({test::binPath(sample), "--steps", "14", "--record", dir.path(), "--fault", fault, "--fault-step",
                      std::to_string(faultStep), "--fault-row", std::to_string(row), "--keyframe-every", "4"},
                     300);
  REQUIRE(r.exitCode == 1);
  std::string bundle;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".ccap") bundle = e.path().string();
  // A --json-out that cannot be written is refused before any experiment runs.
  auto refused = test::run({test::binPath("crashcap"), "triage", bundle, "--json-out", dir.path() + "/no/such/t.json"});
  CHECK(refused.exitCode == 2);
  CHECK(refused.err.find("cannot write into " + dir.path() + "/no/such") != std::string::npos);
  const std::string out = dir.path() + "/triage.json";
  auto t = test::run({test::binPath("crashcap"), "triage", bundle, "--json", "--json-out", out}, 900);
  INFO(t.err);
  REQUIRE(t.exitCode == 0);
  auto j = json::parse(t.out);
  CHECK(json::parse(test::readText(out)) == j);  // the same triage in the file as on stdout
  for (const auto& e : j["experiments"]) {
    CHECK(e["outcome"] == "ok");
    CHECK(e["command"].get<std::string>().rfind("crashcap ", 0) == 0);
  }
  return j;
}

}  // namespace

TEST_CASE("triage: a NaN sample is invalid data, with its step, row and first non-finite op", "[investigate][triage][e2e]") {
  auto j = triage("crashcap-sample-seg", "nan-sample", 6, 3);
  INFO(j.dump(2));
  CHECK(j["reproduced"] == true);
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "confirmed");
  CHECK(evidenceHas(hypothesis(j, "invalid-data"), "row 3 of steps/6/batch/image holds 64 NaN"));
  CHECK(hypothesis(j, "loss-numerics")["verdict"] == "refuted");
  CHECK(hypothesis(j, "optimizer-divergence")["verdict"] == "refuted");
  CHECK(hypothesis(j, "nondeterminism")["verdict"] == "refuted");
  CHECK(j["culprit"]["step"] == 6);
  CHECK(j["culprit"]["rows"] == json::array({3}));
  CHECK(j["culprit"]["dataset_indices"] == json::array({6 * 8 + 3}));  // the sample's index tensor, batch 8
  CHECK(j["culprit"]["op"].get<std::string>().find("convolution") != std::string::npos);
  CHECK(j["culprit"]["phase"] == "forward");
}

TEST_CASE("triage: an out-of-range label is invalid data, with the label and the number of classes", "[investigate][triage][e2e]") {
  auto j = triage("crashcap-sample-cls", "bad-label", 6, 5);
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "invalid-data");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "row 5 of steps/6/batch/label is 10"));
  CHECK(evidenceHas(h, "10 classes"));
  CHECK(j["culprit"]["rows"] == json::array({5}));
  CHECK(evidenceHas(h, "dataset index 197"));  // step 6, batch 32, row 5
}

TEST_CASE("triage: a Dice epsilon of zero is loss numerics, at the dividing op, triggered by rows that are not invalid",
          "[investigate][triage][e2e]") {
  // Row 2's masks are all "don't care": a legitimate image the loss divides 0 by 0 on.
  auto j = triage("crashcap-sample-seg", "dice-eps0", 6, 2);
  INFO(j.dump(2));
  const auto& numerics = hypothesis(j, "loss-numerics");
  CHECK(numerics["verdict"] == "confirmed");
  CHECK(evidenceHas(numerics, "aten::div"));
  CHECK(evidenceHas(numerics, "the loss cannot handle a legitimate edge case"));
  const auto& data = hypothesis(j, "invalid-data");
  CHECK(data["verdict"] != "confirmed");
  CHECK(evidenceHas(data, "step 6 fails with batch row [2] alone and passes without it"));
  CHECK(j["culprit"]["op"] == "aten::div");
  CHECK(j["culprit"]["step"] == 6);
  CHECK(j["culprit"]["rows"] == json::array({2}));
}

TEST_CASE("triage: a learning-rate blow-up is optimizer divergence, and not the data", "[investigate][triage][e2e]") {
  auto j = triage("crashcap-sample-seg", "lr-blowup", 5, 0);
  INFO(j.dump(2));
  const auto& h = hypothesis(j, "optimizer-divergence");
  CHECK(h["verdict"] == "confirmed");
  CHECK(evidenceHas(h, "first step whose loss, gradients or weights go non-finite"));
  CHECK(evidenceHas(h, "learning rate jumps"));
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "refuted");
  CHECK(hypothesis(j, "loss-numerics")["verdict"] == "refuted");
  CHECK(j["culprit"]["rows"].is_null());
}

TEST_CASE("triage: a crash in the first recorded step has no weight history, and says so", "[investigate][triage][e2e]") {
  // No step completes an optimizer step before step 0: the weight norm is unknown, which is
  // neither growth nor stability.
  auto j = triage("crashcap-sample-cls", "nan-sample", 0, 2);
  INFO(j.dump(2));
  CHECK(hypothesis(j, "invalid-data")["verdict"] == "confirmed");
  CHECK(j["culprit"]["step"] == 0);
  CHECK(j["culprit"]["rows"] == json::array({2}));
  const auto& h = hypothesis(j, "optimizer-divergence");
  CHECK(h["verdict"] == "inconclusive");
  CHECK(evidenceHas(h, "no weight norm to compare"));
  CHECK_FALSE(evidenceHas(h, "inf"));
}

TEST_CASE("crashcap report writes a Markdown bug report with the triage table", "[investigate][report][e2e]") {
  test::TempDir dir;
  auto r = test::run({test::binPath("crashcap-sample-cls"), "--steps", "10", "--record", dir.path(), "--fault",
                      "bad-label", "--fault-step", "5", "--fault-row", "1", "--keyframe-every", "4"},
                     300);
  REQUIRE(r.exitCode == 1);
  std::string bundle;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".ccap") bundle = e.path().string();
  auto out = dir.file("report.md");
  auto rep = test::run({test::binPath("crashcap"), "report", bundle, "-o", out}, 900);
  INFO(rep.err);
  REQUIRE(rep.exitCode == 0);
  auto md = test::readText(out);
  for (const char* heading : {"## Summary", "## Environment", "## Steps to Reproduce", "## Expected Behavior",
                              "## Actual Behavior", "## Logs / Stack Trace", "## Root Cause Analysis"})
    CHECK(md.find(heading) != std::string::npos);
  CHECK(md.find("Target 10 is out of bounds.") != std::string::npos);
  CHECK(md.find("`crashcap replay " + bundle + "`") != std::string::npos);
  CHECK(md.find("| invalid-data | **confirmed** |") != std::string::npos);
  CHECK(md.find("row 1 of steps/5/batch/label is 10") != std::string::npos);
  CHECK(md.rfind("---\ntitle: \"Training crash at step 5", 0) == 0);
}

TEST_CASE("the report says a crash between steps or while loading came after the step it names",
          "[investigate][report]") {
  test::TempDir dir;
  auto bundleOf = [&](const std::string& name, const std::string& phase) {
    const std::string path = dir.file(name);
    auto w = formats::BundleWriter::create(path);
    for (int64_t s = 0; s < 4; ++s) {
      formats::writeMetaRecord(*w, formats::StepBeginData{s, {}, {}, {0.1}, 100 + s, -1, s - 1});
      formats::writeMetaRecord(*w, formats::StepEndData{s, 1.0 / double(s + 1), 0, false, false, 10});
    }
    formats::CrashData c;
    c.kind = "exception";
    c.step = 3;
    c.phase = phase;
    c.error = "RuntimeError: boom";
    formats::writeMetaRecord(*w, c);
    w->seal();
    return path;
  };
  const std::string inStep = bundleOf("in.ccap", "backward");
  const std::string loading = bundleOf("loading.ccap", "loading");
  const std::string between = bundleOf("between.ccap", "between-steps");
  CHECK(investigate::markdownReport(inStep, std::nullopt).rfind("---\ntitle: \"Training crash at step 3: ", 0) == 0);
  CHECK(investigate::markdownReport(loading, std::nullopt).rfind("---\ntitle: \"Training crash after step 3: ", 0) == 0);
  const std::string md = investigate::markdownReport(between, std::nullopt);
  CHECK(md.rfind("---\ntitle: \"Training crash after step 3: ", 0) == 0);
  CHECK(md.find("Training fails after step 3 in the between-steps phase") != std::string::npos);
  CHECK(md.find("- The run fails after step 3 (exception, phase between-steps)") != std::string::npos);
  CHECK(investigate::markdownReport(inStep, std::nullopt).find("- Step 3 fails (exception, phase backward)") !=
        std::string::npos);
  // A replay that ran the step clean says why, for an error the DataLoader raised.
  replayer::ReplayResult clean;
  clean.verdict = replayer::Verdict::NotReproduced;
  clean.step = 3;
  CHECK(investigate::markdownReport(loading, std::nullopt, &clean)
            .find("**The error came from the DataLoader while it loaded the batch after step 3**") != std::string::npos);
  CHECK(investigate::markdownReport(inStep, std::nullopt, &clean).find("**The crash does not reproduce in replay here**") !=
        std::string::npos);
  if (investigate::htmlReportAvailable()) {
    CHECK(investigate::htmlReport(loading, std::nullopt, &clean).find("the error came from the DataLoader") !=
          std::string::npos);
    CHECK(investigate::htmlReport(inStep, std::nullopt, &clean).find("the crash does not reproduce in replay here") !=
          std::string::npos);
    CHECK(investigate::htmlReport(inStep, std::nullopt).find("<h1>Training crash at step 3</h1>") != std::string::npos);
    CHECK(investigate::htmlReport(between, std::nullopt).find("<h1>Training crash after step 3</h1>") !=
          std::string::npos);
  }
}

TEST_CASE("both reports name the step a killed process was in, from its run status", "[investigate][report]") {
  // A program that recorded itself and was SIGKILLed outside crashcap run: no crash record and no
  // supervision record, only the run status its progress file left (interrupted in step 2).
  test::TempDir dir;
  auto bundleOf = [&](const std::string& name, const std::string& phase) {
    const std::string path = dir.file(name);
    auto w = formats::BundleWriter::create(path);
    for (int64_t s = 0; s < 3; ++s) {
      formats::writeMetaRecord(*w, formats::StepBeginData{s, {}, {}, {0.1}, 100 + s, -1, s - 1});
      if (s < 2) formats::writeMetaRecord(*w, formats::StepEndData{s, 1.0 / double(s + 1), 0, false, false, 10});
    }
    formats::RunStatusData status;
    status.state = "interrupted";
    status.stepsBegun = 3;
    status.lastStep = 2;
    status.lastPhase = phase;
    formats::writeMetaRecord(*w, status);
    w->seal();
    return path;
  };
  const std::string inStep = bundleOf("killed.ccap", "forward");
  const std::string between = bundleOf("between.ccap", "between-steps");
  CHECK(investigate::reportedStep(formats::readRecords(*formats::BundleReader::open(inStep))) == 2);
  CHECK(investigate::markdownReport(inStep, std::nullopt).rfind("---\ntitle: \"Training crash at step 2: ", 0) == 0);
  CHECK(investigate::markdownReport(between, std::nullopt).rfind("---\ntitle: \"Training crash after step 2: ", 0) ==
        0);
  if (investigate::htmlReportAvailable()) {
    CHECK(investigate::htmlReport(inStep, std::nullopt).find("<h1>Training crash at step 2</h1>") != std::string::npos);
    CHECK(investigate::htmlReport(between, std::nullopt).find("<h1>Training crash after step 2</h1>") !=
          std::string::npos);
  }
}
