// The LibTorch settings replay applies and config bisection flips (formats/torch/settings.hpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/settings.hpp"

namespace settings = crashcap::formats::torch;

TEST_CASE("settings: read, applied, flipped, by name", "[formats_torch][settings]") {
  const std::string before = settings::currentSetting("cudnn.benchmark");
  settings::applySetting("cudnn.benchmark", "true");
  CHECK(settings::currentSetting("cudnn.benchmark") == "true");
  settings::applySetting("cudnn.benchmark", "false");
  CHECK(settings::currentSetting("cudnn.benchmark") == "false");
  settings::applySetting("cudnn.benchmark", before);
  for (const auto& name : settings::settingNames()) CHECK_FALSE(settings::currentSetting(name).empty());
  CHECK(settings::flippedSetting("cudnn.allow_tf32", "true") == "false");
  CHECK(settings::flippedSetting("torch.threads", "1") == "2");
  CHECK_THROWS_AS(settings::currentSetting("cudnn.nonsense"), crashcap::Error);
  CHECK_THROWS_AS(settings::applySetting("cudnn.benchmark", "maybe"), crashcap::Error);
}

TEST_CASE("settings: the cudnn and TF32 ones change only CUDA kernels, the others the CPU's too",
          "[formats_torch][settings]") {
  std::vector<std::string> cudaOnly;
  for (const auto& name : settings::settingNames())
    if (settings::changesOnlyCudaKernels(name)) cudaOnly.push_back(name);
  CHECK(cudaOnly == std::vector<std::string>{"cudnn.enabled", "cudnn.benchmark", "cudnn.deterministic",
                                             "cudnn.allow_tf32", "cuda.matmul.allow_tf32"});
}

TEST_CASE("settings: TF32 set through the fp32_precision API is recorded as such, not a failure",
          "[formats_torch][settings]") {
  // A LibTorch of 2.9 or later can answer the boolean TF32 getters with c10::Error; this one
  // never does, so the getter here is one that throws as those do.
  CHECK(settings::tf32Setting([] { return true; }) == "true");
  CHECK(settings::tf32Setting([] { return false; }) == "false");
  CHECK(settings::tf32Setting([]() -> bool {
          TORCH_CHECK(false, "you have used mix of the legacy and new APIs to set the TF32 status");
        }) == settings::kSetThroughPrecisionApi);
}

TEST_CASE("settings: a TF32 value the recording does not know is left as it is, and said", "[formats_torch][settings]") {
  for (const char* name : {"cudnn.allow_tf32", "cuda.matmul.allow_tf32"}) {
    const std::string before = settings::currentSetting(name);
    settings::applySetting(name, settings::kSetThroughPrecisionApi);
    CHECK(settings::currentSetting(name) == before);
    // This process reads true or false, not the recording's value: the replay says so.
    const std::string note = settings::settingNotHeld(name, settings::kSetThroughPrecisionApi);
    CHECK_THAT(note, Catch::Contains(name) && Catch::Contains("fp32_precision") &&
                         Catch::Contains(std::string(name) + "=" + before));
    // A value the recording knows is held to as always.
    CHECK(settings::settingNotHeld(name, before).empty());
    CHECK_THROWS_AS(settings::flippedSetting(name, settings::kSetThroughPrecisionApi), crashcap::Error);
  }
}
