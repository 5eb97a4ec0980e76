// The run log and `crashcap summary`: hyperparameters from command lines and from the program,
// one runs.jsonl line per run, and the crashes of many real runs grouped and set apart.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"
#include "crashcap/supervisor/run_log.hpp"
#include "crashcap/supervisor/summary.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using nlohmann::json;

TEST_CASE("a command line's --name value options are its hyperparameters", "[summary]") {
  auto p = supervisor::commandLineParams({"python", "train.py", "--lr", "3e-4", "--label-smoothing=0.1", "--amp",
                                          "--offset", "-2", "--name", "x", "--lr", "9", "-v", "data/"});
  CHECK(p == std::vector<std::string>{"lr=3e-4", "label-smoothing=0.1", "amp=true", "offset=-2", "name=x"});
  CHECK(supervisor::commandLineParams({"python", "-m", "pkg", "--flag"}) == std::vector<std::string>{"flag=true"});
}

TEST_CASE("declared hyperparameters override the command line's; a damaged file is none, and says why", "[summary]") {
  test::TempDir dir;
  auto path = (fs::path(dir.path()) / "p.json").string();
  std::ofstream(path) << R"({"lr": 0.001, "amp": true, "optimizer": "adam"})";
  std::string problem;
  auto declared = supervisor::declaredParams(path, &problem);
  CHECK(problem.empty());
  CHECK(supervisor::mergeParams({"lr=3e-4", "epochs=3"}, declared) ==
        std::vector<std::string>{"lr=0.001", "epochs=3", "amp=true", "optimizer=adam"});
  std::ofstream(path) << R"({"lr": 0.0)";
  CHECK(supervisor::declaredParams(path, &problem).empty());
  CHECK_THAT(problem, Catch::Contains("holds no JSON object"));
  CHECK(supervisor::declaredParams((fs::path(dir.path()) / "missing.json").string()).empty());
}

TEST_CASE("error signatures blank what differs from run to run", "[summary]") {
  CHECK(supervisor::normalizeError("Traceback...\n  File \"x.py\", line 3\nIndexError: Target 12 is out of bounds.") ==
        "IndexError: Target N is out of bounds.");
  // A message over several lines: the exception's own first line names it.
  CHECK(supervisor::normalizeError("RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be "
                                   "asynchronously reported at some other API call") ==
        "RuntimeError: CUDA error: device-side assert triggered");
  CHECK(supervisor::normalizeError("fatal signal SIGSEGV at address 0x7f3a2c00") == "fatal signal SIGSEGV at address ADDR");
  CHECK(supervisor::normalizeError("non-finite loss at step 7: -nan") == "non-finite loss at step N: nan");
  CHECK(supervisor::normalizeError("RuntimeError: mat1 and mat2 shapes cannot be multiplied (30x12 and 10x32)") ==
        "RuntimeError: matN and matN shapes cannot be multiplied (NxN and NxN)");
}

TEST_CASE("crashcap run keeps a line per run with its hyperparameters, and summary groups and sets apart the crashes",
          "[summary][run]") {
  test::TempDir dir;
  auto runs = (fs::path(dir.path()) / "runs").string();
  // Twelve runs of one command: lr 0.1 and above dies of the same error, whatever the seed; the
  // batch size varies without mattering; one run declares its optimizer itself, and dies of another.
  int failing = 0;
  for (int k = 0; k < 12; ++k) {
    const char* lr = k % 4 == 3 ? "0.3" : (k % 4 == 2 ? "0.1" : "0.01");
    std::string script = std::string("case \"$2\" in 0.3|0.1) echo 'Traceback (most recent call last):' >&2; ") +
                         "echo \"RuntimeError: loss exploded at step $((" + std::to_string(k) + " + 3))\" >&2; exit 1;; esac";
    if (k == 5) script = "printf '{\"optimizer\": \"lion\"}' > \"$CRASHCAP_PARAMS_FILE\"; kill -SEGV $$";
    failing += (k % 4 >= 2 || k == 5);
    auto r = test::run({test::binPath("crashcap"), "run", "--dir", runs, "--", "/bin/sh", "-c", script, "train",
                        "--lr", lr, "--batch", std::to_string(16 << (k % 3)), "--seed", std::to_string(k)},
                       120);
    INFO(r.err);
  }
  std::ifstream log(fs::path(runs) / supervisor::kRunLogName);
  std::vector<json> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(json::parse(line));
  REQUIRE(lines.size() == 12);
  CHECK(lines[0]["params"]["lr"] == "0.01");
  CHECK(lines[0]["classification"] == "");
  CHECK(lines[5]["params"]["optimizer"] == "lion");
  CHECK(lines[5]["classification"] == "signal");
  // Junk beside the runs: listed, never fatal.
  std::ofstream(fs::path(runs) / "notes.txt") << "tried lr 0.3\n";
  std::ofstream(fs::path(runs) / "partial.ccap") << "\x89" "CCAP not really";

  auto s = supervisor::summarizeCrashes(runs);
  CHECK(s.runs.size() == 12);
  CHECK(s.failed == size_t(failing));
  CHECK(s.healthy == size_t(12 - failing));
  REQUIRE(s.groups.size() == 2);
  const auto& exploded = s.groups[0];
  CHECK(exploded.classification == "python-exception");
  CHECK(exploded.signature == "RuntimeError: loss exploded at step N | - | -");
  CHECK(exploded.runs.size() == 6);
  REQUIRE(!exploded.separatedBy.empty());
  CHECK(exploded.separatedBy[0].rule == "lr >= 0.1");
  CHECK(exploded.separatedBy[0].healthy == 0);
  CHECK(s.groups[1].classification == "signal");
  CHECK(s.groups[1].runs.size() == 1);
  CHECK(s.groups[1].separatedBy.empty());  // one run says nothing about a parameter
  REQUIRE(s.unreadable.size() == 1);
  CHECK(s.unreadable[0].first == "partial.ccap");
  CHECK(std::find(s.skipped.begin(), s.skipped.end(), "notes.txt") != s.skipped.end());
  auto j = supervisor::crashSummaryJson(s);
  CHECK(j["groups"][0]["count"] == 6);
  CHECK(j["groups"][0]["separated_by"][0]["rule"] == "lr >= 0.1");
  CHECK_THAT(supervisor::crashSummaryText(s), Catch::Contains("apart   lr >= 0.1: all 6 of these, 0 of 5 healthy runs"));

  auto cli = test::run({test::binPath("crashcap"), "summary", runs, "--json"});
  CHECK(cli.exitCode == 0);
  CHECK(json::parse(cli.out)["failed"] == failing);
  auto missing = test::run({test::binPath("crashcap"), "summary", (fs::path(runs) / "nope").string()});
  CHECK(missing.exitCode == 2);
  CHECK_THAT(missing.err, Catch::Contains("is not a directory"));
}

TEST_CASE("summary: a lone --flag sets its runs apart, and a clean run's sealed crash counts once", "[summary][run]") {
  test::TempDir dir;
  auto runs = (fs::path(dir.path()) / "runs").string();
  auto crashcapRun = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {test::binPath("crashcap"), "run", "--dir", runs, "--", "/bin/sh", "-c"};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::run(argv, 120);
  };
  const std::string script =
      "case \"$*\" in *--amp*) echo 'Traceback (most recent call last):' >&2; "
      "echo 'RuntimeError: CUDA error: misaligned address' >&2; exit 1;; esac";
  for (int k = 0; k < 6; ++k) {
    std::vector<std::string> args = {script, "train", "--width", std::to_string(8 << k)};
    if (k % 2 == 1) args.push_back("--amp");
    crashcapRun(args);
  }
  auto s = supervisor::summarizeCrashes(runs);
  REQUIRE(s.groups.size() == 1);
  REQUIRE(!s.groups[0].separatedBy.empty());
  CHECK(s.groups[0].separatedBy[0].rule == "amp = true");
  CHECK(s.groups[0].separatedBy[0].healthy == 0);
  CHECK(s.groups[0].separatedBy[0].healthyTotal == 3);

  // A run that exits 0 after its program sealed a crash of its own (it went on): one run, crashed.
  auto bundle = s.groups[0].runs[0]->bundle;
  REQUIRE(!bundle.empty());
  auto r = crashcapRun({"cp '" + bundle + "' \"$CRASHCAP_DIR/crash-20990101T000000Z-1.ccap\"", "train", "--width", "1"});
  CHECK(r.exitCode == 0);
  auto again = supervisor::summarizeCrashes(runs);
  CHECK(again.runs.size() == 7);
  CHECK(again.failed == 4);
  CHECK(again.healthy == 3);
}

TEST_CASE("a run directory's listing goes into subdirectories, not through links, and names what it cannot list",
          "[summary]") {
  test::TempDir dir;
  test::TempDir elsewhere;
  const fs::path root = dir.path();
  fs::create_directories(root / "trials" / "trial-0001");
  test::writeText((root / "trials" / "trial-0001" / "crash-1.ccap").string(), "not a bundle");
  test::writeText((root / "notes.txt").string(), "x");
  fs::create_directory(root / ".trial");
  test::writeText((root / ".trial" / "hidden.ccap").string(), "x");
  test::writeText(elsewhere.file("outside.ccap"), "x");
  fs::create_directory_symlink(elsewhere.path(), root / "linked");

  auto listing = supervisor::listRunDir(root.string());
  CHECK(listing.bundles == std::vector<std::string>{(root / "trials" / "trial-0001" / "crash-1.ccap").string()});
  CHECK(listing.skipped == std::vector<std::string>{"notes.txt"});
  CHECK(listing.unreadable.empty());

  if (::geteuid() == 0) {
    WARN("the unreadable directory is not checked: root lists a directory it has no permission on");
    return;
  }
  fs::create_directory(root / "locked");
  test::writeText((root / "locked" / "crash-2.ccap").string(), "x");
  fs::permissions(root / "locked", fs::perms::none);
  listing = supervisor::listRunDir(root.string());
  fs::permissions(root / "locked", fs::perms::owner_all);
  REQUIRE(listing.unreadable.size() == 1);
  CHECK(listing.unreadable[0].first == "locked");
  CHECK(listing.unreadable[0].second == "cannot open it: Permission denied");
  CHECK(listing.bundles.size() == 1);  // the walk went on past it
}
