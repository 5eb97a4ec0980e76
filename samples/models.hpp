#pragma once
// The sample programs' models: two small real training models as TorchScript modules whose
// forward computes the whole loss (so a replayer can re-run a saved copy), their procedural
// data, and the faults the samples can inject.
//
// Everything here is deterministic in its seed and never touches LibTorch's global RNG, except
// the classifier's dropout, which draws from the global generator on purpose: it is the state
// a recorder has to capture for a replay to match.
//
// The samples turn TorchScript's graph executor optimisation off unless --jit-optimize: with it
// (LibTorch's default), a module's calls after its profiling calls run an optimised graph whose
// autodiff backward can differ in the last bit from the first call's (seen in the segmenter's
// gradients). The recorder keeps the setting and replay runs under it, making the profiling
// calls a run makes before the keyframe's step, so replay is bit for bit either way.

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/api/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace crashcap::samples {

/// A failure a sample can be told to cause.
enum class Fault {
  None,
  NanSample,  ///< a patch of NaN pixels in one image of one batch
  BadLabel,   ///< a class label equal to numClasses (classifier only)
  DiceEps0,   ///< one image whose every pixel is don't-care; a Dice epsilon of 0 turns it into 0/0 (segmenter only)
  LrBlowup,   ///< the learning rate runs away from a given step on
};

/// Parses "none", "nan-sample", "bad-label", "dice-eps0" or "lr-blowup"; throws std::invalid_argument listing the valid names.
Fault parseFault(const std::string& name);

/// The name parseFault accepts for `fault`.
const char* faultName(Fault fault);

/// Which fault to inject, at which step, into which row of that step's batch.
struct FaultPlan {
  Fault fault = Fault::None;
  int64_t step = 5;  ///< step whose batch (or, for LrBlowup, first step whose rate) is affected
  int64_t row = 0;   ///< batch row for NanSample, BadLabel and DiceEps0; must be < the batch size
};

/// A TorchScript training model: forward(inputs...) returns the 0-d float32 loss. Each make*Model
/// call builds an independent module (its own compilation unit) that shares no state with others.
struct SampleModel {
  torch::jit::Module module;        ///< in training mode; every parameter requires grad
  std::vector<std::string> inputs;  ///< names of forward's arguments, in order
};

/// Segmenter in the shape of a DB text detector, for 1x64x64 images.
/// Encoder: stem (3x3 stride 2) and three one-block residual stages (stride 1, 2, 2) with batch
/// norm; FPN neck fusing the three stages at 1/2 resolution; DB head: probability map P and
/// threshold map T at full resolution, approximate binary map B = sigmoid(50 (P - T)).
/// Loss = BCE(P, masked) + Dice(B; per image, epsilon `diceEps`, mean over the batch)
///        + 10 * L1(T, masked to the threshold region).
/// Inputs: image [N,1,64,64], prob_map, prob_mask, thresh_map, thresh_mask (each [N,1,64,64] float32).
/// `diceEps` is stored in the module (attribute dice_eps), so a saved copy computes the same loss.
SampleModel makeSegModel(uint64_t seed, double diceEps = 1e-6);

/// Batch `step` of the segmenter's data, in makeSegModel's input order: one to four "text lines"
/// (rows of bright blobs) per noisy image, DB-style targets (shrunk text as the probability map,
/// a threshold ramp around each line's border), some lines marked don't-care (mask 0).
/// Deterministic in (seed, step). Applies plan's NanSample or DiceEps0 when plan.step == step;
/// throws std::invalid_argument when that needs a row outside [0, batchSize).
std::vector<at::Tensor> makeSegBatch(uint64_t seed, int64_t step, int64_t batchSize, const FaultPlan& plan);

/// Classifier of 1x28x28 shape images: three 3x3 conv + batch norm + relu + 2x2 max-pool layers
/// (28 -> 14 -> 7 -> 3, 16/32/32 channels), flatten (288), dropout (p = 0.25, drawn from the
/// global RNG), a linear layer and cross-entropy loss.
/// Inputs: image [N,1,28,28] float32, label [N] int64. Throws std::invalid_argument unless 2 <= numClasses <= 10.
SampleModel makeClsModel(uint64_t seed, int64_t numClasses = 10);

/// Batch `step` of the classifier's data, {image, label}: one shape per image (disk, ring, square,
/// frame, bars, plus, cross, triangle, two dots; the first numClasses of these), with random
/// position, size, rotation, intensity and noise. Deterministic in (seed, step). Applies plan's
/// NanSample or BadLabel (label = numClasses) when plan.step == step; throws std::invalid_argument
/// for a row outside [0, batchSize) or numClasses outside [2, 10].
std::vector<at::Tensor> makeClsBatch(uint64_t seed, int64_t step, int64_t batchSize, int64_t numClasses,
                                     const FaultPlan& plan);

/// A wide multi-layer perceptron, for trainings whose state is large: `layers` linear layers of
/// width x width (tanh after each) and a mean-squared-error loss; its weights are
/// layers * width * (width + 1) floats (6 layers of 4096: 403 MB, 1.2 GB with Adam's moments).
/// Inputs: x [N,width], y [N,width] float32. Throws std::invalid_argument for width or layers < 1.
SampleModel makeWideModel(uint64_t seed, int64_t width, int64_t layers);

/// Batch `step` of the wide model's data, {x, y}: x ~ N(0, 1), y[i] = tanh(0.8 x[i+1]) (a shift the
/// layers can learn). Deterministic in
/// (seed, step). Applies plan's NanSample (four NaN features in row plan.row) when plan.step == step.
std::vector<at::Tensor> makeWideBatch(uint64_t seed, int64_t step, int64_t batchSize, int64_t width,
                                      const FaultPlan& plan);

/// The factor by which LrBlowup multiplies the learning rate at each step from plan.step on.
constexpr double kLrBlowupFactor = 1e8;

/// Learning rate for `step`: `base`, or under LrBlowup from plan.step on
/// base * kLrBlowupFactor^(step - plan.step + 1), a runaway schedule that makes both models'
/// loss non-finite within a few steps with SGD and with Adam.
double learningRate(double base, int64_t step, const FaultPlan& plan);

}  // namespace crashcap::samples
