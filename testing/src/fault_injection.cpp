#include "crashcap/testing/fault_injection.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard: not in <ATen/ATen.h> from LibTorch 2.x on
#include <ATen/record_function.h>
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <limits>
#include <optional>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/settings.hpp"

namespace crashcap::testing {
namespace {

struct State {
  FaultSpec spec;
  std::atomic<int64_t> step{-1};
  std::atomic<int64_t> hitStep{-2};  ///< the step of the last hit: once per run of a step
  std::atomic<int> hits{0};
  std::mutex deviceMutex;
  std::string device = "cpu";
};
State* gState = nullptr;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(sep, at);
    if (end == std::string::npos) end = text.size();
    if (end > at) parts.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return parts;
}

bool conditionsHold(State& s) {
  const auto& spec = s.spec;
  int64_t step = s.step.load();
  if (spec.step >= 0 && step != spec.step) return false;
  if (s.hitStep.load() == step) return false;
  if (!spec.device.empty()) {
    std::lock_guard<std::mutex> lock(s.deviceMutex);
    if (s.device != spec.device) return false;
  }
  for (const auto& [name, value] : spec.when)
    if (formats::torch::currentSetting(name) != value) return false;
  return true;
}

/// Changes the output in place without touching autograd's version counter, so the graph sees
/// a kernel that computed different values, not an in-place edit: nan makes the first element
/// NaN; perturb moves every element by one ulp, as a reordered reduction would.
void hit(const at::Tensor& t, const std::string& mode) {
  if (!t.defined() || t.numel() == 0 || !t.is_floating_point()) return;
  if (t.device().is_cpu() && t.is_contiguous() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble)) {
    auto change = [&](auto* p) {
      using T = std::remove_pointer_t<decltype(p)>;
      if (mode == "nan") {
        p[0] = std::numeric_limits<T>::quiet_NaN();
        return;
      }
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::nextafter(p[i], std::numeric_limits<T>::infinity());
    };
    if (t.scalar_type() == at::kFloat) change(static_cast<float*>(t.data_ptr()));
    else change(static_cast<double*>(t.data_ptr()));
    return;
  }
  at::NoGradGuard noGrad;
  auto flat = t.detach().view(-1);
  if (mode == "nan") flat.narrow(0, 0, 1).fill_(std::nan(""));
  else flat.copy_(at::nextafter(flat, at::full_like(flat, INFINITY)));
}

std::unique_ptr<at::ObserverContext> onStart(const at::RecordFunction&) { return nullptr; }

void onEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  State* s = gState;
  if (!s || !fn.name() || s->spec.op != fn.name()) return;
  try {
    if (!conditionsHold(*s)) return;
    for (const c10::IValue& v : fn.outputs())
      if (v.isTensor() && v.toTensor().is_floating_point()) {
        at::DisableRecordFunctionGuard quiet;
        hit(v.toTensor(), s->spec.mode);
        s->hitStep.store(s->step.load());
        s->hits.fetch_add(1);
        return;
      }
  } catch (...) {
    // An observer must never throw into the op it observes.
  }
}

}  // namespace

FaultSpec parseFaultSpec(const std::string& text) {
  FaultSpec spec;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::InvalidArgument, fmt::format("CRASHCAP_FAULT_INJECT='{}': {}", text, why),
                 "see testing/include/crashcap/testing/fault_injection.hpp for the grammar");
  };
  for (const auto& part : split(text, ';')) {
    auto eq = part.find('=');
    if (eq == std::string::npos) throw bad(fmt::format("'{}' is not key=value", part));
    std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    if (key == "op") {
      spec.op = value;
    } else if (key == "step") {
      try {
        spec.step = std::stoll(value);
      } catch (const std::exception&) {
        throw bad(fmt::format("step '{}' is not a number", value));
      }
    } else if (key == "device") {
      spec.device = value;
    } else if (key == "when") {
      auto eq2 = value.find('=');
      if (eq2 == std::string::npos) throw bad(fmt::format("when '{}' is not SETTING=VALUE", value));
      std::string name = value.substr(0, eq2);
      formats::torch::currentSetting(name);  // throws for an unknown setting
      spec.when.emplace_back(name, value.substr(eq2 + 1));
    } else if (key == "mode") {
      if (value != "nan" && value != "perturb") throw bad(fmt::format("mode '{}' is not nan or perturb", value));
      spec.mode = value;
    } else if (key == "fake_devices") {
      spec.fakeDevices = split(value, ',');
    } else {
      throw bad(fmt::format("unknown key '{}'", key));
    }
  }
  if (spec.op.empty()) throw bad("op= is required");
  return spec;
}

bool installFaultInjection() {
  static std::once_flag once;
  static std::optional<Error> failure;
  std::call_once(once, [] {
    const char* text = std::getenv("CRASHCAP_FAULT_INJECT");
    if (!text || !*text) return;
    try {
      auto* s = new State;  // lives as long as the process: the callback may run at exit
      s->spec = parseFaultSpec(text);
      gState = s;
      at::addGlobalCallback(at::RecordFunctionCallback(&onStart, &onEnd).needsOutputs(true).scopes({at::RecordScope::FUNCTION}));
    } catch (const Error& e) {
      failure = e;
    }
  });
  if (failure) throw *failure;
  return gState != nullptr;
}

void setFaultStep(int64_t step) {
  if (!gState) return;
  gState->step.store(step);
  gState->hitStep.store(-2);  // a step that runs again (another replay in this process) is hit again
}

void setFaultDevice(const std::string& device) {
  if (!gState) return;
  std::lock_guard<std::mutex> lock(gState->deviceMutex);
  gState->device = device;
}

std::vector<std::string> fakeDevices() { return gState ? gState->spec.fakeDevices : std::vector<std::string>{}; }

bool isFakeDevice(const std::string& device) {
  if (!gState) return false;
  for (const auto& d : gState->spec.fakeDevices)
    if (d == device) return true;
  return false;
}

std::vector<std::string> faultSettings() {
  std::vector<std::string> names;
  if (gState)
    for (const auto& [name, value] : gState->spec.when) names.push_back(name);
  return names;
}

int faultHits() { return gState ? gState->hits.load() : 0; }

}  // namespace crashcap::testing
