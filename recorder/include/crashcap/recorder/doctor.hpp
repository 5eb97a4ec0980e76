#pragma once
// `crashcap doctor`: the diagnostic checklist the seeds' engineers went through by hand, as
// one command — driver, CUDA runtime, cuDNN, CUPTI, GPU visibility, WSL2, the multiprocessing
// start-method hazard, and the environment variables that change CUDA behaviour. Each check
// has a verdict and advice. No LibTorch: libraries are probed with dlopen, so a missing one is
// a finding, not a failure.

#include <string>
#include <vector>

namespace crashcap::recorder {

struct DoctorCheck {
  std::string id;        ///< "driver", "cuda-runtime", "cudnn", "cupti", "gpu-visible", "wsl2", ...
  std::string verdict;   ///< "ok" | "warn" | "fail" | "info"
  std::string detail;    ///< what was found
  std::string advice;    ///< what to do ("" when nothing)
};

std::vector<DoctorCheck> runDoctor();

}  // namespace crashcap::recorder
