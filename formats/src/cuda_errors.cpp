#include "crashcap/formats/cuda_errors.hpp"

namespace crashcap::formats {
namespace {

struct Code {
  int32_t code;
  const char* runtime;
  const char* driver;
  const char* classification;
};

// The codes a training crash shows, from cuda_runtime_api's cudaError_t and cuda.h's CUresult.
constexpr Code kCodes[] = {
    {0, "cudaSuccess", "CUDA_SUCCESS", ""},
    {1, "cudaErrorInvalidValue", "CUDA_ERROR_INVALID_VALUE", ""},
    {2, "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY", "cuda-oom"},
    {3, "cudaErrorInitializationError", "CUDA_ERROR_NOT_INITIALIZED", ""},
    {4, "cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED", ""},
    {9, "cudaErrorInvalidConfiguration", "", ""},
    {34, "cudaErrorStubLibrary", "CUDA_ERROR_STUB_LIBRARY", ""},
    {35, "cudaErrorInsufficientDriver", "", ""},
    {98, "cudaErrorInvalidDeviceFunction", "", ""},
    {100, "cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE", ""},
    {101, "cudaErrorInvalidDevice", "CUDA_ERROR_INVALID_DEVICE", ""},
    {200, "cudaErrorInvalidKernelImage", "CUDA_ERROR_INVALID_IMAGE", ""},
    {201, "cudaErrorDeviceUninitialized", "CUDA_ERROR_INVALID_CONTEXT", ""},
    {209, "cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU", ""},
    {214, "cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE", "cuda-error"},
    {226, "cudaErrorContained", "CUDA_ERROR_CONTAINED", "cuda-error"},
    {400, "cudaErrorInvalidResourceHandle", "CUDA_ERROR_INVALID_HANDLE", ""},
    {500, "cudaErrorSymbolNotFound", "CUDA_ERROR_NOT_FOUND", ""},
    {600, "cudaErrorNotReady", "CUDA_ERROR_NOT_READY", ""},
    {700, "cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS", "cuda-illegal-address"},
    {701, "cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "cuda-launch-failure"},
    {702, "cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT", "cuda-launch-failure"},
    {710, "cudaErrorAssert", "CUDA_ERROR_ASSERT", "cuda-device-assert"},
    {714, "cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR", "cuda-launch-failure"},
    {715, "cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "cuda-illegal-instruction"},
    {716, "cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "cuda-illegal-address"},
    {717, "cudaErrorInvalidAddressSpace", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "cuda-illegal-address"},
    {718, "cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC", "cuda-illegal-instruction"},
    {719, "cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED", "cuda-launch-failure"},
    {721, "cudaErrorTensorMemoryLeak", "CUDA_ERROR_TENSOR_MEMORY_LEAK", "cuda-error"},
    {911, "cudaErrorExternalDevice", "CUDA_ERROR_EXTERNAL_DEVICE", "cuda-error"},
    {999, "cudaErrorUnknown", "CUDA_ERROR_UNKNOWN", ""},
};

const Code* find(int32_t code) {
  for (const auto& c : kCodes)
    if (c.code == code) return &c;
  return nullptr;
}

}  // namespace

std::string cudaErrorName(bool driver, int32_t code) {
  const Code* c = find(code);
  if (!c) return "";
  return driver ? c->driver : c->runtime;
}

bool isStickyError(int32_t code) {
  // driver_types.h: "This leaves the process in an inconsistent state and any further CUDA work
  // will return the same error" (700, 710, 714-719, 226, 721, 911); 702 ends the context the
  // same way; an uncorrectable ECC error (214) leaves the device's memory in doubt.
  switch (code) {
    case 214: case 226: case 700: case 702: case 710: case 714: case 715: case 716: case 717: case 718: case 719:
    case 721: case 911: return true;
    default: return false;
  }
}

bool isAnswerNotFailure(bool driver, std::string_view api, int32_t code) {
  auto startsWith = [&](std::string_view prefix) { return api.substr(0, prefix.size()) == prefix; };
  if (code == 600) return true;  // cudaErrorNotReady / CUDA_ERROR_NOT_READY
  if (!driver) return false;
  if (startsWith("cuGetProcAddress")) return true;
  return code == 201 && startsWith("cuCtxGetDevice");  // CUDA_ERROR_INVALID_CONTEXT: none is current
}

std::string classificationForCode(int32_t code, bool) {
  const Code* c = find(code);
  return c ? c->classification : "";
}

}  // namespace crashcap::formats
