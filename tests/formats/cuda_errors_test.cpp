// The CUDA error codes a kernel trace carries: names, stickiness, classification. Built in every
// configuration, CUDA toolkit or not: readers name codes without a CUDA library.
#include <catch2/catch.hpp>

#include "crashcap/formats/cuda_errors.hpp"

using namespace crashcap;

TEST_CASE("CUDA error codes: names, stickiness and what they classify as", "[formats][cuda]") {
  CHECK(formats::cudaErrorName(false, 715) == "cudaErrorIllegalInstruction");
  CHECK(formats::cudaErrorName(true, 715) == "CUDA_ERROR_ILLEGAL_INSTRUCTION");
  CHECK(formats::cudaErrorName(false, 710) == "cudaErrorAssert");
  CHECK(formats::cudaErrorName(false, 123456).empty());
  CHECK(formats::cudaErrorName(false, 0) == "cudaSuccess");
  CHECK(formats::cudaErrorName(true, 9).empty());  // a runtime-only code has no driver name
  for (int sticky : {700, 710, 715, 719}) CHECK(formats::isStickyError(sticky));
  for (int soft : {0, 2, 600, 1}) CHECK(!formats::isStickyError(soft));
  CHECK(formats::classificationForCode(715, false) == "cuda-illegal-instruction");
  CHECK(formats::classificationForCode(700, true) == "cuda-illegal-address");
  CHECK(formats::classificationForCode(710, false) == "cuda-device-assert");
  CHECK(formats::classificationForCode(2, false) == "cuda-oom");
  CHECK(formats::classificationForCode(1, false).empty());
}

TEST_CASE("CUDA error codes: answers that are not failures", "[formats][cuda]") {
  // "Is a context current?" before PyTorch made one: CUDA 13's cuCtxGetDevice_v2 as well.
  CHECK(formats::isAnswerNotFailure(true, "cuCtxGetDevice", 201));
  CHECK(formats::isAnswerNotFailure(true, "cuCtxGetDevice_v2", 201));
  CHECK(formats::isAnswerNotFailure(true, "cuGetProcAddress_v2", 500));
  CHECK(formats::isAnswerNotFailure(false, "cudaStreamQuery", 600));
  CHECK(formats::isAnswerNotFailure(true, "cuEventQuery", 600));
  // The same code from another call, or another code from the same call, is a failure.
  CHECK(!formats::isAnswerNotFailure(true, "cuCtxSynchronize", 201));
  CHECK(!formats::isAnswerNotFailure(true, "cuCtxGetDevice_v2", 700));
  CHECK(!formats::isAnswerNotFailure(false, "cudaGetDevice", 201));
  CHECK(!formats::isAnswerNotFailure(true, "cuMemAlloc_v2", 2));
  CHECK(!formats::isAnswerNotFailure(false, "cudaMalloc", 2));
  CHECK(!formats::isAnswerNotFailure(true, "", 201));
}
