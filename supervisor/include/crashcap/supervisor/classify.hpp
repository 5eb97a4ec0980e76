#pragma once
// Why a supervised training process died, from how it ended and what it printed. The ids are
// the vocabulary of `crashcap run`, `crashcap inspect` (crash.classification) and docs/RUN.md:
//   cuda-illegal-instruction, cuda-illegal-address, cuda-device-assert, cudnn-execution-failed,
//   cudnn-error, cuda-oom, cuda-launch-failure, cuda-error, nccl-error, nonfinite-loss,
//   python-exception, signal, exit-nonzero; "" for a clean exit.
// CUDA errors are asynchronous and cascade (a device-side assert is followed by an illegal
// instruction at teardown): the *earliest* GPU-family line in the output decides.

#include <string>

namespace crashcap::supervisor {

struct Classification {
  std::string id;        ///< "" when the process exited 0
  std::string evidence;  ///< the output line it rests on, or the exit status / signal
};

/// `exitCode` is the exit status, or -1 when `signal` (non-zero) ended the process. The
/// outputs are what it printed (tails are enough: the error is at the end).
Classification classifyExit(int exitCode, int signal, const std::string& stdoutText, const std::string& stderrText);

}  // namespace crashcap::supervisor
