#pragma once
// Names and classes of the CUDA error codes a kernel_trace record carries (return codes of API
// calls, the first error), for the tracer that writes them and the readers that show them,
// none of which may have a CUDA library to ask. Runtime (cudaError_t) and driver (CUresult)
// codes agree on the sticky ones.

#include <cstdint>
#include <string>
#include <string_view>

namespace crashcap::formats {

/// "cudaErrorIllegalInstruction" for runtime codes, "CUDA_ERROR_ILLEGAL_INSTRUCTION" for
/// driver codes ("cudaSuccess", "CUDA_SUCCESS" for 0); "" when not in crashcap's table.
std::string cudaErrorName(bool driver, int32_t code);

/// A sticky error leaves the CUDA context unusable: every later call fails, so the process
/// must be restarted (illegal address/instruction, device assert, launch failure, ...).
bool isStickyError(int32_t code);

/// True when `api` returning `code` is an answer, not a failure, so the tracer does not report it
/// as the first error: "not ready" from a query (600), a symbol lookup that misses
/// (cuGetProcAddress*), "no current context" from cuCtxGetDevice* (PyTorch asks before it has
/// made one, at the start of every CUDA process). By name, so that the _v2 forms newer CUDA
/// versions call are the same question.
bool isAnswerNotFailure(bool driver, std::string_view api, int32_t code);

/// The `crashcap run` classification id a sticky or allocation error implies
/// ("cuda-illegal-instruction"), or "" when the code says nothing more than the text does.
std::string classificationForCode(int32_t code, bool driver);

}  // namespace crashcap::formats
