// A CUDA program that fails the way the seeds' trainings did, for `./dev gpu-check` (built
// only there, with -DCRASHCAP_GPU_CHECK=ON): copies, memsets and a few kernel launches, then
// one faulty kernel, then a synchronisation where the asynchronous error surfaces.
//
//   crashcap-cuda-victim [--fault none|address|assert|trap|brkpt] [--generic-message]
//
// --generic-message prints "step failed" instead of CUDA's error string, so only the kernel
// trace can name the failure.
// assert() is the point of --fault assert: keep it in any build type (RelWithDebInfo, the
// project's default, defines NDEBUG, which compiled the device-side assert out).
#undef NDEBUG
#include <cuda_runtime.h>

#include <cassert>
#include <cstdio>
#include <cstring>
#include <string>

__global__ void scaleKernel(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

__global__ void illegalAddressKernel(float* x) { x[threadIdx.x + (1ull << 40)] = 1.0f; }

__global__ void deviceAssertKernel(const int* labels, int classes) {
  int t = labels[threadIdx.x];
  assert(t >= 0 && t < classes);  // the nll_loss assert of seed 004
}

__global__ void trapKernel() { asm volatile("trap;"); }
__global__ void brkptKernel() { asm volatile("brkpt;"); }

int main(int argc, char** argv) {
  std::string fault = "none";
  bool generic = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fault") && i + 1 < argc) fault = argv[++i];
    else if (!std::strcmp(argv[i], "--generic-message")) generic = true;
  }
  const int n = 1 << 20;
  float* x = nullptr;
  int* labels = nullptr;
  cudaMalloc(&x, n * sizeof(float));
  cudaMalloc(&labels, 32 * sizeof(int));
  cudaMemset(x, 0, n * sizeof(float));
  static float host[1 << 20];
  for (int i = 0; i < n; ++i) host[i] = 1.0f;
  cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice);
  int hostLabels[32];
  for (int i = 0; i < 32; ++i) hostLabels[i] = i == 5 ? 10 : i % 10;  // row 5 is out of range
  cudaMemcpy(labels, hostLabels, sizeof hostLabels, cudaMemcpyHostToDevice);
  for (int step = 0; step < 10; ++step) scaleKernel<<<(n + 255) / 256, 256>>>(x, 1.01f, n);
  cudaDeviceSynchronize();
  std::printf("10 steps done\n");
  std::fflush(stdout);

  if (fault == "address") illegalAddressKernel<<<1, 32>>>(x);
  else if (fault == "assert") deviceAssertKernel<<<1, 32>>>(labels, 10);
  else if (fault == "trap") trapKernel<<<1, 1>>>();
  else if (fault == "brkpt") brkptKernel<<<1, 1>>>();
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(host, x, sizeof(float), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    if (generic) std::fprintf(stderr, "step failed\n");
    else std::fprintf(stderr, "RuntimeError: CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::printf("clean: x[0] = %g\n", host[0]);
  return 0;
}
