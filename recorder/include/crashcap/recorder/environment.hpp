#pragma once
// The environment fingerprint: what a crash report needs to know about the machine and the
// process (versions, CPU, WSL2, threads, the environment variables that change CUDA and
// PyTorch behaviour, the command line), with secrets redacted before anything is stored.
// This part needs no LibTorch; the LibTorch/CUDA facts are added by the recorder.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"

namespace crashcap::recorder {

/// The text stored in place of a secret's value.
inline constexpr std::string_view kRedacted = "<redacted>";

/// True when a variable or option name looks like it holds a secret: it contains KEY, TOKEN,
/// SECRET, PASSWORD, PASSWD, CREDENTIAL, AUTH, COOKIE or SESSION (case-insensitive), or
/// starts with WANDB_, AWS_, HF_, HUGGING_FACE_, OPENAI_, GITHUB_, AZURE_ or GOOGLE_.
bool isSecretName(std::string_view name);

/// True for variables worth recording: CUDA_*, CUDNN_*, CUBLAS_*, NCCL_*, PYTORCH_*, TORCH_*,
/// OMP_*, MKL_*, KMP_*, NVIDIA_*, PYTHON*, LD_LIBRARY_PATH, CRASHCAP_*, and anything secret
/// (recorded as set, with its value redacted).
bool isRelevantVariable(std::string_view name);

/// A command line with secret values replaced: `--api-key X`, `--token=X`, `password=X`.
std::vector<std::string> redactArguments(const std::vector<std::string>& args);

struct EnvironmentOptions {
  /// Record every variable (values of secret ones still redacted), not only relevant ones.
  bool allVariables = false;
};

/// Captures the fingerprint of this process from /proc, /etc/os-release, uname and environ.
/// Never throws for a missing source: an unknown fact is recorded as "unknown".
/// Values of secrets never appear in the result (only their names, in `redacted`).
formats::EnvironmentData captureEnvironment(const EnvironmentOptions& options = {});

/// True when /proc/version or the kernel release names Microsoft/WSL (`text` is their
/// contents; exposed for tests).
bool looksLikeWsl(std::string_view procVersion, std::string_view osRelease);

}  // namespace crashcap::recorder
