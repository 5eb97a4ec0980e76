// Built with -ffp-contract=off (formats/torch/CMakeLists.txt): a multiply-add fused on one
// machine and not on another would change the blocked norm's bits.
#include "crashcap/formats/torch/fingerprint.hpp"

#include <ATen/Parallel.h>

#include <cmath>

namespace crashcap::formats::torch {

namespace {

struct Block {
  const float* data;
  int64_t size;
};

/// The squares of one block: element i goes to lane i % 16 (float), the lanes are added in a
/// fixed tree (double). The same operations in the same order whether the compiler vectorises
/// the loop or not.
double blockSquares(const float* p, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) {
      const float v = p[i + j];
      lanes[j] += v * v;
    }
  double sum = 0;
  for (int j = 0; j < 16; ++j) sum += double(lanes[j]);
  for (; i < n; ++i) sum += double(p[i]) * double(p[i]);
  return sum;
}

double blockedNorm(const std::vector<at::Tensor>& floats) {
  std::vector<Block> blocks;
  for (const auto& t : floats) {
    const float* p = t.data_ptr<float>();
    const int64_t n = t.numel();
    for (int64_t at = 0; at < n; at += kGradNormBlock) blocks.push_back({p + at, std::min(kGradNormBlock, n - at)});
  }
  std::vector<double> sums(blocks.size());
  // A task takes at least kBlocksPerTask blocks (up to 1 Mi elements, a few hundred microseconds):
  // a small model's gradients are summed on this thread, without waking LibTorch's thread pool
  // at every step. The bits do not depend on the split: each block's sum is its own.
  constexpr int64_t kBlocksPerTask = 16;
  at::parallel_for(0, int64_t(blocks.size()), kBlocksPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) sums[b] = blockSquares(blocks[b].data, blocks[b].size);
  });
  double total = 0;
  for (double s : sums) total += s;
  return std::sqrt(total);
}

double foreachNorm(const std::vector<at::Tensor>& grads) {
  return at::stack(at::_foreach_norm(grads, 2)).norm().item<double>();
}

/// A sparse gradient (an embedding's with sparse=True) as its coalesced values, which have its
/// 2-norm and are a strided tensor both methods read; `grads` itself when none is sparse.
std::vector<at::Tensor> strided(const std::vector<at::Tensor>& grads) {
  bool sparse = false;
  for (const auto& g : grads) sparse = sparse || g.is_sparse();
  if (!sparse) return grads;
  std::vector<at::Tensor> out;
  out.reserve(grads.size());
  for (const auto& g : grads) out.push_back(g.is_sparse() ? g.coalesce().values().contiguous() : g);
  return out;
}

/// Whether the blocked method can read every gradient: contiguous float32 on the CPU.
bool blockable(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return false;
  for (const auto& t : grads)
    if (!t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous() || t.layout() != at::kStrided)
      return false;
  return true;
}

bool allFinite(const std::vector<at::Tensor>& grads) {
  for (const auto& g : grads)
    if (!at::isfinite(g).all().item<bool>()) return false;
  return true;
}

}  // namespace

GradientNorm gradientNorm(const std::vector<at::Tensor>& gradients) {
  const auto grads = strided(gradients);
  if (blockable(grads)) {
    const double value = blockedNorm(grads);
    // A float square overflows at about 1e19: when no gradient holds a NaN or an Inf, the
    // verdict is LibTorch's norm's, as it was before the blocked one.
    if (std::isfinite(value)) return {value, GradNormMethod::Blocked};
    if (!allFinite(grads)) return {value, GradNormMethod::Blocked};
    const double libtorch = foreachNorm(grads);
    return {libtorch, GradNormMethod::ForeachNorm, /*overflowed=*/!std::isfinite(libtorch)};
  }
  const double value = foreachNorm(grads);
  return {value, GradNormMethod::ForeachNorm, /*overflowed=*/!std::isfinite(value) && allFinite(grads)};
}

double gradientNorm(const std::vector<at::Tensor>& gradients, GradNormMethod method) {
  const auto grads = strided(gradients);
  return method == GradNormMethod::Blocked && blockable(grads) ? blockedNorm(grads) : foreachNorm(grads);
}

double lossValue(const at::Tensor& loss) {
  at::NoGradGuard noGrad;
  const at::Tensor l = loss.detach();
  return l.numel() == 1 ? l.item<double>() : l.sum().item<double>();
}

}  // namespace crashcap::formats::torch
