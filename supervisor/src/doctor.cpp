#include "crashcap/supervisor/doctor.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crashcap/recorder/environment.hpp"

namespace crashcap::supervisor {
using recorder::isSecretName;
using recorder::looksLikeWsl;
namespace {

namespace fs = std::filesystem;

/// A library opened with dlopen for the duration of a check.
struct Library {
  void* handle = nullptr;
  std::string name, error;
  explicit Library(const std::vector<const char*>& names) {
    for (const char* n : names) {
      handle = ::dlopen(n, RTLD_LAZY | RTLD_LOCAL);
      if (handle) {
        name = n;
        return;
      }
      const char* e = ::dlerror();
      if (error.empty() && e) error = e;
    }
  }
  ~Library() {
    if (handle) ::dlclose(handle);
  }
  /// Calls `int f(int*)` (the CUDA and CUPTI version getters); -1 when absent or failing.
  int version(const char* symbol) const {
    if (!handle) return -1;
    auto f = reinterpret_cast<int (*)(int*)>(::dlsym(handle, symbol));
    int v = -1;
    if (!f || f(&v) != 0) return -1;
    return v;
  }
};

std::string readFile(const char* path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string cudaVersionText(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

}  // namespace

std::vector<DoctorCheck> runDoctor() {
  std::vector<DoctorCheck> checks;
  // Driver.
  Library driver({"libcuda.so.1", "libcuda.so"});
  int driverVersion = driver.version("cuDriverGetVersion");
  if (!driver.handle)
    checks.push_back({"driver", "fail", fmt::format("no NVIDIA driver: {}", driver.error),
                      "install the NVIDIA driver (on WSL2: the Windows driver, not a Linux one), or replay on the CPU"});
  else
    checks.push_back({"driver", driverVersion > 0 ? "ok" : "warn",
                      driverVersion > 0 ? fmt::format("{} supports CUDA up to {}", driver.name, cudaVersionText(driverVersion))
                                        : fmt::format("{} loads but cuDriverGetVersion failed", driver.name),
                      ""});
  // CUDA runtime.
  Library runtime({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"});
  int runtimeVersion = runtime.version("cudaRuntimeGetVersion");
  if (!runtime.handle) {
    checks.push_back({"cuda-runtime", "info", "no libcudart on the library path (a PyTorch wheel brings its own)", ""});
  } else if (driverVersion > 0 && runtimeVersion > driverVersion) {
    checks.push_back({"cuda-runtime", "fail",
                      fmt::format("{} is CUDA {}, newer than the driver supports ({})", runtime.name,
                                  cudaVersionText(runtimeVersion), cudaVersionText(driverVersion)),
                      "update the driver, or use a PyTorch built for an older CUDA"});
  } else {
    checks.push_back({"cuda-runtime", "ok",
                      fmt::format("{} is CUDA {}", runtime.name, runtimeVersion > 0 ? cudaVersionText(runtimeVersion) : "?"), ""});
  }
  // cuDNN.
  Library cudnn({"libcudnn.so", "libcudnn.so.9", "libcudnn.so.8"});
  if (!cudnn.handle) {
    checks.push_back({"cudnn", "info", "no libcudnn on the library path (a PyTorch wheel brings its own)", ""});
  } else {
    auto f = reinterpret_cast<size_t (*)()>(::dlsym(cudnn.handle, "cudnnGetVersion"));
    checks.push_back({"cudnn", "ok", fmt::format("{} version {}", cudnn.name, f ? std::to_string(f()) : "?"),
                      "on CUDNN_STATUS_EXECUTION_FAILED: crashcap replay B --set cudnn.enabled=false, or "
                      "crashcap bisect config B"});
  }
  // CUPTI: what crashcap's kernel trace needs.
  Library cupti({"libcupti.so", "libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8"});
  if (!cupti.handle)
    checks.push_back({"cupti", "warn", fmt::format("CUPTI not loadable: {}", cupti.error),
                      "add the CUDA toolkit's extras/CUPTI/lib64 to LD_LIBRARY_PATH for kernel traces"});
  else
    checks.push_back({"cupti", "ok", fmt::format("{} loads", cupti.name), ""});
  // GPU visibility.
  int nodes = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    auto n = e.path().filename().string();
    if (n.rfind("nvidia", 0) == 0 && n.size() > 6 && std::isdigit(static_cast<unsigned char>(n[6]))) ++nodes;
  }
  bool dxg = fs::exists("/dev/dxg", ec);
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string vis = visible ? fmt::format("; CUDA_VISIBLE_DEVICES={}", visible) : "";
  if (visible && std::string(visible).empty())
    checks.push_back({"gpu-visible", "warn", "CUDA_VISIBLE_DEVICES is set and empty: no GPU is visible", "unset it"});
  else if (nodes == 0 && !dxg)
    checks.push_back({"gpu-visible", driver.handle ? "warn" : "info", "no /dev/nvidia<N> or /dev/dxg device" + vis,
                      driver.handle ? "the driver is installed but no GPU device node exists: is the GPU passed into this container?" : ""});
  else
    checks.push_back({"gpu-visible", "ok", fmt::format("{} /dev/nvidia<N>{}{}", nodes, dxg ? ", /dev/dxg (WSL2)" : "", vis), ""});
  // WSL2: its GPU path goes through the Windows driver, a source of errors of its own.
  bool wsl = looksLikeWsl(readFile("/proc/version"), readFile("/proc/sys/kernel/osrelease"));
  checks.push_back({"wsl2", wsl ? "warn" : "ok", wsl ? "running under WSL2" : "not WSL2",
                    wsl ? "WSL2 GPU errors (illegal instruction) can be driver-side: compare with crashcap replay --device cpu "
                          "and keep the Windows driver current"
                        : ""});
  // The fork-after-CUDA hazard: a process forked after CUDA initialised cannot use CUDA.
  const char* method = std::getenv("CRASHCAP_MP_START_METHOD");
  checks.push_back({"mp-start-method", "info",
                    method ? fmt::format("declared start method: {}", method) : "Python's default start method on Linux is fork",
                    "a process forked after CUDA initialised cannot use CUDA: use "
                    "multiprocessing.set_start_method('spawn') (or DataLoader(multiprocessing_context='spawn'))"});
  // Environment variables that change CUDA behaviour.
  std::vector<std::string> set;
  for (const char* name : {"CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
                           "TORCH_USE_CUDA_DSA", "CUDNN_LOGLEVEL_DBG", "CUDNN_LOGDEST_DBG", "NCCL_DEBUG", "NCCL_P2P_DISABLE",
                           "NCCL_IB_DISABLE", "CUDA_MODULE_LOADING", "PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDA_INJECTION64_PATH"})
    if (const char* v = std::getenv(name)) set.push_back(fmt::format("{}={}", name, isSecretName(name) ? "<redacted>" : v));
  std::string joined;
  for (const auto& s : set) joined += (joined.empty() ? "" : ", ") + s;
  checks.push_back({"cuda-env", "info", set.empty() ? "none of the CUDA-behaviour variables is set" : joined,
                    std::getenv("CUDA_LAUNCH_BLOCKING") ? ""
                                                        : "to see which launch fails: crashcap run --blocking (CUDA_LAUNCH_BLOCKING=1)"});
  return checks;
}

}  // namespace crashcap::supervisor
