#include "crashcap/supervisor/classify.hpp"

#include "crashcap/formats/signal_name.hpp"

#include <fmt/format.h>

#include <csignal>
#include <cstring>
#include <utility>
#include <vector>

namespace crashcap::supervisor {
namespace {

struct Pattern {
  const char* text;
  const char* id;
};

// Messages as CUDA, cuDNN, cuBLAS, NCCL and PyTorch print them (c10/cuda/CUDAException.h,
// cudaGetErrorString, ProcessGroupNCCL.cpp), and the recorder's own non-finite message.
// Order matters only within one line: the more specific first.
const std::vector<Pattern>& gpuPatterns() {
  static const std::vector<Pattern> patterns = {
      {"an illegal instruction was encountered", "cuda-illegal-instruction"},
      {"cudaErrorIllegalInstruction", "cuda-illegal-instruction"},
      {"CUDA_ERROR_ILLEGAL_INSTRUCTION", "cuda-illegal-instruction"},
      {"an illegal memory access was encountered", "cuda-illegal-address"},
      {"cudaErrorIllegalAddress", "cuda-illegal-address"},
      {"CUDA_ERROR_ILLEGAL_ADDRESS", "cuda-illegal-address"},
      {"misaligned address", "cuda-illegal-address"},
      {"device-side assert triggered", "cuda-device-assert"},
      {"cudaErrorAssert", "cuda-device-assert"},
      {"Encountered device-side assert", "cuda-device-assert"},
      {"CUDNN_STATUS_EXECUTION_FAILED", "cudnn-execution-failed"},
      {"CUDNN_STATUS_", "cudnn-error"},
      {"CUDA out of memory", "cuda-oom"},
      {"OutOfMemoryError", "cuda-oom"},
      {"CUBLAS_STATUS_ALLOC_FAILED", "cuda-oom"},
      {"cudaErrorMemoryAllocation", "cuda-oom"},
      {"unspecified launch failure", "cuda-launch-failure"},
      {"cudaErrorLaunchFailure", "cuda-launch-failure"},
      {"too many resources requested for launch", "cuda-launch-failure"},
      {"no kernel image is available for execution on the device", "cuda-launch-failure"},
      {"the launch timed out and was terminated", "cuda-launch-failure"},
      {"NCCL error", "nccl-error"},
      {"NCCL WARN", "nccl-error"},
      {"ncclInternalError", "nccl-error"},
      {"ncclSystemError", "nccl-error"},
      {"ncclUnhandledCudaError", "nccl-error"},
      {"Watchdog caught collective operation timeout", "nccl-error"},
      {"non-finite loss at step", "nonfinite-loss"},
      // A finite loss whose gradients are not (a saturated tanh, an overflow in backward): the
      // same stop of the recorder's, the same class.
      {"non-finite gradient norm at step", "nonfinite-loss"},
      // torch/cuda/__init__.py: CUDA used in a process forked after CUDA was initialised (a
      // DataLoader worker, a logger's fork). The fix is the start method, not the data.
      {"Cannot re-initialize CUDA in forked subprocess", "cuda-forked-subprocess"},
      {"CUBLAS_STATUS_", "cuda-error"},
      {"CUDA error: ", "cuda-error"},
      {"CUDA driver error", "cuda-error"},
  };
  return patterns;
}

// Deaths PyTorch names outside the GPU, checked after the GPU family and before a generic
// Python exception: a DataLoader worker killed (often by the OOM killer) or gone
// (torch/utils/data/_utils/signal_handling.py, dataloader.py).
const std::vector<Pattern>& processPatterns() {
  static const std::vector<Pattern> patterns = {
      {"DataLoader worker (pid", "dataloader-worker-died"},
  };
  return patterns;
}

// A device-side assert prints the kernel's assertion before PyTorch's error line, e.g.
//   .../Loss.cu:242: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [5,0,0]
//   Assertion `t >= 0 && t < n_classes` failed.
bool isDeviceAssertion(const std::string& line) {
  return line.find("Assertion `") != std::string::npos && line.find("failed") != std::string::npos &&
         line.find("block: [") != std::string::npos;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

std::string trimmed(std::string line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  size_t start = line.find_first_not_of(' ');
  line = start == std::string::npos ? "" : line.substr(start);
  if (line.size() > 500) line = line.substr(0, 500) + "...";
  return line;
}

/// The first line from `from` on that is not a traceback's frame (those are indented): the line
/// that names a traceback's exception. npos when there is none.
size_t firstUnindented(const std::vector<std::string>& all, size_t from) {
  for (size_t k = from; k < all.size(); ++k)
    if (!all[k].empty() && all[k][0] != ' ' && all[k][0] != '\t') return k;
  return std::string::npos;
}

/// The line that names the exception of the last traceback Python printed: the first line after
/// "Traceback (most recent call last):" that is not one of its frames. The last, because a
/// chained exception prints the one raised last at the end, and a launcher
/// (torch.multiprocessing.spawn) ends with its rank's traceback inside its own exception's text;
/// whatever the program prints after it (a warning at exit) is not the exception. A traceback
/// Python prints for an exception it ignored ("Exception ignored in: ...", a failing atexit
/// callback) is skipped. An exception PyTorch raised again in the main process for one of its
/// DataLoader workers ("RuntimeError: Caught RuntimeError in DataLoader worker process 0." and the
/// worker's "Original Traceback") is the worker's own exception line, with where it was raised:
/// "RuntimeError: stack expects ... (in DataLoader worker process 0)". "" when no traceback is there.
std::string exceptionLine(const std::vector<std::string>& all) {
  std::string found;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].rfind("Traceback (most recent call last):", 0) != 0) continue;
    size_t before = i;
    while (before > 0 && all[before - 1].empty()) --before;
    if (before > 0 && all[before - 1].rfind("Exception ignored", 0) == 0) continue;
    const size_t at = firstUnindented(all, i + 1);
    if (at == std::string::npos) {
      found = all[i];  // a traceback cut off before its exception line: the traceback itself
      continue;
    }
    found = all[at];
    static const std::string caught = ": Caught ";
    const size_t c = found.find(caught);
    if (c == std::string::npos || at + 1 >= all.size() ||
        all[at + 1].rfind("Original Traceback (most recent call last):", 0) != 0)
      continue;
    // "Caught RuntimeError in DataLoader worker process 0." names its type, then where. The worker's
    // traceback is read as one (its own chained exceptions included), and it ends the text.
    const size_t in = found.find(" in ", c + caught.size());
    if (in == std::string::npos) continue;
    std::vector<std::string> original(all.begin() + static_cast<std::ptrdiff_t>(at + 1), all.end());
    original.front() = "Traceback (most recent call last):";
    const std::string line = exceptionLine(original);
    if (line.empty() || line == original.front()) continue;  // cut off before its exception line
    std::string where = found.substr(in + 4);
    if (!where.empty() && where.back() == '.') where.pop_back();
    return trimmed(line) + " (in " + where + ")";
  }
  return found;
}

}  // namespace

Classification classifyExit(int exitCode, int signal, const std::string& stdoutText, const std::string& stderrText) {
  if (signal == 0 && exitCode == 0) return {};
  // The earliest GPU-family line decides; stderr first (where errors go), then stdout.
  for (const std::string* text : {&stderrText, &stdoutText}) {
    for (const auto& line : lines(*text)) {
      if (isDeviceAssertion(line)) return {"cuda-device-assert", trimmed(line)};
      for (const auto& p : gpuPatterns())
        if (line.find(p.text) != std::string::npos) return {p.id, trimmed(line)};
    }
  }
  for (const std::string* text : {&stderrText, &stdoutText})
    for (const auto& line : lines(*text))
      for (const auto& p : processPatterns())
        if (line.find(p.text) != std::string::npos) return {p.id, trimmed(line)};
  for (const std::string* text : {&stderrText, &stdoutText}) {
    std::string line = exceptionLine(lines(*text));
    if (!line.empty()) return {"python-exception", trimmed(line)};
  }
  if (signal != 0) {
    const char* name = formats::signalName(signal);
    return {"signal", name ? fmt::format("killed by {}", name) : fmt::format("killed by signal {}", signal)};
  }
  return {"exit-nonzero", fmt::format("exit status {}", exitCode)};
}

}  // namespace crashcap::supervisor
