// crashcap pack: the packed bundle replays to the same verdict, error and first non-finite op as
// the bundle it came from, holds one keyframe and the steps from it to the crash, says what it
// holds, and refuses bad input clearly.
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

TEST_CASE("a packed bundle replays every sample fault as the original does, from one keyframe", "[investigate][pack]") {
  struct Case {
    const char* sample;
    const char* fault;
  };
  for (auto c : {Case{"crashcap-sample-cls", "nan-sample"}, Case{"crashcap-sample-cls", "bad-label"},
                 Case{"crashcap-sample-cls", "lr-blowup"}, Case{"crashcap-sample-seg", "nan-sample"},
                 Case{"crashcap-sample-seg", "dice-eps0"}, Case{"crashcap-sample-seg", "lr-blowup"}}) {
    INFO(c.sample << " --fault " << c.fault);
    test::TempDir dir;
    // Keyframes at 0, 4, 8: the crash at step 9 needs the one at 8 and steps 8..9.
    const std::string bundle = recordFault(dir, c.sample, c.fault, 14, 9, 4);
    const std::string packed = dir.file("packed.ccap");
    auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", packed, "--json"});
    CHECK(p["out"] == packed);
    CHECK(p["too_large"] == false);
    const int64_t crashStep = p["crash_step"];
    const int64_t keyframe = p["keyframe_step"];
    CHECK(keyframe <= crashStep);
    CHECK(p["first_step"] == keyframe);
    CHECK(p["last_step"] == crashStep);
    CHECK(p["packed_bytes"].get<uint64_t>() < p["original_bytes"].get<uint64_t>());
    CHECK(p["packed_bytes"].get<uint64_t>() == fs::file_size(packed));

    auto view = formats::readRecords(*formats::BundleReader::open(packed));
    REQUIRE(view.keyframes.size() == 1);
    CHECK(view.keyframes[0].step == keyframe);
    std::set<int64_t> steps;
    for (const auto& s : view.stepBegins) steps.insert(s.step);
    CHECK(*steps.begin() == keyframe);
    CHECK(*steps.rbegin() == crashStep);
    CHECK(steps.size() == static_cast<size_t>(crashStep - keyframe + 1));
    CHECK(view.crash);
    CHECK(view.program);

    auto before = replay(bundle);
    auto after = replay(packed);
    CHECK(after["verdict"] == before["verdict"]);
    CHECK(after["error"] == before["error"]);
    CHECK(opName(after) == opName(before));
    CHECK(after["verdict"] == "reproduced-bitwise");
  }
}

TEST_CASE("pack says what the attachment holds: samples with their dataset indices, weights, no other data",
          "[investigate][pack]") {
  test::TempDir dir;
  const std::string bundle = recordFault(dir, "crashcap-sample-cls", "nan-sample", 8, 5, 4);
  auto p = runJson({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("p.ccap"), "--json"});
  REQUIRE(p["keyframe_step"] == 4);
  // Steps 4 and 5, batch 32 (the sample's default): 64 samples, each named by its dataset index.
  CHECK(p["samples"] == 64);
  REQUIRE(p["dataset_indices"].size() == 2);
  CHECK(p["dataset_indices"][0]["step"] == 4);
  CHECK(p["dataset_indices"][0]["indices"].size() == 32);
  auto contents = p["contents"].dump();
  CHECK(contents.find("64 training samples: the batches of steps 4..5, dataset indices") != std::string::npos);
  CHECK(contents.find("weights, buffers and optimizer state at step 4") != std::string::npos);
  CHECK(p["contents"].back() == "no other data");
  CHECK(p["keyframes_left_out"] == 1);
  CHECK(p["steps_left_out"] == 4);
  // The text says the same for a person.
  auto r = test::run({test::binPath("crashcap"), "pack", bundle, "-o", dir.file("q.ccap")});
  REQUIRE(r.exitCode == 0);
  CHECK(r.out.find("holds\n  - 64 training samples") != std::string::npos);
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
