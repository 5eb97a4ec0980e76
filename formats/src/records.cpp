#include "crashcap/formats/records.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

#include "capnp_util.hpp"
#include "meta.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/step_numbers.hpp"

namespace crashcap::formats {
namespace {

using detail::text;
using detail::toBytes;
using detail::withRoot;

constexpr size_t kNameBytes = 1024;
constexpr size_t kMaxListEntries = 1u << 20;

template <typename List>
void setTexts(List list, const std::vector<std::string>& values) {
  for (unsigned i = 0; i < values.size(); ++i) list.set(i, values[i]);
}

template <typename Builder>
void setNumbers(Builder list, const std::vector<NumberEntry>& values) {
  for (unsigned i = 0; i < values.size(); ++i) {
    list[i].setKey(values[i].first);
    list[i].setValue(values[i].second);
  }
}

template <typename List>
void checkCount(List list, const char* what) {
  if (list.size() > kMaxListEntries)
    throw Error(ErrorCode::Corrupt, fmt::format("{} lists {} entries; at most {} allowed", what, list.size(),
                                                kMaxListEntries));
}

/// Texts that are tensor names must be valid tensor names.
std::vector<std::string> names(capnp::List<capnp::Text>::Reader list, const char* what) {
  checkCount(list, what);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto t : list) {
    auto s = text(t, kNameBytes, what);
    try {
      validateTensorName(s);
    } catch (const Error& e) {
      throw Error(ErrorCode::Corrupt, fmt::format("{}: {}", what, e.message()));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list, size_t maxBytes, const char* what) {
  checkCount(list, what);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (auto t : list) out.push_back(text(t, maxBytes, what));
  return out;
}

std::vector<NumberEntry> numbers(capnp::List<schema::Number>::Reader list, const char* what) {
  checkCount(list, what);
  std::vector<NumberEntry> out;
  for (auto n : list) out.emplace_back(text(n.getKey(), 256, what), n.getValue());
  return out;
}

int64_t stepOf(int64_t step, const char* what) {
  if (step < 0) throw Error(ErrorCode::Corrupt, fmt::format("{} has step {}; steps are >= 0", what, step));
  return step;
}

template <typename Root, typename Fn>
auto decode(const std::vector<uint8_t>& meta, const ReaderLimits& limits, const char* what, Fn&& fn) {
  return withRoot<Root>(meta.data(), meta.size(), limits, what, std::forward<Fn>(fn));
}

}  // namespace

double ParamGroupData::option(const std::string& key, double fallback) const {
  for (const auto& [k, v] : options)
    if (k == key) return v;
  return fallback;
}

std::vector<uint8_t> encodeMeta(const StepProgramData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::StepProgram>();
  r.setFormat(v.format);
  setTexts(r.initInputs(v.inputs.size()), v.inputs);
  setTexts(r.initParameters(v.parameters.size()), v.parameters);
  setTexts(r.initBuffers(v.buffers.size()), v.buffers);
  r.setArchive(v.archive);
  r.setDevice(v.device);
  r.setServesReplay(v.servesReplay);
  auto sources = r.initSources(v.sources.size());
  for (unsigned i = 0; i < v.sources.size(); ++i) {
    sources[i].setPath(v.sources[i].path);
    sources[i].setSha256(v.sources[i].sha256);
    sources[i].setBytes(v.sources[i].bytes);
    sources[i].setTensor(v.sources[i].tensor);
  }
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const OptimizerSpecData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::OptimizerSpec>();
  r.setKind(v.kind);
  auto groups = r.initGroups(v.groups.size());
  for (unsigned i = 0; i < v.groups.size(); ++i) {
    setTexts(groups[i].initParameters(v.groups[i].parameters.size()), v.groups[i].parameters);
    setNumbers(groups[i].initOptions(v.groups[i].options.size()), v.groups[i].options);
  }
  r.setGradClipNorm(v.gradClipNorm);
  r.setGradClipNormType(v.gradClipNormType);
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const StepBeginData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::StepBegin>();
  r.setStep(v.step);
  setTexts(r.initBatch(v.batch.size()), v.batch);
  setTexts(r.initRng(v.rng.size()), v.rng);
  auto lrs = r.initLearningRates(v.learningRates.size());
  for (unsigned i = 0; i < v.learningRates.size(); ++i) lrs.set(i, v.learningRates[i]);
  r.setTimeNs(v.timeNs);
  r.setKeyframe(v.keyframe);
  r.setPreviousStep(v.previousStep);
  r.setStructure(v.structure);
  auto dims = r.initRowDims(v.rowDims.size());
  for (unsigned i = 0; i < v.rowDims.size(); ++i) dims.set(i, v.rowDims[i]);
  r.setAccumulating(v.accumulating);
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const StepEndData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::StepEnd>();
  r.setStep(v.step);
  r.setLoss(v.loss);
  r.setGradNorm(v.gradNorm);
  r.setHasGradNorm(v.hasGradNorm);
  r.setNonFinite(v.nonFinite);
  r.setDurationNs(v.durationNs);
  r.setGradNormMethod(static_cast<uint8_t>(v.gradNormMethod));
  auto lrs = r.initUpdateLearningRates(v.updateLearningRates.size());
  for (unsigned i = 0; i < v.updateLearningRates.size(); ++i) lrs.set(i, v.updateLearningRates[i]);
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const KeyframeData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Keyframe>();
  r.setStep(v.step);
  setTexts(r.initParameters(v.parameters.size()), v.parameters);
  setTexts(r.initBuffers(v.buffers.size()), v.buffers);
  setTexts(r.initOptimizerState(v.optimizerState.size()), v.optimizerState);
  setNumbers(r.initOptimizerScalars(v.optimizerScalars.size()), v.optimizerScalars);
  setTexts(r.initDocuments(v.documents.size()), v.documents);
  return toBytes(b);
}

namespace {
template <typename Inputs>
void setOpInputs(Inputs inputs, const std::vector<OpInputData>& from) {
  for (unsigned k = 0; k < from.size(); ++k) {
    inputs[k].setDtype(from[k].dtype);
    auto shape = inputs[k].initShape(from[k].shape.size());
    for (unsigned d = 0; d < from[k].shape.size(); ++d) shape.set(d, from[k].shape[d]);
  }
}

void setOp(schema::Op::Builder w, const OpData& o) {
  w.setIndex(o.index);
  w.setName(o.name);
  w.setPhase(o.phase);
  w.setSequenceNr(o.sequenceNr);
  w.setStep(o.step);
  w.setThread(o.thread);
  w.setStartNs(o.startNs);
  w.setEndNs(o.endNs);
  setOpInputs(w.initInputs(o.inputs.size()), o.inputs);
}
}  // namespace

std::vector<uint8_t> encodeMeta(const OpTraceData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::OpTrace>();
  auto ops = r.initOps(v.ops.size());
  for (unsigned i = 0; i < v.ops.size(); ++i) setOp(ops[i], v.ops[i]);
  r.setTotalOps(v.totalOps);
  r.setCapacity(v.capacity);
  auto collectives = r.initCollectives(v.collectives.size());
  for (unsigned i = 0; i < v.collectives.size(); ++i) {
    const auto& c = v.collectives[i];
    auto w = collectives[i];
    w.setSeq(c.seq);
    w.setName(c.name);
    w.setStep(c.step);
    w.setThread(c.thread);
    w.setStartNs(c.startNs);
    w.setEndNs(c.endNs);
    setOpInputs(w.initInputs(c.inputs.size()), c.inputs);
  }
  r.setTotalCollectives(v.totalCollectives);
  auto indexOps = r.initIndexOps(v.indexOps.size());
  for (unsigned i = 0; i < v.indexOps.size(); ++i) setOp(indexOps[i], v.indexOps[i]);
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const CrashData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Crash>();
  r.setKind(v.kind);
  r.setStep(v.step);
  r.setPhase(v.phase);
  // The error text is bounded like a note: a huge what() must not make the record unreadable.
  r.setError(v.error.size() > kMaxNoteTextBytes ? v.error.substr(0, kMaxNoteTextBytes) : v.error);
  r.setErrorType(v.errorType);
  r.setSignal(v.signal);
  r.setSignalName(v.signalName);
  setTexts(r.initStack(v.stack.size()), v.stack);
  r.setTimeNs(v.timeNs);
  r.setPid(v.pid);
  r.setThread(v.thread);
  // Both lists or neither: the two name the same samples, place by place.
  if (v.loadingIndices.size() == v.loadingDatasetIndices.size() && v.loadingIndices.size() <= kMaxLoadingIndices) {
    auto own = r.initLoadingIndices(static_cast<unsigned>(v.loadingIndices.size()));
    auto data = r.initLoadingDatasetIndices(static_cast<unsigned>(v.loadingDatasetIndices.size()));
    for (unsigned i = 0; i < own.size(); ++i) {
      own.set(i, v.loadingIndices[i]);
      data.set(i, v.loadingDatasetIndices[i]);
    }
  }
  // The other loader's batch: its names and row dimensions go together, or not at all.
  if (v.otherLoader >= 0 && (v.otherRowDims.empty() || v.otherRowDims.size() == v.otherBatch.size())) {
    r.setOtherLoader(v.otherLoader);
    setTexts(r.initOtherBatch(v.otherBatch.size()), v.otherBatch);
    r.setOtherStructure(v.otherStructure.size() <= (64 << 10) ? v.otherStructure : "");  // as decodeCrash reads it
    auto dims = r.initOtherRowDims(v.otherRowDims.size());
    for (unsigned i = 0; i < v.otherRowDims.size(); ++i) dims.set(i, v.otherRowDims[i]);
  }
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const RunStatusData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::RunStatus>();
  r.setState(v.state);
  r.setStepsBegun(v.stepsBegun);
  r.setLastStep(v.lastStep);
  r.setDroppedRecords(v.droppedRecords);
  r.setDroppedBytes(v.droppedBytes);
  setTexts(r.initWarnings(v.warnings.size()), v.warnings);
  r.setSegmentsDeleted(v.segmentsDeleted);
  auto lost = r.initLostSteps(static_cast<unsigned>(std::min(v.lostSteps.size(), kMaxListedLostSteps)));
  for (unsigned i = 0; i < lost.size(); ++i) lost.set(i, v.lostSteps[i]);
  r.setLostStepCount(std::max<uint64_t>(v.lostStepCount, v.lostSteps.size()));
  r.setKeyframesSkipped(v.keyframesSkipped);
  r.setLastPhase(v.lastPhase);
  r.setKeyframeInterval(v.keyframeInterval);
  r.setBufferPoolPeakBytes(v.bufferPoolPeakBytes);
  r.setKeyframesWrittenRaw(v.keyframesWrittenRaw);
  r.setLastOp(v.lastOp);
  r.setCollectivesIssued(v.collectivesIssued);
  r.setLastCollective(v.lastCollective);
  r.setLastCollectiveStep(v.lastCollectiveStep);
  return toBytes(b);
}

std::vector<uint8_t> encodeMeta(const EnvironmentData& v) { return detail::encodeEnvironment(v); }

StepProgramData decodeStepProgram(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::StepProgram>(meta, limits, "step_program", [](auto r) {
    StepProgramData v;
    v.format = text(r.getFormat(), 64, "step program format");
    v.inputs = texts(r.getInputs(), kNameBytes, "step program input");
    v.parameters = texts(r.getParameters(), kNameBytes, "step program parameter");
    v.buffers = texts(r.getBuffers(), kNameBytes, "step program buffer");
    v.archive = text(r.getArchive(), kNameBytes, "step program archive");
    v.device = text(r.getDevice(), 64, "step program device");
    v.servesReplay = r.getServesReplay();
    checkCount(r.getSources(), "step program sources");
    for (auto f : r.getSources()) {
      SourceFileData d;
      d.path = text(f.getPath(), 4096, "source file path");
      d.sha256 = text(f.getSha256(), 64, "source file sha256");
      d.bytes = f.getBytes();
      d.tensor = text(f.getTensor(), kNameBytes, "source file tensor");
      v.sources.push_back(std::move(d));
    }
    return v;
  });
}

OptimizerSpecData decodeOptimizerSpec(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::OptimizerSpec>(meta, limits, "optimizer_spec", [](auto r) {
    OptimizerSpecData v;
    v.kind = text(r.getKind(), 64, "optimizer kind");
    checkCount(r.getGroups(), "optimizer spec");
    for (auto g : r.getGroups()) {
      ParamGroupData d;
      d.parameters = texts(g.getParameters(), kNameBytes, "optimizer group parameter");
      d.options = numbers(g.getOptions(), "optimizer option");
      v.groups.push_back(std::move(d));
    }
    v.gradClipNorm = r.getGradClipNorm();
    v.gradClipNormType = r.getGradClipNormType();
    if (!(v.gradClipNorm >= 0))
      throw Error(ErrorCode::Corrupt, fmt::format("optimizer spec has gradient clip norm {}; must be >= 0",
                                                  v.gradClipNorm));
    return v;
  });
}

StepBeginData decodeStepBegin(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::StepBegin>(meta, limits, "step_begin", [](auto r) {
    StepBeginData v;
    v.step = stepOf(r.getStep(), "step_begin");
    v.batch = names(r.getBatch(), "step_begin batch tensor");
    v.rng = names(r.getRng(), "step_begin generator state");
    checkCount(r.getLearningRates(), "step_begin learning rates");
    for (double lr : r.getLearningRates()) v.learningRates.push_back(lr);
    v.timeNs = r.getTimeNs();
    v.keyframe = r.getKeyframe();
    if (v.keyframe > v.step)
      throw Error(ErrorCode::Corrupt,
                  fmt::format("step_begin of step {} names keyframe {}, which is after it", v.step, v.keyframe));
    v.previousStep = r.getPreviousStep();
    if (v.previousStep < -2 || v.previousStep >= v.step)
      throw Error(ErrorCode::Corrupt, fmt::format("step_begin of step {} names previous step {}: expected -2..{}",
                                                  v.step, v.previousStep, v.step - 1));
    v.structure = text(r.getStructure(), 64 << 10, "step_begin batch structure");
    const auto dims = r.getRowDims();
    if (dims.size() != 0 && dims.size() != v.batch.size())
      throw Error(ErrorCode::Corrupt, fmt::format("step_begin of step {} has {} row dimensions for {} batch tensors",
                                                  v.step, dims.size(), v.batch.size()));
    for (int8_t d : dims) {
      if (d < -1)
        throw Error(ErrorCode::Corrupt,
                    fmt::format("step_begin of step {} names row dimension {}: expected -1 or more", v.step, d));
      v.rowDims.push_back(d);
    }
    v.accumulating = r.getAccumulating();
    return v;
  });
}

StepEndData decodeStepEnd(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::StepEnd>(meta, limits, "step_end", [](auto r) {
    StepEndData v;
    v.step = stepOf(r.getStep(), "step_end");
    v.loss = r.getLoss();
    v.gradNorm = r.getGradNorm();
    v.hasGradNorm = r.getHasGradNorm();
    v.nonFinite = r.getNonFinite();
    v.durationNs = r.getDurationNs();
    const uint8_t method = r.getGradNormMethod();
    if (method > static_cast<uint8_t>(GradNormMethod::Blocked))
      throw Error(ErrorCode::Corrupt,
                  fmt::format("step_end of step {} names gradient-norm method {}, which this crashcap does not know",
                              v.step, method),
                  "a newer crashcap wrote it: replay it with that version");
    v.gradNormMethod = static_cast<GradNormMethod>(method);
    checkCount(r.getUpdateLearningRates(), "step_end update learning rates");
    for (double lr : r.getUpdateLearningRates()) v.updateLearningRates.push_back(lr);
    return v;
  });
}

const std::vector<double>& updateLearningRates(const StepBeginData& begin, const StepEndData* end) {
  return end && !end->updateLearningRates.empty() ? end->updateLearningRates : begin.learningRates;
}

KeyframeData decodeKeyframe(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::Keyframe>(meta, limits, "keyframe", [](auto r) {
    KeyframeData v;
    v.step = stepOf(r.getStep(), "keyframe");
    v.parameters = names(r.getParameters(), "keyframe parameter");
    v.buffers = names(r.getBuffers(), "keyframe buffer");
    v.optimizerState = names(r.getOptimizerState(), "keyframe optimizer state");
    v.optimizerScalars = numbers(r.getOptimizerScalars(), "keyframe optimizer scalar");
    v.documents = names(r.getDocuments(), "keyframe document");
    return v;
  });
}

namespace {
template <typename Inputs>
std::vector<OpInputData> opInputs(Inputs inputs, const std::string& op) {
  if (inputs.size() > 64) throw Error(ErrorCode::Corrupt, fmt::format("op '{}' lists {} inputs; at most 64", op, inputs.size()));
  std::vector<OpInputData> out;
  for (auto in : inputs) out.push_back({text(in.getDtype(), 32, "op input dtype"), detail::shapeOf(in.getShape())});
  return out;
}

OpData opOf(schema::Op::Reader o) {
  OpData d;
  d.index = o.getIndex();
  d.name = text(o.getName(), 512, "op name");
  d.phase = text(o.getPhase(), 32, "op phase");
  d.sequenceNr = o.getSequenceNr();
  d.step = o.getStep();
  d.thread = o.getThread();
  d.startNs = o.getStartNs();
  d.endNs = o.getEndNs();
  d.inputs = opInputs(o.getInputs(), d.name);
  return d;
}
}  // namespace

OpTraceData decodeOpTrace(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::OpTrace>(meta, limits, "op_trace", [](auto r) {
    OpTraceData v;
    checkCount(r.getOps(), "op trace");
    for (auto o : r.getOps()) v.ops.push_back(opOf(o));
    checkCount(r.getIndexOps(), "op trace's index ops");
    for (auto o : r.getIndexOps()) v.indexOps.push_back(opOf(o));
    v.totalOps = r.getTotalOps();
    v.capacity = r.getCapacity();
    checkCount(r.getCollectives(), "collective trace");
    for (auto c : r.getCollectives()) {
      CollectiveData d;
      d.seq = c.getSeq();
      d.name = text(c.getName(), 512, "collective name");
      d.step = c.getStep();
      d.thread = c.getThread();
      d.startNs = c.getStartNs();
      d.endNs = c.getEndNs();
      d.inputs = opInputs(c.getInputs(), d.name);
      v.collectives.push_back(std::move(d));
    }
    v.totalCollectives = r.getTotalCollectives();
    return v;
  });
}

CrashData decodeCrash(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::Crash>(meta, limits, "crash", [](auto r) {
    CrashData v;
    v.kind = text(r.getKind(), 64, "crash kind");
    v.step = r.getStep();
    v.phase = text(r.getPhase(), 64, "crash phase");
    v.error = text(r.getError(), kMaxNoteTextBytes, "crash error");
    v.errorType = text(r.getErrorType(), 1024, "crash error type");
    v.signal = r.getSignal();
    v.signalName = text(r.getSignalName(), 64, "crash signal name");
    v.stack = texts(r.getStack(), 4096, "crash stack frame");
    v.timeNs = r.getTimeNs();
    v.pid = r.getPid();
    v.thread = r.getThread();
    auto own = r.getLoadingIndices();
    auto data = r.getLoadingDatasetIndices();
    if (own.size() != data.size() || own.size() > kMaxLoadingIndices)
      throw Error(ErrorCode::Corrupt, fmt::format("crash lists {} loading indices and {} dataset indices: the same "
                                                  "number, at most {}",
                                                  own.size(), data.size(), kMaxLoadingIndices));
    for (int64_t i : own) v.loadingIndices.push_back(i);
    for (int64_t i : data) v.loadingDatasetIndices.push_back(i);
    v.otherLoader = r.getOtherLoader();
    if (v.otherLoader < -1)
      throw Error(ErrorCode::Corrupt, fmt::format("crash names DataLoader #{}: expected -1 or more", v.otherLoader));
    v.otherBatch = names(r.getOtherBatch(), "crash other batch tensor");
    for (const auto& name : v.otherBatch)
      if (name.rfind(batchTensorName(kCrashBatchStep, ""), 0) != 0)
        throw Error(ErrorCode::Corrupt, fmt::format("crash names '{}' as another loader's batch tensor: expected {}<name>",
                                                    name, batchTensorName(kCrashBatchStep, "")));
    if (v.otherLoader < 0 && !v.otherBatch.empty())
      throw Error(ErrorCode::Corrupt, "crash holds another loader's batch without naming the loader");
    v.otherStructure = text(r.getOtherStructure(), 64 << 10, "crash other batch structure");
    const auto dims = r.getOtherRowDims();
    if (dims.size() != 0 && dims.size() != v.otherBatch.size())
      throw Error(ErrorCode::Corrupt, fmt::format("crash has {} row dimensions for {} tensors of another loader's batch",
                                                  dims.size(), v.otherBatch.size()));
    for (int8_t d : dims) {
      if (d < -1)
        throw Error(ErrorCode::Corrupt,
                    fmt::format("crash names row dimension {} in another loader's batch: expected -1 or more", d));
      v.otherRowDims.push_back(d);
    }
    return v;
  });
}

std::vector<uint8_t> encodeMeta(const SupervisionData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Supervision>();
  setTexts(r.initCommand(v.command.size()), v.command);
  r.setAttempt(v.attempt);
  r.setPid(v.pid);
  r.setExitCode(v.exitCode);
  r.setSignal(v.signal);
  r.setSignalName(v.signalName);
  r.setClassification(v.classification);
  r.setEvidence(v.evidence);
  r.setStdoutTail(v.stdoutTail);
  r.setStderrTail(v.stderrTail);
  r.setStartNs(v.startNs);
  r.setEndNs(v.endNs);
  r.setTrace(v.trace);
  r.setInterrupted(v.interrupted);
  r.setStopped(v.stopped);
  setTexts(r.initEnvironment(v.environment.size()), v.environment);
  r.setCudnnLogTail(v.cudnnLogTail);
  setTexts(r.initParams(v.params.size()), v.params);
  return toBytes(b);
}

SupervisionData decodeSupervision(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::Supervision>(meta, limits, "supervision", [](auto r) {
    SupervisionData v;
    v.command = texts(r.getCommand(), 1 << 16, "supervised command argument");
    v.attempt = r.getAttempt();
    v.pid = r.getPid();
    v.exitCode = r.getExitCode();
    v.signal = r.getSignal();
    v.signalName = text(r.getSignalName(), 64, "signal name");
    v.classification = text(r.getClassification(), 64, "classification");
    v.evidence = text(r.getEvidence(), 1 << 16, "classification evidence");
    v.stdoutTail = text(r.getStdoutTail(), 1 << 22, "stdout tail");
    v.stderrTail = text(r.getStderrTail(), 1 << 22, "stderr tail");
    v.startNs = r.getStartNs();
    v.endNs = r.getEndNs();
    v.trace = text(r.getTrace(), 4096, "trace status");
    v.interrupted = r.getInterrupted();
    v.stopped = r.getStopped();
    v.environment = texts(r.getEnvironment(), 1 << 16, "supervised environment entry");
    v.cudnnLogTail = text(r.getCudnnLogTail(), 1 << 22, "cuDNN log tail");
    v.params = texts(r.getParams(), 4096, "run parameter");
    return v;
  });
}

std::vector<uint8_t> encodeMeta(const DistributedData& v) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::Distributed>();
  r.setJobId(v.jobId);
  r.setJobIdSource(v.jobIdSource);
  r.setRank(v.rank);
  r.setWorldSize(v.worldSize);
  r.setLocalRank(v.localRank);
  r.setBackend(v.backend);
  r.setRendezvous(v.rendezvous);
  r.setSource(v.source);
  return toBytes(b);
}

DistributedData decodeDistributed(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::Distributed>(meta, limits, "distributed", [](auto r) {
    DistributedData v;
    v.jobId = text(r.getJobId(), 4096, "job id");
    v.jobIdSource = text(r.getJobIdSource(), 4096, "job id source");
    v.rank = r.getRank();
    v.worldSize = r.getWorldSize();
    v.localRank = r.getLocalRank();
    v.backend = text(r.getBackend(), 4096, "distributed backend");
    v.rendezvous = text(r.getRendezvous(), 4096, "rendezvous");
    v.source = text(r.getSource(), 4096, "distributed source");
    if (v.worldSize < 1)
      throw Error(ErrorCode::Corrupt, fmt::format("distributed record has world size {}; must be >= 1", v.worldSize));
    if (v.rank < 0 || v.rank >= v.worldSize)
      throw Error(ErrorCode::Corrupt,
                  fmt::format("distributed record has rank {} of world size {}; must be in [0, {})", v.rank,
                              v.worldSize, v.worldSize));
    if (v.localRank < -1 || v.localRank >= v.worldSize)
      throw Error(ErrorCode::Corrupt,
                  fmt::format("distributed record has local rank {}; must be -1 (not known) or in [0, {})",
                              v.localRank, v.worldSize));
    return v;
  });
}

const char* activityKindName(TraceActivityData::Kind kind) {
  switch (kind) {
    case TraceActivityData::Kind::Kernel: return "kernel";
    case TraceActivityData::Kind::Memcpy: return "memcpy";
    case TraceActivityData::Kind::Memset: return "memset";
    case TraceActivityData::Kind::Runtime: return "runtime";
    case TraceActivityData::Kind::Driver: return "driver";
    case TraceActivityData::Kind::Overhead: return "overhead";
  }
  return "unknown";
}

namespace {

/// The string table of one kernel trace record.
class NameTable {
 public:
  uint32_t intern(const std::string& name) {
    if (name.size() > kMaxTraceNameBytes) ++cut_;
    std::string cut = name.size() > kMaxTraceNameBytes ? name.substr(0, kMaxTraceNameBytes) : name;
    auto [it, added] = index_.emplace(cut, static_cast<uint32_t>(names_.size()));
    if (added) names_.push_back(std::move(cut));
    return it->second;
  }
  const std::vector<std::string>& names() const { return names_; }
  uint64_t cut() const { return cut_; }  ///< names longer than the limit that were cut here

 private:
  uint64_t cut_ = 0;
  std::unordered_map<std::string, uint32_t> index_;
  std::vector<std::string> names_;
};

/// Grid and block, which TraceActivity and KernelLaunch both carry as six fields.
template <typename Builder>
void writeDims(Builder w, const int32_t (&grid)[3], const int32_t (&block)[3]) {
  w.setGridX(grid[0]);
  w.setGridY(grid[1]);
  w.setGridZ(grid[2]);
  w.setBlockX(block[0]);
  w.setBlockY(block[1]);
  w.setBlockZ(block[2]);
}

template <typename Reader>
void readDims(Reader r, int32_t (&grid)[3], int32_t (&block)[3]) {
  grid[0] = r.getGridX();
  grid[1] = r.getGridY();
  grid[2] = r.getGridZ();
  block[0] = r.getBlockX();
  block[1] = r.getBlockY();
  block[2] = r.getBlockZ();
}

void writeApiError(schema::ApiError::Builder w, const ApiErrorData& e) {
  w.setDomain(e.domain);
  w.setApi(e.api);
  w.setCode(e.code);
  w.setName(e.name);
  w.setCorrelationId(e.correlationId);
  w.setTimeNs(e.timeNs);
  w.setThreadId(e.threadId);
  w.setSymbol(e.symbol.size() > kMaxTraceNameBytes ? e.symbol.substr(0, kMaxTraceNameBytes) : e.symbol);
  w.setOpIndex(e.opIndex);
}

ApiErrorData readApiError(schema::ApiError::Reader e) {
  ApiErrorData d;
  d.domain = text(e.getDomain(), 32, "API error domain");
  d.api = text(e.getApi(), 256, "API error function");
  d.code = e.getCode();
  d.name = text(e.getName(), 256, "API error name");
  d.correlationId = e.getCorrelationId();
  d.timeNs = e.getTimeNs();
  d.threadId = e.getThreadId();
  d.symbol = text(e.getSymbol(), kMaxTraceNameBytes, "API error kernel");
  d.opIndex = e.getOpIndex();
  return d;
}

std::vector<uint8_t> encodeKernelTrace(const KernelTraceData& v, size_t firstActivity, size_t firstLaunch) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<schema::KernelTrace>();
  NameTable table;
  r.setStatus(v.status);
  r.setPid(v.pid);
  auto acts = r.initActivities(static_cast<unsigned>(v.activities.size() - firstActivity));
  for (size_t i = firstActivity; i < v.activities.size(); ++i) {
    const auto& a = v.activities[i];
    auto w = acts[static_cast<unsigned>(i - firstActivity)];
    w.setKind(static_cast<schema::ActivityKind>(a.kind));
    w.setName(table.intern(a.name));
    w.setStartNs(a.startNs);
    w.setEndNs(a.endNs);
    w.setDeviceId(a.deviceId);
    w.setContextId(a.contextId);
    w.setStreamId(a.streamId);
    w.setCorrelationId(a.correlationId);
    w.setOpIndex(a.opIndex);
    writeDims(w, a.grid, a.block);
    w.setBytes(a.bytes);
    w.setReturnCode(a.returnCode);
    w.setThreadId(a.threadId);
  }
  auto launches = r.initLaunches(static_cast<unsigned>(v.launches.size() - firstLaunch));
  for (size_t i = firstLaunch; i < v.launches.size(); ++i) {
    const auto& l = v.launches[i];
    auto w = launches[static_cast<unsigned>(i - firstLaunch)];
    w.setIndex(l.index);
    w.setSymbol(table.intern(l.symbol));
    w.setApi(table.intern(l.api));
    writeDims(w, l.grid, l.block);
    w.setStream(l.stream);
    w.setCorrelationId(l.correlationId);
    w.setTimeNs(l.timeNs);
    w.setThreadId(l.threadId);
    w.setReturnCode(l.returnCode);
    w.setOpIndex(l.opIndex);
  }
  setTexts(r.initNames(static_cast<unsigned>(table.names().size())), table.names());
  if (v.firstError) writeApiError(r.initFirstError(), *v.firstError);
  r.setHasFirstError(v.firstError.has_value());
  if (v.stickyError) writeApiError(r.initStickyError(), *v.stickyError);
  r.setHasStickyError(v.stickyError.has_value());
  r.setTotalActivities(v.totalActivities);
  r.setDroppedActivities(v.droppedActivities + firstActivity);
  r.setTotalLaunches(v.totalLaunches);
  r.setClockOffsetNs(v.clockOffsetNs);
  r.setCuptiVersion(v.cuptiVersion);
  r.setTruncatedNames(v.truncatedNames + table.cut());
  return toBytes(b);
}

}  // namespace

std::vector<uint8_t> encodeMeta(const KernelTraceData& v) {
  // One meta holds at most 1 MiB, and decodes to at most kMaxDecodedTraceNameBytes of names:
  // a trace over either keeps its newest entries.
  auto decodedNameBytes = [&](size_t firstActivity, size_t firstLaunch) {
    auto size = [](const std::string& n) { return std::min<uint64_t>(n.size(), kMaxTraceNameBytes); };
    uint64_t total = 0;
    for (size_t i = firstActivity; i < v.activities.size(); ++i) total += size(v.activities[i].name);
    for (size_t i = firstLaunch; i < v.launches.size(); ++i) total += size(v.launches[i].symbol) + size(v.launches[i].api);
    return total;
  };
  size_t firstActivity = 0, firstLaunch = 0;
  for (;;) {
    if (decodedNameBytes(firstActivity, firstLaunch) <= kMaxDecodedTraceNameBytes) {
      auto bytes = encodeKernelTrace(v, firstActivity, firstLaunch);
      if (bytes.size() <= kMaxMetaBytes - 4096) return bytes;
    }
    size_t activities = v.activities.size() - firstActivity, launches = v.launches.size() - firstLaunch;
    if (activities == 0 && launches == 0)
      throw Error(ErrorCode::InvalidArgument, "a kernel trace with no entries is larger than one record allows");
    if (activities >= launches)
      firstActivity += std::max<size_t>(1, activities / 4);
    else
      firstLaunch += std::max<size_t>(1, launches / 4);
  }
}

KernelTraceData decodeKernelTrace(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::KernelTrace>(meta, limits, "kernel_trace", [&limits](auto r) {
    KernelTraceData v;
    v.status = text(r.getStatus(), 4096, "kernel trace status");
    v.pid = r.getPid();
    auto names = texts(r.getNames(), kMaxTraceNameBytes, "kernel trace name");
    // Each get of a list counts against Cap'n Proto's traversal limit (twice the message): once.
    auto activities = r.getActivities();
    auto launches = r.getLaunches();
    uint64_t decodedNameBytes = 0;
    auto name = [&](uint32_t i, const char* what) -> const std::string& {
      if (i >= names.size())
        throw Error(ErrorCode::Corrupt, fmt::format("{} points at name {} of {}", what, i, names.size()));
      decodedNameBytes += names[i].size();
      if (decodedNameBytes > limits.maxDecodedTraceNameBytes)
        throw Error(ErrorCode::LimitExceeded,
                    fmt::format("kernel trace names decode to more than {} bytes ({} activities, {} launches); "
                                "crashcap's tracers stay under {} bytes",
                                limits.maxDecodedTraceNameBytes, activities.size(), launches.size(),
                                kMaxDecodedTraceNameBytes),
                    "ReaderLimits::maxDecodedTraceNameBytes bounds it");
      return names[i];
    };
    checkCount(activities, "kernel trace activities");
    for (auto a : activities) {
      TraceActivityData d;
      auto kind = static_cast<unsigned>(a.getKind());
      if (kind > static_cast<unsigned>(TraceActivityData::Kind::Overhead))
        throw Error(ErrorCode::Corrupt, fmt::format("kernel trace activity of unknown kind {}", kind));
      d.kind = static_cast<TraceActivityData::Kind>(kind);
      d.name = name(a.getName(), "a kernel trace activity");
      d.startNs = a.getStartNs();
      d.endNs = a.getEndNs();
      d.deviceId = a.getDeviceId();
      d.contextId = a.getContextId();
      d.streamId = a.getStreamId();
      d.correlationId = a.getCorrelationId();
      d.opIndex = a.getOpIndex();
      readDims(a, d.grid, d.block);
      d.bytes = a.getBytes();
      d.returnCode = a.getReturnCode();
      d.threadId = a.getThreadId();
      v.activities.push_back(std::move(d));
    }
    checkCount(launches, "kernel trace launches");
    for (auto l : launches) {
      KernelLaunchData d;
      d.index = l.getIndex();
      d.symbol = name(l.getSymbol(), "a kernel launch");
      d.api = name(l.getApi(), "a kernel launch");
      readDims(l, d.grid, d.block);
      d.stream = l.getStream();
      d.correlationId = l.getCorrelationId();
      d.timeNs = l.getTimeNs();
      d.threadId = l.getThreadId();
      d.returnCode = l.getReturnCode();
      d.opIndex = l.getOpIndex();
      v.launches.push_back(std::move(d));
    }
    if (r.getHasFirstError()) v.firstError = readApiError(r.getFirstError());
    if (r.getHasStickyError()) v.stickyError = readApiError(r.getStickyError());
    v.totalActivities = r.getTotalActivities();
    v.droppedActivities = r.getDroppedActivities();
    v.totalLaunches = r.getTotalLaunches();
    v.clockOffsetNs = r.getClockOffsetNs();
    v.cuptiVersion = r.getCuptiVersion();
    v.truncatedNames = r.getTruncatedNames();
    return v;
  });
}

RunStatusData decodeRunStatus(const std::vector<uint8_t>& meta, const ReaderLimits& limits) {
  return decode<schema::RunStatus>(meta, limits, "run_status", [](auto r) {
    RunStatusData v;
    v.state = text(r.getState(), 64, "run state");
    v.stepsBegun = r.getStepsBegun();
    v.lastStep = r.getLastStep();
    v.droppedRecords = r.getDroppedRecords();
    v.droppedBytes = r.getDroppedBytes();
    v.warnings = texts(r.getWarnings(), 4096, "run warning");
    v.segmentsDeleted = r.getSegmentsDeleted();
    if (r.getLostSteps().size() > kMaxListedLostSteps)
      throw Error(ErrorCode::Corrupt, fmt::format("run_status lists {} lost steps: at most {}", r.getLostSteps().size(),
                                                  kMaxListedLostSteps));
    for (int64_t s : r.getLostSteps()) v.lostSteps.push_back(s);
    v.lostStepCount = r.getLostStepCount();
    v.keyframesSkipped = r.getKeyframesSkipped();
    v.lastPhase = text(r.getLastPhase(), 64, "run phase");
    v.keyframeInterval = r.getKeyframeInterval();
    v.bufferPoolPeakBytes = r.getBufferPoolPeakBytes();
    v.keyframesWrittenRaw = r.getKeyframesWrittenRaw();
    v.lastOp = text(r.getLastOp(), 256, "run last op");
    v.collectivesIssued = r.getCollectivesIssued();
    v.lastCollective = text(r.getLastCollective(), 256, "run last collective");
    v.lastCollectiveStep = r.getLastCollectiveStep();
    return v;
  });
}

template <typename T>
uint64_t writeMetaRecord(BundleWriter& writer, const T& value, const std::vector<uint8_t>& body) {
  return writer.writeRecord(static_cast<uint16_t>(recordTypeOf(value)), encodeMeta(value), body.data(), body.size(),
                            !body.empty());
}
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member) \
  template uint64_t writeMetaRecord(BundleWriter&, const Data&, const std::vector<uint8_t>&);
#include "crashcap/formats/record_types.def"

namespace {

/// Puts one decoded record into its BundleRecords member as the table's `keep` column says.
/// A First member that is already set keeps its value, and the later record is not decoded.
template <KeepPolicy keep, typename Data, typename Decode>
void keepIn(std::optional<Data>& member, Decode&& decode) {
  static_assert(keep != KeepPolicy::All, "a record kept All needs a std::vector member");
  if (keep == KeepPolicy::First && member) return;
  member = decode();
}

template <KeepPolicy keep, typename Data, typename Decode>
void keepIn(std::vector<Data>& member, Decode&& decode) {
  static_assert(keep == KeepPolicy::All, "a record kept First or Last needs a std::optional member");
  member.push_back(decode());
}

/// What the readers do with one recorder record type: the record table, as handlers.
struct RecorderHandler {
  uint16_t type;
  /// Decodes the meta and discards it: throws Error when it breaks an invariant.
  void (*validate)(const std::vector<uint8_t>& meta, const ReaderLimits& limits);
  /// Decodes the meta into its BundleRecords member.
  void (*addTo)(BundleRecords& view, const std::vector<uint8_t>& meta, const ReaderLimits& limits);
};

constexpr RecorderHandler kRecorderHandlers[] = {
#define CRASHCAP_RECORDER_RECORD(number, Enum, name, Data, decoder, keep, member)                     \
  {number,                                                                                            \
   [](const std::vector<uint8_t>& meta, const ReaderLimits& limits) { (void)decoder(meta, limits); }, \
   [](BundleRecords& view, const std::vector<uint8_t>& meta, const ReaderLimits& limits) {            \
     keepIn<KeepPolicy::keep>(view.member, [&] { return decoder(meta, limits); });                    \
   }},
#include "crashcap/formats/record_types.def"
};

const RecorderHandler* recorderHandler(uint16_t type) {
  for (const auto& h : kRecorderHandlers)
    if (h.type == type) return &h;
  return nullptr;
}

}  // namespace

bool isRecorderRecord(uint16_t type) { return recorderHandler(type) != nullptr; }

void validateRecorderMeta(uint16_t type, const uint8_t* meta, size_t size, const ReaderLimits& limits) {
  const auto* handler = recorderHandler(type);
  if (!handler) return;
  handler->validate(std::vector<uint8_t>(meta, meta + size), limits);
}

bool declaresIndexDomain(const char* name) {
  // Called for every op the recorder observes: most are "aten::<name>" whose first letter is in no
  // case below, and leave after a few character comparisons.
  if (!name || name[0] != 'a' || name[1] != 't' || name[2] != 'e' || name[3] != 'n' || name[4] != ':' || name[5] != ':')
    return false;
  const char* op = name[6] == '_' ? name + 7 : name + 6;  // aten::_embedding_bag
  switch (op[0]) {
    case 'e': if (std::strncmp(op, "embedding", 9) != 0) return false; break;
    case 'n': if (std::strncmp(op, "nll_loss", 8) != 0) return false; break;
    case 'c': if (std::strncmp(op, "cross_entropy", 13) != 0) return false; break;
    case 'g': if (std::strcmp(op, "gather") != 0) return false; break;
    case 's': if (std::strncmp(op, "scatter", 7) != 0) return false; break;
    case 't': if (std::strcmp(op, "take_along_dim") != 0) return false; break;
    default: return false;
  }
  return std::strstr(op, "backward") == nullptr;
}

std::string batchTensorName(int64_t step, const std::string& name) {
  if (step == kCrashBatchStep) return "crash/batch/" + name;
  return fmt::format("steps/{}/batch/{}", step, name);
}

std::optional<StepBeginData> otherBatchBegin(const CrashData& crash) {
  if (crash.otherLoader < 0 || crash.otherBatch.empty()) return std::nullopt;
  StepBeginData begin;
  begin.step = kCrashBatchStep;
  begin.previousStep = -2;
  begin.batch = crash.otherBatch;
  begin.structure = crash.otherStructure;
  begin.rowDims = crash.otherRowDims;
  return begin;
}

std::string rngTensorName(int64_t step, const std::string& device) {
  return fmt::format("steps/{}/rng/{}", step, device);
}

std::string keyframeTensorName(int64_t step, const std::string& part, const std::string& name) {
  return fmt::format("keyframes/{}/{}/{}", step, part, name);
}

BundleRecords readRecords(const BundleReader& reader) {
  BundleRecords view;
  for (const auto& r : reader.records()) {
    const auto* handler = recorderHandler(r.type);
    if (!handler) continue;  // tensors, notes, ... and types a newer crashcap wrote
    try {
      handler->addTo(view, reader.readRecord(r.offset).meta, reader.limits());
    } catch (const Error& e) {
      view.problems.push_back(fmt::format("{} record #{} at byte {}: {}", recordTypeName(r.type), r.sequence,
                                          r.offset, e.message()));
    }
  }
  return view;
}

std::vector<int64_t> lostSteps(const BundleRecords& records) {
  std::set<int64_t> begun, lost;
  for (const auto& b : records.stepBegins) begun.insert(b.step);
  // Steps before the earliest retained keyframe were deleted by the retention budget, not lost.
  int64_t window = INT64_MAX;
  for (const auto& k : records.keyframes) window = std::min(window, k.step);
  for (const auto& b : records.stepBegins)
    if (b.previousStep >= 0 && b.previousStep >= window && !begun.count(b.previousStep)) lost.insert(b.previousStep);
  for (const auto& k : records.keyframes)
    if (!begun.count(k.step)) lost.insert(k.step);
  // The step the process was in when it crashed or stopped began, whether or not its records
  // reached the file.
  auto begunOnce = [&](int64_t step) {
    if (step >= 0 && step >= window && window != INT64_MAX && !begun.count(step)) lost.insert(step);
  };
  if (records.crash) begunOnce(records.crash->step);
  if (records.status)
    for (int64_t s : records.status->lostSteps) lost.insert(s);
  if (records.status && records.status->stepsBegun > 0) begunOnce(records.status->lastStep);
  // A process that died (SIGKILL) in step S, whose records stop at step L < S - 1, had the steps
  // between them in its writer's queue. Which of them began is known in two cases. S + 1 steps
  // begun are exactly 0..S (step_numbers.hpp): every one of them in the window that the bundle
  // lacks is lost. Otherwise, when the recorded steps go one by one
  // (every step_begin names the step one before it, or none: the recorder's first) and the
  // count begun has room for the gap, L + 1..S - 1 began. Steps that skip numbers leave the gap
  // unnamed: nothing says which began. A damaged run status cannot make the list unbounded: at
  // most kMaxNamedQueuedSteps are named.
  constexpr size_t kMaxNamedQueuedSteps = size_t(1) << 16;
  const size_t bound = lost.size() + kMaxNamedQueuedSteps;
  if (records.status && records.status->stepsBegun > 0 && window != INT64_MAX) {
    const int64_t died = records.status->lastStep;
    const uint64_t count = records.status->stepsBegun;
    if (begunStepsAreAllUpTo(count, died)) {
      for (int64_t s = window; s <= died && lost.size() < bound; ++s) {
        if (!begun.count(s)) lost.insert(s);
        if (s == died) break;  // died may be INT64_MAX in a damaged status
      }
    } else if (!records.stepBegins.empty()) {
      const int64_t last = records.stepBegins.back().step;
      bool oneByOne = true;
      for (const auto& b : records.stepBegins)  // -1: the recorder's first step
        oneByOne &= b.previousStep == b.step - 1 || b.previousStep == -1;
      if (oneByOne && died > last + 1 && count >= records.stepBegins.size() &&
          count - records.stepBegins.size() >= static_cast<uint64_t>(died - last))
        for (int64_t s = last + 1; s < died && lost.size() < bound; ++s) lost.insert(s);
    }
  }
  return {lost.begin(), lost.end()};
}

std::optional<int64_t> killedInStep(const BundleRecords& records) {
  if (records.crash || !records.status || records.status->state != "interrupted" || records.status->stepsBegun == 0 ||
      records.status->lastStep < 0)
    return std::nullopt;
  return records.status->lastStep;
}

bool phaseInStep(const std::string& phase) {
  return phase != "setup" && phase != "between-steps" && phase != "loading";
}

const char* stepPreposition(const std::string& phase) { return phaseInStep(phase) ? "at" : "after"; }

std::optional<int64_t> failedInStep(const BundleRecords& records) {
  if (records.crash) {
    if (records.crash->step < 0 || !phaseInStep(records.crash->phase)) return std::nullopt;
    return records.crash->step;
  }
  const auto killed = killedInStep(records);
  if (!killed || !phaseInStep(records.status->lastPhase)) return std::nullopt;
  return killed;
}

bool rowDimensionInDoubt(const std::vector<int64_t>& shape, int64_t rows) {
  return rows >= 0 && shape.size() > 1 && shape[0] == rows && shape[1] == rows;
}

std::vector<int8_t> rowDimensions(const std::vector<std::vector<int64_t>>& shapes, int64_t rows,
                                  const std::vector<int8_t>& before) {
  std::vector<int8_t> dims(shapes.size(), -1);
  if (rows < 0) {
    for (const auto& shape : shapes)
      if (!shape.empty()) {
        rows = shape[0];
        break;
      }
    for (size_t i = 0; i < shapes.size(); ++i)
      if (!shapes[i].empty() && shapes[i][0] == rows) dims[i] = 0;
    return dims;
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (rowDimensionInDoubt(shapes[i], rows) && i < before.size() && before[i] == 1)
      dims[i] = 1;
    else if (!shapes[i].empty() && shapes[i][0] == rows)
      dims[i] = 0;
    else if (shapes[i].size() > 1 && shapes[i][0] > 1 && shapes[i][1] == rows)
      dims[i] = 1;
  }
  return dims;
}

BatchRows batchRows(const StepBeginData& begin, const std::vector<std::vector<int64_t>>& shapes) {
  BatchRows out;
  std::vector<int8_t> dims = begin.rowDims.size() == shapes.size() ? begin.rowDims : rowDimensions(shapes, -1);
  out.dims.assign(shapes.size(), -1);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int d = dims[i];
    if (d < 0 || d >= static_cast<int>(shapes[i].size())) continue;
    if (out.count == 0) out.count = shapes[i][d];
    if (shapes[i][d] == out.count) out.dims[i] = d;
  }
  return out;
}

BatchRows batchRows(const StepBeginData& begin, const BundleReader& reader) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& name : begin.batch) {
    const auto* t = reader.find(name);
    shapes.push_back(t ? t->shape : std::vector<int64_t>{});
  }
  return batchRows(begin, shapes);
}

}  // namespace crashcap::formats
