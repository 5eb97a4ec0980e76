#pragma once
// The process-wide LibTorch settings that change what a training step computes, by the names
// the recorder gives them in the environment record ("cudnn.benchmark", "torch.threads", ...).
// The recorder reads them into the recording; replay applies the recorded values (or an
// experiment's flip of one); the fault-injection hook tests conditions on them.

#include <functional>
#include <string>
#include <vector>

namespace crashcap::formats::torch {

/// Every setting, in the order config bisection flips them:
///   cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32,
///   cuda.matmul.allow_tf32, torch.deterministic_algorithms, torch.autocast, torch.threads.
/// Boolean settings read "true"/"false"; torch.threads is a count. torch.autocast is autocast on
/// the CPU and on CUDA (either enabled reads "true"); it is read on the recording thread.
const std::vector<std::string>& settingNames();

/// Whether `name` changes only what CUDA kernels compute (the cudnn.* and TF32 settings): a step
/// replayed on the CPU computes the same bits with either value. (LibTorch 2.x keeps TF32 in the
/// float32 matmul precision, which oneDNN's CPU matmul reads too, but only as "medium", which
/// neither true, "high", nor false, "highest", is.)
bool changesOnlyCudaKernels(const std::string& name);

/// The value of cudnn.allow_tf32 and cuda.matmul.allow_tf32 when LibTorch will not answer: from
/// 2.9 on, the boolean TF32 getters can refuse (c10::Error, "a mix of the legacy and new APIs")
/// for a program that set TF32 through the newer fp32_precision API. The recorder records this
/// value rather than failing; replay leaves the setting as it finds it and says so when that is
/// not the program's (settingNotHeld), and config bisection tries both true and false.
inline constexpr const char* kSetThroughPrecisionApi = "set-through-fp32_precision";

/// A TF32 setting's value from its LibTorch getter: "true"/"false", or kSetThroughPrecisionApi
/// when the getter throws c10::Error.
std::string tf32Setting(const std::function<bool()>& read);

/// For a setting recorded as kSetThroughPrecisionApi: "" when this process's value is that too
/// (the replayed program set it through fp32_precision again), else a note that the replay runs
/// with this process's value, which the recording cannot be held to. "" for any other value.
std::string settingNotHeld(const std::string& name, const std::string& recorded);

/// The current value of `name`. Throws crashcap::Error (InvalidArgument) for an unknown name.
std::string currentSetting(const std::string& name);

/// Applies `value` to `name` in this process (torch.autocast: on the CPU and CUDA, this
/// thread). Throws crashcap::Error (InvalidArgument) for an unknown name or a bad value.
void applySetting(const std::string& name, const std::string& value);

/// `value` flipped: true<->false; for torch.threads, 1 <-> the recorded count (2 when it was 1).
/// kSetThroughPrecisionApi has no flip (InvalidArgument): try both values.
std::string flippedSetting(const std::string& name, const std::string& value);

}  // namespace crashcap::formats::torch
