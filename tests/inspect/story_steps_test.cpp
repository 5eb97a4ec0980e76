// The story's step counts on hand-built bundles: a step the process failed in ended (its loss
// may be recorded) but never completed; a crash between steps names the step before it, which
// completed; a process killed in a step, sealed without a crash record, did not complete it.
#include <catch2/catch.hpp>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/story.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;

namespace {

/// Steps 0..3 begun and ended (step 3's end recorded twice, as a program's second backward
/// would not be but a damaged file might), then `crash` or `status`.
nlohmann::json stepsOf(const std::string& path, const std::optional<CrashData>& crash,
                       const std::optional<RunStatusData>& status) {
  auto w = BundleWriter::create(path);
  for (int64_t s = 0; s < 4; ++s) {
    writeMetaRecord(*w, StepBeginData{s, {}, {}, {0.1}, 100 + s, -1, s - 1});
    writeMetaRecord(*w, StepEndData{s, 1.0 / double(s + 1), 0, false, false, 10});
  }
  writeMetaRecord(*w, StepEndData{3, 0.25, 0, false, false, 10});
  if (crash) writeMetaRecord(*w, *crash);
  if (status) writeMetaRecord(*w, *status);
  w->seal();
  return inspect::storyJson(*BundleReader::open(path))["steps"];
}

CrashData crashIn(const std::string& phase) {
  CrashData c;
  c.kind = "exception";
  c.step = 3;
  c.phase = phase;
  c.error = "RuntimeError: boom";
  return c;
}

RunStatusData killedIn(const std::string& phase) {
  RunStatusData s;
  s.state = "interrupted";
  s.stepsBegun = 4;
  s.lastStep = 3;
  s.lastPhase = phase;
  return s;
}

}  // namespace

TEST_CASE("the step the process failed in ended but did not complete; a crash between steps took none",
          "[inspect][story]") {
  test::TempDir dir;
  SECTION("a crash in the optimizer's update, after the step's end") {
    auto st = stepsOf(dir.file("a.ccap"), crashIn("optimizer"), std::nullopt);
    CHECK(st["count"] == 4);
    CHECK(st["ended"] == 4);  // steps, not end records: step 3's second one is the same step
    CHECK(st["completed"] == 3);
  }
  SECTION("a crash between steps names the step before it, which completed") {
    auto st = stepsOf(dir.file("b.ccap"), crashIn("between-steps"), std::nullopt);
    CHECK(st["ended"] == 4);
    CHECK(st["completed"] == 4);
  }
  SECTION("the DataLoader's error while it loaded the next batch names the step before, which completed") {
    auto st = stepsOf(dir.file("f.ccap"), crashIn("loading"), std::nullopt);
    CHECK(st["completed"] == 4);
  }
  SECTION("a process killed in a step's update, sealed from its progress") {
    auto st = stepsOf(dir.file("c.ccap"), std::nullopt, killedIn("optimizer"));
    CHECK(st["completed"] == 3);
  }
  SECTION("a process killed between steps") {
    auto st = stepsOf(dir.file("d.ccap"), std::nullopt, killedIn("between-steps"));
    CHECK(st["completed"] == 4);
  }
  SECTION("a clean run") {
    RunStatusData finished;
    finished.state = "finished";
    finished.stepsBegun = 4;
    finished.lastStep = 3;
    auto st = stepsOf(dir.file("e.ccap"), std::nullopt, finished);
    CHECK(st["completed"] == 4);
  }
}

TEST_CASE("inspect says a crash while loading the next batch came after the step it names", "[inspect][story]") {
  test::TempDir dir;
  auto text = [&](const std::string& name, const std::string& phase) {
    stepsOf(dir.file(name), crashIn(phase), std::nullopt);
    return inspect::storyText(*BundleReader::open(dir.file(name)));
  };
  CHECK(text("a.ccap", "loading").find("CRASH      exception after step 3, phase loading") != std::string::npos);
  CHECK(text("b.ccap", "between-steps").find("CRASH      exception after step 3, phase between-steps") !=
        std::string::npos);
  CHECK(text("c.ccap", "forward").find("CRASH      exception at step 3, phase forward") != std::string::npos);
}

TEST_CASE("inspect lists an option the parameter groups set apart per group", "[inspect][story]") {
  test::TempDir dir;
  const std::string path = dir.file("groups.ccap");
  {
    auto w = BundleWriter::create(path);
    OptimizerSpecData o;
    o.kind = "adam";
    o.groups.push_back({{"encoder.weight"}, {{"lr", 0.001}, {"eps", 1e-8}}});
    o.groups.push_back({{"decoder.weight"}, {{"lr", 0.003}, {"eps", 1e-8}}});
    writeMetaRecord(*w, o);
    w->seal();
  }
  const auto text = inspect::storyText(*BundleReader::open(path));
  INFO(text);
  CHECK(text.find("optimizer  adam (2 group(s)) eps=1e-08 lr=0.001|0.003 (as first recorded)") != std::string::npos);
}
