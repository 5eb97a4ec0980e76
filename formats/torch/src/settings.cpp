#include "crashcap/formats/torch/settings.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/version.h>

#include <algorithm>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats::torch {
namespace {

// LibTorch 2.4 replaced the per-device autocast switches with one taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocastEnabled() {
  return at::autocast::is_autocast_enabled(at::kCPU) || at::autocast::is_autocast_enabled(at::kCUDA);
}
void setAutocast(bool on) {
  at::autocast::set_autocast_enabled(at::kCPU, on);
  at::autocast::set_autocast_enabled(at::kCUDA, on);
}
#else
bool autocastEnabled() { return at::autocast::is_cpu_enabled() || at::autocast::is_enabled(); }
void setAutocast(bool on) {
  at::autocast::set_cpu_enabled(on);
  at::autocast::set_enabled(on);
}
#endif

std::string yes(bool b) { return b ? "true" : "false"; }

bool parseBool(const std::string& name, const std::string& value) {
  if (value == "true" || value == "on" || value == "1") return true;
  if (value == "false" || value == "off" || value == "0") return false;
  throw Error(ErrorCode::InvalidArgument, fmt::format("setting {}: '{}' is not true or false", name, value),
              fmt::format("e.g. --set {}=false", name));
}

void checkName(const std::string& name) {
  const auto& all = settingNames();
  if (std::find(all.begin(), all.end(), name) == all.end())
    throw Error(ErrorCode::InvalidArgument, fmt::format("unknown setting '{}'", name),
                fmt::format("the settings are: {}", fmt::join(all, ", ")));
}

}  // namespace

const std::vector<std::string>& settingNames() {
  static const std::vector<std::string> names = {
      "cudnn.enabled",         "cudnn.benchmark",   "cudnn.deterministic",
      "cudnn.allow_tf32",      "cuda.matmul.allow_tf32", "torch.deterministic_algorithms",
      "torch.autocast",        "torch.threads"};
  return names;
}

bool changesOnlyCudaKernels(const std::string& name) {
  return name.rfind("cudnn.", 0) == 0 || name.rfind("cuda.", 0) == 0;
}

std::string tf32Setting(const std::function<bool()>& read) {
  // Not yet seen on a LibTorch that refuses (2.9 and later): no such build has run here.
  try {
    return yes(read());
  } catch (const c10::Error&) {
    return kSetThroughPrecisionApi;
  }
}

std::string settingNotHeld(const std::string& name, const std::string& recorded) {
  if (recorded != kSetThroughPrecisionApi) return "";
  const std::string here = currentSetting(name);
  if (here == recorded) return "";
  return fmt::format("{} was set through torch's fp32_precision API in the recording, which does not say to what; "
                     "this replay runs with {}={}, so its numbers are not held to the recording's",
                     name, name, here);
}

std::string currentSetting(const std::string& name) {
  checkName(name);
  auto& ctx = at::globalContext();
  if (name == "cudnn.enabled") return yes(ctx.userEnabledCuDNN());
  if (name == "cudnn.benchmark") return yes(ctx.benchmarkCuDNN());
  if (name == "cudnn.deterministic") return yes(ctx.deterministicCuDNN());
  if (name == "cudnn.allow_tf32") return tf32Setting([&] { return ctx.allowTF32CuDNN(); });
  if (name == "cuda.matmul.allow_tf32") return tf32Setting([&] { return ctx.allowTF32CuBLAS(); });
  if (name == "torch.deterministic_algorithms") return yes(ctx.deterministicAlgorithms());
  if (name == "torch.autocast") return yes(autocastEnabled());
  return std::to_string(at::get_num_threads());
}

void applySetting(const std::string& name, const std::string& value) {
  checkName(name);
  auto& ctx = at::globalContext();
  if (name == "torch.threads") {
    int n = 0;
    try {
      n = std::stoi(value);
    } catch (const std::exception&) {
    }
    if (n <= 0)
      throw Error(ErrorCode::InvalidArgument, fmt::format("setting torch.threads: '{}' is not a positive count", value));
    at::set_num_threads(n);
    return;
  }
  if (value == kSetThroughPrecisionApi) return;  // left as it is: settingNotHeld says when that matters
  bool on = parseBool(name, value);
  if (name == "cudnn.enabled") ctx.setUserEnabledCuDNN(on);
  else if (name == "cudnn.benchmark") ctx.setBenchmarkCuDNN(on);
  else if (name == "cudnn.deterministic") ctx.setDeterministicCuDNN(on);
  else if (name == "cudnn.allow_tf32") ctx.setAllowTF32CuDNN(on);
  else if (name == "cuda.matmul.allow_tf32") ctx.setAllowTF32CuBLAS(on);
  else if (name == "torch.deterministic_algorithms") ctx.setDeterministicAlgorithms(on, /*warn_only=*/false);
  else if (name == "torch.autocast") setAutocast(on);
}

std::string flippedSetting(const std::string& name, const std::string& value) {
  checkName(name);
  if (name == "torch.threads") return value == "1" ? "2" : "1";
  return parseBool(name, value) ? "false" : "true";
}

}  // namespace crashcap::formats::torch
