// crashcap pack: the packed bundle replays to the same verdict, error and first non-finite op as
// the bundle it came from; it holds one keyframe, at the failing step when a bit-for-bit replay
// could write it (else the newest recorded one and the steps from it to the crash); it says what
// it holds, warns when the crash does not reproduce, and refuses bad input clearly.
#include <catch2/catch.hpp>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using nlohmann::json;

namespace {

std::string recordFault(const test::TempDir& dir, const std::string& sample, const std::string& fault, int steps,
                        int faultStep, int keyframeEvery) {
  auto r = test::run({test::binPath(sample), "--steps", std::to_string(steps), "--record", dir.path(), "--fault", fault,
                      "--fault-step", std::to_string(faultStep), "--fault-row", "2", "--keyframe-every",
                      std::to_string(keyframeEvery)},
                     300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  return bundles[0];
}

json runJson(const std::vector<std::string>& argv, int expectedExit = 0) {
  auto r = test::run(argv, 300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == expectedExit);
  return json::parse(r.out);
}

json replay(const std::string& bundle) {
  auto r = test::run({test::binPath("crashcap"), "replay", bundle, "--json"}, 300);
  INFO(r.out << r.err);
  REQUIRE((r.exitCode == 0 || r.exitCode == 1));
  return json::parse(r.out);
}

std::string opName(const json& replayed) {
  return replayed["first_nonfinite_op"].is_null() ? "" : replayed["first_nonfinite_op"]["name"].get<std::string>();
}

}  // namespace

TEST_CASE("a packed bundle replays every sample fault as the original does, from one keyframe at the failing step",
          "[investigate][pack]") {
  struct Case {
    const char* sample;
    const char* fault;
  };
  for (auto c : {Case{"crashcap-sample-cls", "nan-sample"}, Case{"crashcap-sample-cls", "bad-label"},
                 Case{"crashcap-sample-cls", "lr-blowup"}, Case{"crashcap-sample-seg", "nan-sample"},
                 Case{"crashcap-sample-seg", "dice-eps0"}, Case{"crashcap-sample-seg", "lr-blowup"}}) {
    INFO(c.sample << " --fault " << c.fault);
    test::TempDir dir;
    // Keyframes at 0, 4, 8: pack replays the crash from the one at 8, and the state the crash
    // step starts from becomes the packed bundle's one keyframe.
    const std::string bundle = recordFault(dir, c.sample, c.fault, 14, 9, 4);
    auto before = replay(bundle);
    REQUIRE(before["verdict"] == "reproduced-bitwise");
    const int64_t crashStep = before["step"];
    const std::string packed = dir.file("packed.ccap");
    auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", packed, "--json"});
    CHECK(p["out"] == packed);
    CHECK(p["too_large"] == false);
    CHECK(p["crash_step"] == crashStep);
    CHECK(p["replay"]["verdict"] == "reproduced-bitwise");
    CHECK(p["replay"]["from_keyframe"] == before["keyframe"]);
    CHECK(p["warnings"].empty());
    CHECK(p["packed_bytes"].get<uint64_t>() < p["original_bytes"].get<uint64_t>());
    CHECK(p["packed_bytes"].get<uint64_t>() == fs::file_size(packed));
    // A keyframe is materialised whenever the newest recorded one is before the crash step.
    const bool materialised = before["keyframe"].get<int64_t>() < crashStep;
    CHECK(p["replay"]["keyframe_materialised"] == materialised);
    CHECK(p["keyframe_step"] == crashStep);
    CHECK(p["first_step"] == crashStep);
    CHECK(p["last_step"] == crashStep);

    auto view = formats::readRecords(*formats::BundleReader::open(packed));
    REQUIRE(view.keyframes.size() == 1);
    CHECK(view.keyframes[0].step == crashStep);
    REQUIRE(view.stepBegins.size() == 1);
    CHECK(view.stepBegins[0].step == crashStep);
    CHECK(view.crash);
    CHECK(view.program);

    auto after = replay(packed);
    CHECK(after["verdict"] == "reproduced-bitwise");
    CHECK(after["keyframe"] == crashStep);
    CHECK(after["error"] == before["error"]);
    CHECK(opName(after) == opName(before));

    // Without the replay: the recorded keyframe and every step from it to the crash.
    const std::string unchecked = dir.file("unchecked.ccap");
    auto u = runJson({test::binPath("crashcap"), "pack", bundle, "-o", unchecked, "--no-replay", "--json"});
    CHECK(u["replay"].is_null());
    CHECK(u["keyframe_step"] == before["keyframe"]);
    CHECK(u["first_step"] == before["keyframe"]);
    CHECK(u["last_step"] == crashStep);
    auto afterUnchecked = replay(unchecked);
    CHECK(afterUnchecked["verdict"] == "reproduced-bitwise");
    CHECK(afterUnchecked["error"] == before["error"]);
    CHECK(opName(afterUnchecked) == opName(before));
  }
}

TEST_CASE("a crash far from its keyframe packs into one keyframe, at the failing step", "[investigate][pack]") {
  test::TempDir dir;
  // A keyframe every 50 steps and the crash at step 49: the bundle's only keyframe is step 0's.
  const std::string bundle = recordFault(dir, "crashcap-sample-seg", "nan-sample", 60, 49, 50);
  auto original = formats::readRecords(*formats::BundleReader::open(bundle));
  REQUIRE(original.keyframes.size() == 1);
  REQUIRE(original.keyframes[0].step == 0);
  const std::string packed = dir.file("packed.ccap");
  auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", packed, "--json"});
  CHECK(p["replay"]["keyframe_materialised"] == true);
  CHECK(p["keyframe_step"] == 49);
  CHECK(p["steps"] == 1);
  CHECK(p["steps_left_out"] == 49);
  CHECK(p["keyframes_left_out"] == 1);
  auto view = formats::readRecords(*formats::BundleReader::open(packed));
  REQUIRE(view.keyframes.size() == 1);
  CHECK(view.keyframes[0].step == 49);
  // The optimizer's state at step 49: SGD with momentum has a momentum buffer per parameter by
  // then, which step 0's keyframe did not.
  CHECK(view.keyframes[0].optimizerState.size() == view.keyframes[0].parameters.size());
  CHECK(original.keyframes[0].optimizerState.empty());
  REQUIRE(view.stepBegins.size() == 1);
  CHECK(view.stepBegins[0].step == 49);
  // The batches of 49 steps are left out: the attachment is a fraction of the bundle.
  CHECK(p["packed_bytes"].get<uint64_t>() * 3 < p["original_bytes"].get<uint64_t>());
  auto after = replay(packed);
  CHECK(after["verdict"] == "reproduced-bitwise");
  CHECK(after["keyframe"] == 49);
  CHECK(after["steps"].size() == 1);
  CHECK(opName(after) == opName(replay(bundle)));
}

TEST_CASE("when the replay departs from the recording, pack keeps the recorded keyframe and the steps after it",
          "[investigate][pack]") {
  test::TempDir dir;
  const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 14, 9, 4);
  // The fault-injection hook moves step 8's conv output by one ulp in the replay alone (a
  // nondeterministic kernel): step 8 no longer matches its fingerprint, so its state is unproven.
  const std::string packed = dir.file("packed.ccap");
  auto p = runJson({"/usr/bin/env", "CRASHCAP_FAULT_INJECT=op=aten::conv2d;step=8;mode=perturb", test::binPath("crashcap"),
                    "pack", bundle, "-o", packed, "--json"});
  CHECK(p["replay"]["verdict"] == "diverged");
  CHECK(p["replay"]["keyframe_materialised"] == false);
  CHECK(p["replay"]["keyframe_not_materialised"] == "step 8 did not replay bit for bit");
  CHECK(p["warnings"].dump().find("no keyframe at step 9: step 8 did not replay bit for bit") != std::string::npos);
  CHECK(p["keyframe_step"] == 8);
  CHECK(p["first_step"] == 8);
  CHECK(p["last_step"] == 9);
  CHECK(!fs::exists(packed + ".keyframe"));
  // Without the perturbation, the attachment replays as the recording did.
  CHECK(replay(packed)["verdict"] == "reproduced-bitwise");
}

TEST_CASE("pack on a bundle whose crash does not reproduce packs it anyway and says so", "[investigate][pack]") {
  test::TempDir dir;
  // The victim throws from its own loop, outside the step program: a replay runs the step clean.
  auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "exception", "--fail-step",
                      "6", "--steps", "10", "--keyframe-every", "4"},
                     300);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  const std::string packed = dir.file("packed.ccap");
  auto p = runJson({test::binPath("crashcap"), "pack", bundles[0], "-o", packed, "--json"});
  CHECK(p["replay"]["verdict"] == "not-reproduced");
  CHECK(p["warnings"].dump().find("does not reproduce") != std::string::npos);
  CHECK(fs::exists(packed));
  // The steps before the crash replayed bit for bit, so the keyframe is still the crash step's.
  CHECK(p["keyframe_step"] == 6);
  CHECK(replay(packed)["verdict"] == "not-reproduced");
  // The packed bundle keeps the fact in its note, where the report finds it.
  auto note = test::run({test::binPath("crashcap"), "report", packed, "--no-triage"});
  INFO(note.out << note.err);
  CHECK(note.out.find("does not reproduce") != std::string::npos);
}

TEST_CASE("pack --rows keeps only the crash step's culprit rows, with their dataset indices, and still reproduces",
          "[investigate][pack]") {
  for (const char* fault : {"nan-sample", "bad-label"}) {
    INFO(fault);
    test::TempDir dir;
    // Row 2 of step 5's batch of 32 carries the fault.
    const std::string bundle = recordFault(dir, "crashcap-sample-cls", fault, 8, 5, 4);
    auto before = replay(bundle);
    const std::string packed = dir.file("culprit.ccap");
    auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", packed, "--rows", "culprit", "--json"});
    CHECK(p["rows"] == json::array({2}));
    CHECK(p["batch_size"] == 32);
    CHECK(p["row_replays"].get<int>() > 0);
    CHECK(p["samples"] == 1);
    REQUIRE(p["dataset_indices"].size() == 1);
    CHECK(p["dataset_indices"][0]["indices"].size() == 1);
    CHECK(p["contents"][0].get<std::string>().find("1 training sample: row 2 of the 32 of step 5's batch, dataset index") == 0);
    auto view = formats::readRecords(*formats::BundleReader::open(packed));
    REQUIRE(view.stepBegins.size() == 1);
    auto reader = formats::BundleReader::open(packed);
    for (const auto& name : view.stepBegins[0].batch) {
      const auto* t = reader->find(name);
      REQUIRE(t);
      CHECK(t->shape.at(0) == 1);
    }
    // The whole batch's fingerprint went with the other rows.
    CHECK(view.stepEnds.empty());
    auto after = replay(packed);
    CHECK((after["verdict"] == "reproduced" || after["verdict"] == "reproduced-bitwise"));
    CHECK(after["error"].is_null() == before["error"].is_null());
    CHECK(after["keyframe"] == 5);
  }
  SECTION("a list of rows, and rows that are not rows") {
    test::TempDir dir;
    const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 8, 5, 4);
    auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("l.ccap"), "--rows", "5,2", "--json"});
    CHECK(p["rows"] == json::array({2, 5}));
    CHECK(p["samples"] == 2);
    CHECK(replay(dir.file("l.ccap"))["verdict"] == "reproduced");
    for (std::string bad : {"x", "2,,3", "32", "-1", ""}) {
      auto r = test::run({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("bad.ccap"), "--rows", bad});
      INFO(bad << ": " << r.err);
      CHECK(r.exitCode == 2);
      CHECK(!fs::exists(dir.file("bad.ccap")));
      CHECK(!fs::exists(dir.file("bad.ccap.keyframe")));
    }
  }
}

TEST_CASE("pack --zip writes the attachment an issue tracker takes: the bundle and its report, which replay",
          "[investigate][pack]") {
  test::TempDir dir;
  const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 8, 5, 4);
  const std::string zip = dir.file("crash.zip");
  auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", zip, "--zip", "--max-size", "25M", "--json"});
  CHECK(p["zip_entries"] == json::array({"crash.ccap", "report.md", "report.html"}));
  CHECK(p["packed_bytes"].get<uint64_t>() == fs::file_size(zip));
  CHECK(p["bundle_bytes"].get<uint64_t>() <= p["packed_bytes"].get<uint64_t>());
  CHECK(p["packed_replay"]["verdict"] == "reproduced-bitwise");
  CHECK(!fs::exists(zip + ".ccap.partial"));
  // Unpacked by another zip reader (Python's), the bundle replays and the report describes it.
  const std::string unpacked = dir.file("unpacked");
  auto u = test::run({"/usr/bin/python3", "-m", "zipfile", "-e", zip, unpacked});
  INFO(u.out << u.err);
  REQUIRE(u.exitCode == 0);
  CHECK(replay(unpacked + "/crash.ccap")["verdict"] == "reproduced-bitwise");
  const std::string md = test::readText(unpacked + "/report.md");
  CHECK(md.find("bundle: \"crash.ccap\"") != std::string::npos);
  CHECK(md.find("Replay: **reproduced-bitwise**") != std::string::npos);
  CHECK(md.find("## Attachment") != std::string::npos);
  CHECK(md.find("[report.html](report.html)") != std::string::npos);
  const std::string html = test::readText(unpacked + "/report.html");
  CHECK(html.find("Training crash at step 5") != std::string::npos);
  CHECK(html.find("Chart.js") != std::string::npos);
  CHECK(md.find("holds: 32 training samples: the batch of step 5") != std::string::npos);
  // --max-size is the zip's: too small, nothing is written.
  auto r = test::run({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("small.zip"), "--zip", "--max-size", "20K"}, 300);
  CHECK(r.exitCode == 1);
  CHECK(!fs::exists(dir.file("small.zip")));
  CHECK(!fs::exists(dir.file("small.zip.partial")));
  CHECK(!fs::exists(dir.file("small.zip.ccap.partial")));
  CHECK(!fs::exists(dir.file("small.zip.keyframe")));
}

TEST_CASE("pack says what the attachment holds: samples with their dataset indices, weights, no other data",
          "[investigate][pack]") {
  test::TempDir dir;
  const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 8, 5, 4);
  auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("p.ccap"), "--json"});
  REQUIRE(p["keyframe_step"] == 5);
  // Step 5 alone, batch 32 (the sample's default): 32 samples, each named by its dataset index.
  CHECK(p["samples"] == 32);
  REQUIRE(p["dataset_indices"].size() == 1);
  CHECK(p["dataset_indices"][0]["step"] == 5);
  CHECK(p["dataset_indices"][0]["indices"].size() == 32);
  auto contents = p["contents"].dump();
  CHECK(contents.find("32 training samples: the batch of step 5, dataset indices") != std::string::npos);
  CHECK(contents.find("weights, buffers and optimizer state at step 5") != std::string::npos);
  CHECK(p["contents"].back() == "no other data");
  CHECK(p["keyframes_left_out"] == 2);
  CHECK(p["steps_left_out"] == 5);
  // Without the replay, the recorded keyframe at 4 and steps 4..5.
  auto u = runJson({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("u.ccap"), "--no-replay", "--json"});
  CHECK(u["samples"] == 64);
  CHECK(u["contents"].dump().find("64 training samples: the batches of steps 4..5") != std::string::npos);
  CHECK(u["keyframes_left_out"] == 1);
  CHECK(u["steps_left_out"] == 4);
  // The text says the same for a person.
  auto r = test::run({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("q.ccap")});
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("holds\n  - 32 training samples") != std::string::npos);
  CHECK(r.out.find("written by the replay") != std::string::npos);
  CHECK(r.out.find("next: crashcap replay") != std::string::npos);
}

TEST_CASE("pack refuses bad input clearly and never leaves half a file", "[investigate][pack]") {
  test::TempDir dir;
  const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 8, 5, 4);
  const std::string crashcap = test::binPath("crashcap");
  const std::string out = dir.file("p.ccap");

  SECTION("an output that exists is replaced only with --force") {
    test::writeText(out, "mine");
    auto r = test::run({crashcap, "pack", bundle, "-o", out});
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("already exists") != std::string::npos);
    CHECK(r.err.find("--force") != std::string::npos);
    CHECK(test::readText(out) == "mine");
    r = test::run({crashcap, "pack", bundle, "-o", out, "--force"});
    CHECK(r.exitCode == 0);
    CHECK(formats::BundleReader::open(out)->report().complete());
  }
  SECTION("the input itself is never the output") {
    auto r = test::run({crashcap, "pack", bundle, "-o", bundle, "--force"});
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("same file") != std::string::npos);
  }
  SECTION("over --max-size: exit 1, nothing written, the largest parts named") {
    auto j = runJson({crashcap, "pack", bundle, "-o", out, "--max-size", "10K", "--json"}, 1);
    CHECK(j["too_large"] == true);
    CHECK(j["out"].is_null());
    CHECK(j["max_bytes"] == 10000);
    CHECK(j["packed_bytes"].get<uint64_t>() > 10000);
    CHECK(!j["parts"].empty());
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(out + ".partial"));
    auto r = test::run({crashcap, "pack", bundle, "-o", out, "--max-size", "10K"});
    CHECK(r.exitCode == 1);
    CHECK(r.out.find("over --max-size") != std::string::npos);
    CHECK(r.out.find("to shrink it") != std::string::npos);
    // A size that fits writes it.
    CHECK(test::run({crashcap, "pack", bundle, "-o", out, "--max-size", "25M"}).exitCode == 0);
  }
  SECTION("a size that is not one") {
    for (std::string bad : {"ten", "25X", "-3M", "M", ""}) {
      auto r = test::run({crashcap, "pack", bundle, "-o", out, "--max-size", bad});
      INFO(bad << ": " << r.err);
      CHECK(r.exitCode == 2);
      CHECK(!fs::exists(out));
    }
  }
  SECTION("a bundle cut short packs what is intact, with a warning") {
    auto bytes = test::readFile(bundle);
    const std::string cut = dir.file("cut.ccap");
    // Without its footer and index, and the end of its last record: a bundle whose writer died.
    test::writeFile(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() * 9 / 10)));
    auto r = test::run({crashcap, "pack", cut, "-o", out, "--json"});
    INFO(r.out << r.err);
    REQUIRE(r.exitCode == 0);
    auto j = json::parse(r.out);
    CHECK(j["warnings"].dump().find("is damaged") != std::string::npos);
    CHECK(formats::BundleReader::open(out)->report().complete());
  }
  SECTION("a file that is not a bundle") {
    const std::string junk = dir.file("junk.ccap");
    test::writeText(junk, "not a bundle at all");
    auto r = test::run({crashcap, "pack", junk, "-o", out});
    CHECK(r.exitCode == 2);
    CHECK(!fs::exists(out));
    r = test::run({crashcap, "pack", dir.file("missing.ccap"), "-o", out});
    CHECK(r.exitCode == 2);
    CHECK(r.err.find("no such file") != std::string::npos);
  }
}
