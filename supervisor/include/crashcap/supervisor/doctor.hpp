#pragma once
// `crashcap doctor`: the diagnostic checklist engineers otherwise go through by hand, as
// one command — driver, CUDA runtime, cuDNN, CUPTI, GPU visibility, WSL2, the multiprocessing
// start-method hazard, and the environment variables that change CUDA behaviour. Each check
// has a status and advice. No LibTorch: libraries are probed with dlopen, so a missing one is
// a finding, not a failure.

#include <string>
#include <vector>

namespace crashcap::supervisor {

struct DoctorCheck {
  std::string id;        ///< "driver", "cuda-runtime", "cudnn", "cupti", "gpu-visible", "wsl2", ...
  std::string status;    ///< "ok" | "warn" | "fail" | "info"
  std::string detail;    ///< what was found
  std::string advice;    ///< what to do ("" when nothing)
};

/// Runs every check; never throws (a check that cannot run is a finding).
std::vector<DoctorCheck> runDoctor();

}  // namespace crashcap::supervisor
