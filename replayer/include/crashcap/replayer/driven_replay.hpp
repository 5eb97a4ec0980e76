#pragma once
// A replay driven by the recorded program's own training loop: a Python training, whose
// forward, loss, backward, gradient clipping and optimizer are the program's code, not a step
// function the engine can call. The engine plans the replay as replay() does (target, keyframe,
// device, settings), restores the keyframe's weights and buffers into the program's model, hands
// out each step's batch, generator states and learning rates, compares each step's loss and
// gradient norm with the recording bit for bit, probes the target step op by op (first
// non-finite op), and concludes the same verdict. The program restores the rest of its state
// (its optimizer's state_dict, its own generators) from what readTensor gives it.
//
//   DrivenReplay r(bundle, options, model_parameters, model_buffers);
//   r.restoreModel();               // then the program restores its optimizer
//   for (int64_t s : r.steps()) {
//     auto step = r.beginStep(s);   // the program sets its learning rates, feeds step.batch
//     r.startProbe();
//     ... forward, loss, backward ...   (an exception: r.stepFailed(text); stop)
//     r.endStep(loss);
//     ... optimizer step (not after the target) ...
//   }
//   ReplayResult result = r.finish();
//
// Ops bisection (compareWithReference in replay.hpp) runs the program's loop twice, in two
// processes: a driven replay constructed as the Reference side replays to the target as recorded,
// runs the target step in float64 on the CPU and writes its op outputs to a file; one constructed
// as the Replay side reads them and compares the target step's ops with them. finishComparison()
// gives each side's part of the ReferenceComparison; crashcap joins the two.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::replayer {

class DrivenReplay {
 public:
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

  /// Which side of an ops bisection this replay is; Both (the default) is a plain replay.
  struct Comparison {
    ComparisonSide side = ComparisonSide::Both;
    std::string outputs;      ///< the reference's op outputs: Reference writes the file, Replay reads it
    double tolerance = 1e-3;  ///< of the Replay side's comparison
  };

  /// Opens and plans the replay; applies the recorded (or requested) settings. `parameters` and
  /// `buffers` are the program's model, which replay moves to its device and overwrites in place
  /// (the Reference side widens them to float64 at the target step). Throws crashcap::Error as
  /// replay() does.
  DrivenReplay(const std::string& bundle, const ReplayOptions& options, const NamedTensors& parameters,
               const NamedTensors& buffers);
  DrivenReplay(const std::string& bundle, const ReplayOptions& options, const NamedTensors& parameters,
               const NamedTensors& buffers, Comparison comparison);
  ~DrivenReplay();
  DrivenReplay(const DrivenReplay&) = delete;
  DrivenReplay& operator=(const DrivenReplay&) = delete;

  int64_t target() const;
  int64_t keyframe() const;
  /// The steps to run, keyframe to target (fewer when the recording lost a step).
  std::vector<int64_t> steps() const;
  const formats::KeyframeData& keyframeRecord() const;
  const formats::StepProgramData& program() const;
  /// A fact of the recording's environment record ("" when absent).
  std::string environmentFact(const std::string& key) const;
  /// Something that differs from the recording (changed sources, another torch): said in the
  /// result's notes, and the setup is no longer the recorded one (bits are not compared).
  void note(const std::string& text);
  /// A tensor of the bundle as recorded, on the CPU.
  at::Tensor readTensor(const std::string& name) const;

  /// Restores the keyframe's weights and buffers into the model.
  void restoreModel();

  struct Step {
    NamedTensors batch;                  ///< by batch name, on the replay's device, rows chosen at the target
    std::string structure;               ///< StepBegin.structure
    std::vector<double> learningRates;   ///< per parameter group
    /// Per group, those the recorded update used when the program set them after the batch
    /// (formats::StepEndData::updateLearningRates), for end(loss) to set; empty: learningRates.
    std::vector<double> updateLearningRates;
    std::vector<std::pair<std::string, std::string>> generators;  ///< (device, tensor name) beyond LibTorch's
  };
  /// Step `step` begins: LibTorch's generators are restored (the program restores the others);
  /// at the target the gradients are cleared when it compares, and the Reference side widens the
  /// model, the batch and the default dtype to float64.
  Step beginStep(int64_t step);
  /// ReplayOptions::keyframeOut asks for the target step's state as a keyframe.
  bool wantsKeyframe() const;
  /// Just before beginStep(target), after the program's update of the step before it: writes the
  /// keyframe ReplayOptions::keyframeOut asks for (the engine's weights and buffers, and the
  /// program's optimizer state and documents, named as the recorder names them) when every step
  /// so far replayed bit for bit; the result says whether it did.
  void writeKeyframe(const NamedTensors& optimizerState, const std::vector<std::pair<std::string, std::string>>& documents);
  /// The program's own code of the step starts (its batch is in place, its generators restored):
  /// at the target, the op probe starts here, so that it sees the step's ops and no others.
  void startProbe();
  /// After the step's backward: its loss and gradient norm are compared with the recording's.
  /// True when the step is over. With `laterBackwards` (a program whose every backward() is
  /// seen: crashcap's observer), the target step of a recording that failed with a non-finite
  /// loss stays open when this first loss and gradient norm are finite: the recorded loss came
  /// from a later backward(), which laterBackward() checks. The step ends there, or when the
  /// program calls finish() (it reached its update without one).
  bool endStep(const at::Tensor& loss, bool laterBackwards = false);
  /// A later backward() of the step endStep left open: true when its loss is non-finite, which
  /// ends the step (StepReplay::laterBackward).
  bool laterBackward(const at::Tensor& loss);
  /// The step threw: `error` as the program would print it.
  void stepFailed(const std::string& error);
  /// The recording crashed while its DataLoader loaded the batch after the target step (phase
  /// "loading"), with the batch's indices recorded, and this is a plain replay of the whole batch:
  /// the batch to load again once the target step has ended (indices and datasetIndices filled).
  std::optional<BatchLoad> batchToLoad() const;
  /// The program loaded batchToLoad() again after the target step: `load.error` is what it raised
  /// ("" none), and the target step's error.
  void batchLoaded(BatchLoad load);
  /// A plain replay of the whole batch, of a step whose batch holds the sampler's dataset indices:
  /// those indices, in the sampler's order, for the program to find which row holds which sample
  /// (RowOrder). Empty: not asked.
  std::vector<int64_t> rowsToMatch() const;
  /// What the program found (RowOrder); once the target step has ended.
  void rowsMatched(RowOrder order);
  /// The verdict. Throws Error{Unsupported} when the program's loop stopped before the target.
  ReplayResult finish();
  /// A side of an ops bisection ends: the Reference side writes its op outputs and fills
  /// `reference`; the Replay side fills `replay` and the comparison. Throws as finish() does.
  ReferenceComparison finishComparison();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crashcap::replayer
