// A damaged bundle is said to be damaged before any verdict. A bundle cut short can look like a
// smaller, whole recording (cut after a step, it replays that step "bit for bit"), so replay,
// bisect and triage run verify's check first and refuse, saying what is lost; they never end by
// a signal or a timeout on such a file.
#include <catch2/catch.hpp>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/investigate/intact.hpp"
#include "test_support.hpp"

using namespace crashcap;

namespace {

std::string sampleBundle(const test::TempDir& dir) {
  auto r = test::run({test::binPath("crashcap-sample-cls"), "--steps", "8", "--record", dir.path(), "--fault", "nan-sample",
                      "--fault-step", "5", "--fault-row", "1", "--keyframe-every", "4"},
                     300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  return bundles[0];
}

std::string cutCopy(const std::vector<uint8_t>& bytes, uint64_t length, const std::string& path) {
  test::writeFile(path, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(length)));
  return path;
}

}  // namespace

TEST_CASE("a bundle cut at any record boundary is found damaged, and replay, bisect and triage say so first",
          "[investigate][damaged]") {
  test::TempDir dir;
  const std::string bundle = sampleBundle(dir);
  CHECK_FALSE(investigate::findDamage(bundle));
  const auto bytes = test::readFile(bundle);
  std::vector<uint64_t> cuts = {16, 1024};
  auto reader = formats::BundleReader::open(bundle);
  for (const auto& r : reader->records()) cuts.push_back(r.offset);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  INFO(cuts.size() << " cuts");
  REQUIRE(cuts.size() > 20);

  const std::string cut = dir.file("cut.ccap");
  for (uint64_t at : cuts) {
    INFO("cut at byte " << at << " of " << bytes.size());
    cutCopy(bytes, at, cut);
    auto damage = investigate::findDamage(cut);
    REQUIRE(damage);
    CHECK(!damage->problems.empty());
    CHECK_FALSE(damage->sealed);
    CHECK(damage->describe(cut).find(cut + " is damaged (") == 0);
  }

  // The commands, on a spread of the cuts (each is a child process that loads LibTorch).
  const size_t every = std::max<size_t>(1, cuts.size() / 6);
  for (size_t i = 0; i < cuts.size(); i += every) {
    INFO("cut at byte " << cuts[i]);
    cutCopy(bytes, cuts[i], cut);
    for (std::vector<std::string> args : {std::vector<std::string>{"replay", cut}, {"replay", cut, "--json"},
                                          {"bisect", "steps", cut}, {"bisect", "samples", cut}, {"triage", cut},
                                          {"report", cut}}) {
      args.insert(args.begin(), test::binPath("crashcap"));
      auto r = test::run(args, 120);
      INFO(args[1] << " " << args[2] << ": " << r.out << r.err);
      CHECK(r.exitCode == 2);  // bad input, never a signal or a timeout
      CHECK(r.err.find(cut + " is damaged (") != std::string::npos);
      CHECK(r.err.find("crashcap recover") != std::string::npos);
      CHECK(r.out.find("reproduced") == std::string::npos);  // no verdict of any kind
      if (args.back() == "--json") CHECK(nlohmann::json::parse(r.out)["error"]["code"] == "corrupt");
    }
  }

  // --allow-damaged goes on, saying what the verdict stands on.
  cutCopy(bytes, cuts[cuts.size() / 2], cut);
  auto r = test::run({test::binPath("crashcap"), "replay", cut, "--allow-damaged"}, 300);
  INFO(r.out << r.err);
  CHECK(r.exitCode == 0);
  CHECK(r.err.find("is damaged") != std::string::npos);
  CHECK(r.err.find("going on: --allow-damaged") != std::string::npos);
  CHECK(r.out.find("verdict  ") != std::string::npos);

  // What `crashcap recover` keeps of it passes verify, but has lost the crash record: still refused.
  const std::string recovered = dir.file("recovered.ccap");
  auto rec = test::run({test::binPath("crashcap"), "recover", cut, recovered}, 120);
  INFO(rec.out << rec.err);
  REQUIRE(rec.exitCode == 0);
  CHECK(test::run({test::binPath("crashcap"), "verify", recovered}, 120).exitCode == 0);
  auto again = test::run({test::binPath("crashcap"), "replay", recovered}, 120);
  INFO(again.out << again.err);
  CHECK(again.exitCode == 2);
  CHECK(again.err.find("recovered from a damaged file") != std::string::npos);

  // The intact bundle is not refused.
  CHECK(test::run({test::binPath("crashcap"), "replay", bundle}, 300).exitCode == 0);
}
