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

TEST_CASE("settings: TF32 set through the fp32_precision API is recorded as such and left to the program",
          "[formats_torch][settings]") {
  // A LibTorch of 2.9 or later answers the TF32 getters with an error for such a program; the
  // recording then holds kSetThroughPrecisionApi. Replay leaves the setting as the program made
  // it, and config bisection tries TF32 off.
  for (const char* name : {"cudnn.allow_tf32", "cuda.matmul.allow_tf32"}) {
    const std::string before = settings::currentSetting(name);
    settings::applySetting(name, settings::kSetThroughPrecisionApi);
    CHECK(settings::currentSetting(name) == before);
    CHECK(settings::flippedSetting(name, settings::kSetThroughPrecisionApi) == "false");
  }
}
