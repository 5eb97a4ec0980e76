// End-to-end tests of the `crashcap` binary: real files, real child processes, exit codes,
// JSON output, and the corrupt-file corpus with its expected messages.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/recorder/environment.hpp"
#include "test_support.hpp"

using crashcap::test::run;
using crashcap::test::RunResult;
using crashcap::test::TempDir;
using nlohmann::json;

namespace {

const std::string kPython = "/usr/bin/python3";

RunResult cli(std::vector<std::string> args) {
  args.insert(args.begin(), crashcap::test::binPath("crashcap"));
  return run(args, 300);
}

json parse(const RunResult& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  return json::parse(r.out);
}

/// Runs python code with numpy/torch; the test fails (not skips) when python cannot run it.
std::string python(const std::string& code) {
  auto r = run({kPython, "-c", code}, 300);
  INFO("python stderr: " << r.err);
  REQUIRE(r.exitCode == 0);
  return r.out;
}

std::string corpus(const std::string& name) { return crashcap::test::sourceDir() + "/tests/corpus/" + name; }

}  // namespace

TEST_CASE("import, ls, show, export round-trip numpy arrays through a bundle", "[cli][e2e]") {
  TempDir dir;
  python("import numpy as np\n"
         "w = np.linspace(-2, 2, 24, dtype=np.float32).reshape(2, 3, 4); w[1, 2, 3] = np.nan; w[0, 1, 0] = np.inf\n"
         "np.save('" + dir.file("w.npy") + "', w)\n"
         "np.save('" + dir.file("l.npy") + "', np.array([3, 1, 4, 1, 5], dtype=np.int64))\n"
         "np.save('" + dir.file("big.npy") + "', np.arange(100000, dtype=np.float64).reshape(100, 1000))\n");
  auto imp = cli({"import", dir.file("b.ccap"), "weights/w=" + dir.file("w.npy"), "labels=" + dir.file("l.npy"),
                       "big=" + dir.file("big.npy"), "--note", "user.comment=loss NaN at step 7"});
  INFO(imp.err);
  REQUIRE(imp.exitCode == 0);

  auto ls = parse(cli({"ls", dir.file("b.ccap"), "--json"}));
  REQUIRE(ls["tensors"].size() == 3);
  CHECK(ls["tensors"][0]["name"] == "weights/w");
  CHECK(ls["tensors"][0]["dtype"] == "float32");
  CHECK(ls["tensors"][0]["shape"] == json::array({2, 3, 4}));

  auto info = parse(cli({"info", dir.file("b.ccap"), "--json"}));
  CHECK(info["state"]["sealed"] == true);
  CHECK(info["state"]["complete"] == true);
  CHECK(info["producer"] == "crashcap import");
  bool hasNote = false;
  for (const auto& n : info["notes"]) hasNote |= n["text"] == "loss NaN at step 7";
  CHECK(hasNote);

  auto show = parse(cli({"show", dir.file("b.ccap"), "weights/w", "--stats", "--json"}));
  CHECK(show["stats"]["nan_count"] == 1);
  CHECK(show["stats"]["first_nan"] == json::array({1, 2, 3}));
  CHECK(show["stats"]["first_inf"] == json::array({0, 1, 0}));
  CHECK(show["stats"]["count"] == 24);

  auto sliced = parse(cli({"show", dir.file("b.ccap"), "big", "--slice", "-1, 998:", "--json"}));
  CHECK(sliced["slice_shape"] == json::array({2}));
  CHECK_THAT(sliced["text"].get<std::string>(), Catch::Contains("99998") && Catch::Contains("99999"));
  auto summarized = cli({"show", dir.file("b.ccap"), "big"});
  CHECK(summarized.exitCode == 0);
  CHECK_THAT(summarized.out, Catch::Contains("..."));
  CHECK(summarized.out.size() < 4000);

  REQUIRE(cli({"export", dir.file("b.ccap"), "weights/w", "--npy", dir.file("out.npy")}).exitCode == 0);
  CHECK(python("import numpy as np\n"
               "a = np.load('" + dir.file("w.npy") + "'); b = np.load('" + dir.file("out.npy") + "')\n"
               "print(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())\n") == "True\n");
}

TEST_CASE("export --pt writes a file that Python's torch.load reads", "[cli][e2e][torch]") {
  TempDir dir;
  python("import numpy as np\nnp.save('" + dir.file("x.npy") + "', np.arange(12, dtype=np.int32).reshape(3, 4))\n");
  REQUIRE(cli({"import", dir.file("b.ccap"), "x=" + dir.file("x.npy")}).exitCode == 0);
  auto e = cli({"export", dir.file("b.ccap"), "x", "--pt", dir.file("x.pt")});
  INFO(e.err);
#ifndef CRASHCAP_HAVE_TORCH
  // A build without LibTorch says so instead of writing a file Python cannot load.
  CHECK(e.exitCode == 2);
  CHECK_THAT(e.err, Catch::Contains("built without LibTorch"));
  return;
#endif
  REQUIRE(e.exitCode == 0);
  CHECK(python("import torch\nt = torch.load('" + dir.file("x.pt") + "')\n"
               "print(t.dtype, list(t.shape), int(t.sum()))\n") == "torch.int32 [3, 4] 66\n");
}

TEST_CASE("the corrupt-file corpus gives the expected exit codes and messages", "[cli][corpus]") {
  auto expected = json::parse(crashcap::test::readText(corpus("expected.json")));
  const std::string corpusDir = crashcap::test::sourceDir() + "/tests/corpus";
  for (const auto& [name, e] : expected.items()) {
    if (name[0] == '_') continue;
    INFO("corpus file " << name);
    auto info = cli({"info", corpus(name), "--json"});
    CHECK(info.exitCode == e["info_exit"]);
    if (e.contains("stderr_exact")) {
      std::string want = e["stderr_exact"];
      want.replace(want.find("CORPUS"), 6, corpusDir);
      CHECK(cli({"info", corpus(name)}).err == want);
    }
    if (info.exitCode == 0) {
      auto j = parse(info);
      CHECK(j["state"]["complete"] == e["complete"]);
      CHECK_THAT(j["state"]["summary"].get<std::string>(), Catch::Contains(e["summary_contains"].get<std::string>()));
      auto ls = parse(cli({"ls", corpus(name), "--json"}));
      std::vector<std::string> names;
      for (const auto& t : ls["tensors"]) names.push_back(t["name"]);
      CHECK(names == e["tensors"].get<std::vector<std::string>>());
    }
    auto verify = cli({"verify", corpus(name)});
    CHECK(verify.exitCode == e["verify_exit"]);
    if (e.contains("verify_contains"))
      CHECK_THAT(verify.out, Catch::Contains(e["verify_contains"].get<std::string>()));
    if (e.contains("show")) {
      auto show = cli({"show", corpus(name), e["show"]["name"]});
      CHECK(show.exitCode == e["show"]["exit"]);
      CHECK_THAT(show.err, Catch::Contains(e["show"]["stderr_contains"].get<std::string>()));
    }
  }
}

TEST_CASE("info on a truncated bundle says where it was cut and what was lost", "[cli][recovery]") {
  TempDir dir;
  auto good = crashcap::test::readFile(corpus("good.ccap"));
  // Cut inside batch/images' chunk record (bytes 6335..6802 of good.ccap, see
  // make_corpus.py's output): weights and labels survive, images are lost.
  uint64_t cut = 6335 + 200;
  crashcap::test::writeFile(dir.file("cut.ccap"),
                            std::vector<uint8_t>(good.begin(), good.begin() + long(cut)));
  auto info = cli({"info", dir.file("cut.ccap")});
  CHECK(info.exitCode == 0);
  CHECK_THAT(info.out, Catch::Contains("truncated at byte " + std::to_string(cut) + " (crash during recording?)"));
  CHECK_THAT(info.out, Catch::Contains("lost       tensor 'batch/images'"));
  CHECK_THAT(info.out, Catch::Contains("crashcap recover"));
  auto j = parse(cli({"info", dir.file("cut.ccap"), "--json"}));
  CHECK(j["state"]["lost_tensors"][0]["name"] == "batch/images");
  CHECK(j["state"]["truncated_at"].is_number());

  auto before = crashcap::test::readFile(dir.file("cut.ccap"));
  auto rec = cli({"recover", dir.file("cut.ccap"), dir.file("fixed.ccap"), "--json"});
  INFO(rec.err);
  REQUIRE(rec.exitCode == 0);
  CHECK(parse(rec)["tensors_copied"] == 2);
  CHECK(crashcap::test::readFile(dir.file("cut.ccap")) == before);
  auto v = cli({"verify", dir.file("fixed.ccap"), "--json"});
  CHECK(v.exitCode == 0);
  CHECK(parse(v)["ok"] == true);
  auto again = cli({"recover", dir.file("cut.ccap"), dir.file("fixed.ccap")});
  CHECK(again.exitCode == 2);
  CHECK_THAT(again.err, Catch::Contains("already exists"));
}

TEST_CASE("verify exits 1 and names the record and byte offset of a flipped bit", "[cli][verify]") {
  TempDir dir;
  auto bytes = crashcap::test::readFile(corpus("good.ccap"));
  bytes[6000] ^= 0x04;  // inside the labels chunk record (bytes 5967..6167)
  crashcap::test::writeFile(dir.file("flip.ccap"), bytes);
  auto v = cli({"verify", dir.file("flip.ccap")});
  CHECK(v.exitCode == 1);
  CHECK_THAT(v.out, Catch::Contains("at byte 5967"));
  auto j = parse(cli({"verify", dir.file("flip.ccap"), "--json"}));
  CHECK(j["ok"] == false);
  bool located = false;
  for (const auto& p : j["problems"])
    located |= p["offset"].get<uint64_t>() <= 6000 && 6000 < p["offset"].get<uint64_t>() + p["length"].get<uint64_t>();
  CHECK(located);
}

TEST_CASE("bad input and usage exit 2 with a message that says what is wrong", "[cli][errors]") {
  TempDir dir;
  auto missing = cli({"info", dir.file("nope.ccap")});
  CHECK(missing.exitCode == 2);
  CHECK(missing.err == "crashcap: error: no such file: " + dir.file("nope.ccap") + "\n");

  auto unknown = cli({"show", corpus("good.ccap"), "images"});
  CHECK(unknown.exitCode == 2);
  CHECK_THAT(unknown.err, Catch::Contains("no tensor named 'images'") && Catch::Contains("did you mean batch/images"));

  auto badSlice = cli({"show", corpus("good.ccap"), "batch/labels", "--slice", "9"});
  CHECK(badSlice.exitCode == 2);
  CHECK_THAT(badSlice.err, Catch::Contains("9"));

  auto json = cli({"show", corpus("good.ccap"), "images", "--json"});
  CHECK(json.exitCode == 2);
  CHECK(parse(json)["error"]["code"] == "not-found");

  CHECK(cli({"frobnicate"}).exitCode == 2);
  CHECK(cli({"info"}).exitCode == 2);
  auto help = cli({"--help"});
  CHECK(help.exitCode == 0);
  CHECK_THAT(help.out, Catch::Contains("Exit codes") && Catch::Contains("verify") && Catch::Contains("recover"));

  crashcap::test::writeText(dir.file("bad.npy"), "\x93NUMPY\x01\x00garbage");
  auto imp = cli({"import", dir.file("out.ccap"), "x=" + dir.file("bad.npy")});
  CHECK(imp.exitCode == 2);
  CHECK_THAT(imp.err, Catch::Contains(dir.file("bad.npy")));
  CHECK_FALSE(std::filesystem::exists(dir.file("out.ccap")));
  CHECK_FALSE(std::filesystem::exists(dir.file("out.ccap.partial")));
  auto noEq = cli({"import", dir.file("out.ccap"), dir.file("bad.npy")});
  CHECK(noEq.exitCode == 2);
  CHECK_THAT(noEq.err, Catch::Contains("NAME=FILE.npy"));
}

TEST_CASE("info shows the recorded environment with secrets withheld", "[cli][env]") {
  TempDir dir;
  setenv("HF_TOKEN", "hf_never_shown_5150", 1);
  setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  {
    auto w = crashcap::formats::BundleWriter::create(dir.file("b.ccap"));
    w->writeEnvironment(crashcap::recorder::captureEnvironment());
    w->seal();
  }
  unsetenv("HF_TOKEN");
  unsetenv("CUDA_LAUNCH_BLOCKING");
  auto text = cli({"info", dir.file("b.ccap")});
  CHECK(text.exitCode == 0);
  CHECK_THAT(text.out, Catch::Contains("WSL2: no") && Catch::Contains("env        CUDA_LAUNCH_BLOCKING=1") &&
                           Catch::Contains("redacted") && Catch::Contains("HF_TOKEN"));
  CHECK(text.out.find("hf_never_shown") == std::string::npos);
  auto j = parse(cli({"info", dir.file("b.ccap"), "--json"}));
  CHECK(j["env"]["variables"]["HF_TOKEN"] == "<redacted>");
  CHECK(j["env"]["variables"]["CUDA_LAUNCH_BLOCKING"] == "1");
  CHECK(j["env"]["facts"]["os.wsl2"] == "no");
}

TEST_CASE("seal and inspect refuse what is not a recording or a bundle, with exit 2 and a hint", "[cli][errors][seal]") {
  TempDir dir;
  auto empty = cli({"seal", dir.path()});
  CHECK(empty.exitCode == 2);
  CHECK(empty.err.find("holds no recording") != std::string::npos);
  CHECK(empty.err.find("hint") != std::string::npos);
  auto missing = cli({"seal", dir.file("nope"), "--json"});
  CHECK(missing.exitCode == 2);
  CHECK(parse(missing)["error"]["code"] == "not-found");
  crashcap::test::writeText(dir.file("text.ccap"), "not a bundle at all");
  auto notBundle = cli({"inspect", dir.file("text.ccap")});
  CHECK(notBundle.exitCode == 2);
  CHECK(notBundle.err.find("not a crashcap bundle") != std::string::npos);
  // A plain bundle without recorder records: inspect says there is no crash and no steps.
  {
    auto w = crashcap::formats::BundleWriter::create(dir.file("plain.ccap"));
    w->seal();
  }
  auto plain = cli({"inspect", dir.file("plain.ccap"), "--json"});
  REQUIRE(plain.exitCode == 0);
  auto j = parse(plain);
  CHECK(j["crash"].is_null());
  CHECK(j["steps"]["count"] == 0);
  CHECK(j["keyframes"].empty());
  CHECK(j["dropped_records"] == 0);
  CHECK(j["env"].is_object());
}
