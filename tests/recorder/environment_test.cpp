// The environment fingerprint: the facts a crash report needs, and never a secret's value.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/recorder/environment.hpp"
#include "test_support.hpp"

using namespace crashcap::recorder;

TEST_CASE("secret-looking names are recognised, ordinary ones are not", "[recorder][env]") {
  for (const char* name : {"WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "db_password",
                           "GITHUB_TOKEN", "OPENAI_API_KEY", "MY_CREDENTIALS", "api-key", "auth_header",
                           "SESSION_ID", "HUGGING_FACE_HUB_TOKEN", "wandb_project", "KEYFRAME_KEY",
                           "my_keyframe_token"})
    CHECK(isSecretName(name));
  for (const char* name : {"CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_DEBUG", "HOME", "PATH",
                           "OMP_NUM_THREADS", "lr", "--batch-size", "--keyframe-every", "TOKENIZERS_PARALLELISM"})
    CHECK_FALSE(isSecretName(name));
}

TEST_CASE("variables that change CUDA and PyTorch behaviour are relevant", "[recorder][env]") {
  for (const char* name : {"CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF",
                           "TORCH_USE_CUDA_DSA", "NCCL_P2P_DISABLE", "CUDNN_LOGLEVEL_DBG", "OMP_NUM_THREADS",
                           "LD_LIBRARY_PATH", "WANDB_API_KEY"})
    CHECK(isRelevantVariable(name));
  for (const char* name : {"HOME", "TERM", "SHLVL"}) CHECK_FALSE(isRelevantVariable(name));
}

TEST_CASE("command lines keep their shape with secret values redacted", "[recorder][env]") {
  std::vector<std::string> args = {"python", "train.py", "--lr", "3e-5", "--api-key", "sk-live-123",
                                   "--token=abc", "password=hunter2", "--wandb-key", "k", "--epochs=5"};
  auto out = redactArguments(args);
  REQUIRE(out.size() == args.size());
  CHECK(out[3] == "3e-5");
  CHECK(out[4] == "--api-key");
  CHECK(out[5] == "<redacted>");
  CHECK(out[6] == "--token=<redacted>");
  CHECK(out[7] == "password=<redacted>");
  CHECK(out[9] == "<redacted>");
  CHECK(out[10] == "--epochs=5");
}

TEST_CASE("WSL2 is recognised from the kernel's own strings", "[recorder][env]") {
  CHECK(looksLikeWsl("Linux version 5.15.90.1-microsoft-standard-WSL2 (oe-user@oe-host)", ""));
  CHECK(looksLikeWsl("", "5.15.153.1-microsoft-standard-WSL2"));
  CHECK_FALSE(looksLikeWsl("Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)", "6.1.0-18-amd64"));
}

TEST_CASE("the captured environment holds CUDA settings and never a secret's value", "[recorder][env]") {
  setenv("WANDB_API_KEY", "wandb-secret-value-7731", 1);
  setenv("HF_TOKEN", "hf_secret_value_9913", 1);
  setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  for (bool all : {false, true}) {
    EnvironmentOptions options;
    options.allVariables = all;
    auto env = captureEnvironment(options);
    bool blocking = false, wandbListed = false, homeListed = false;
    for (const auto& [name, value] : env.variables) {
      CHECK(value.find("secret_value") == std::string::npos);
      CHECK(value.find("secret-value") == std::string::npos);
      blocking |= name == "CUDA_LAUNCH_BLOCKING" && value == "1";
      wandbListed |= name == "WANDB_API_KEY" && value == "<redacted>";
      homeListed |= name == "HOME";
    }
    CHECK(blocking);
    CHECK(wandbListed);
    CHECK(homeListed == all);
    for (const auto& [k, v] : env.facts) CHECK(v.find("secret") == std::string::npos);
    CHECK(std::find(env.redacted.begin(), env.redacted.end(), "HF_TOKEN") != env.redacted.end());
    CHECK(env.fact("os.wsl2") == "no");
    CHECK(std::stoi(env.fact("cpu.logical")) > 0);
    CHECK_FALSE(env.fact("crashcap.version").empty());
    CHECK_FALSE(env.commandLine.empty());
  }
  unsetenv("WANDB_API_KEY");
  unsetenv("HF_TOKEN");
  unsetenv("CUDA_LAUNCH_BLOCKING");
}

TEST_CASE("secrets never reach a bundle, raw or decompressed", "[recorder][env]") {
  crashcap::test::TempDir dir;
  const std::string secret = "wandb-secret-value-4242";
  setenv("WANDB_API_KEY", secret.c_str(), 1);
  setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", 1);
  auto env = captureEnvironment({true});
  env.commandLine.push_back("--api-key");
  env.commandLine.push_back(secret);
  env.commandLine = redactArguments(env.commandLine);
  {
    crashcap::formats::WriterOptions o;
    o.zstdLevel = 0;  // metas are never compressed; keep bodies raw too so a grep of the file is conclusive
    auto w = crashcap::formats::BundleWriter::create(dir.file("b.ccap"), o);
    w->writeEnvironment(env);
    w->seal();
  }
  auto bytes = crashcap::test::readFile(dir.file("b.ccap"));
  std::string raw(bytes.begin(), bytes.end());
  CHECK(raw.find(secret) == std::string::npos);
  CHECK(raw.find("expandable_segments:True") != std::string::npos);  // the grep does see values

  auto reader = crashcap::formats::BundleReader::open(dir.file("b.ccap"));
  auto back = reader->environment();
  REQUIRE(back);
  CHECK(back->facts == env.facts);
  CHECK(back->variables == env.variables);
  CHECK(back->commandLine.back() == "<redacted>");
  CHECK(std::find(back->redacted.begin(), back->redacted.end(), "WANDB_API_KEY") != back->redacted.end());
  CHECK(crashcap::formats::verifyBundle(dir.file("b.ccap")).ok());
  unsetenv("WANDB_API_KEY");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
}
