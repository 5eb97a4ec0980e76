#include "crashcap/investigate/pack.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/ragged_batch.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/inspect/summary.hpp"
#include "crashcap/investigate/bisect.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/investigate/report.hpp"
#include "crashcap/replayer/batch_cut.hpp"
#include "crashcap/supervisor/job_archive.hpp"
#include "zip_writer.hpp"

namespace crashcap::investigate {

namespace fs = std::filesystem;
using formats::RecordType;

namespace {

/// The number after `prefix` in "steps/12/batch/image" ("steps/"), "keyframes/40/..." ("keyframes/").
std::optional<int64_t> stepOf(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  int64_t step = 0;
  auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end == first || (end != last && *end != '/')) return std::nullopt;
  return step;
}

/// Working files pack writes beside its output, removed however pack ends.
struct RemoveOnExit {
  std::vector<std::string> paths;
  ~RemoveOnExit() {
    std::error_code ec;
    for (const auto& p : paths) fs::remove(p, ec);
  }
};

std::string stepsText(int64_t first, int64_t last) {
  return first == last ? fmt::format("step {}", first) : fmt::format("steps {}..{}", first, last);
}

/// The first `shown` values, then how many there are in all when some are left out (unless `count`
/// is false: the caller says it).
std::string listText(const std::vector<int64_t>& values, size_t shown, bool count = true) {
  std::string s;
  for (size_t i = 0; i < values.size() && i < shown; ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  if (values.size() > shown) s += count ? fmt::format(", ... ({} in all)", values.size()) : std::string(", ...");
  return s;
}

}  // namespace

PackReport packBundle(const std::string& in, const PackOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  PackReport rep;
  rep.in = in;
  rep.out = o.out;
  if (o.out.empty())
    throw Error(ErrorCode::InvalidArgument, "pack needs an output path", "give one with -o OUT.ccap");
  std::error_code ec;
  if (!fs::exists(in, ec)) throw Error(ErrorCode::NotFound, fmt::format("no such file: {}", in));
  struct stat a {}, b {};
  if (::stat(in.c_str(), &a) == 0 && ::stat(o.out.c_str(), &b) == 0) {
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{} and {} are the same file", in, o.out),
                  "pack never modifies the bundle it packs; give another output path");
    if (!o.force)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", o.out),
                  "choose another output path, or pass --force to replace it");
  }
  rep.originalBytes = fs::file_size(in, ec);
  // A list of rows is checked before anything runs; whether they are in the batch, once it is known.
  if (o.rows != "all" && o.rows != "culprit" && o.rows.empty())
    throw Error(ErrorCode::InvalidArgument, "--rows needs all, culprit or a list of rows (3,5)");
  std::set<int64_t> chosen;
  if (o.rows != "all" && o.rows != "culprit")
    for (size_t pos = 0; pos <= o.rows.size();) {
      size_t comma = o.rows.find(',', pos);
      if (comma == std::string::npos) comma = o.rows.size();
      const std::string item = o.rows.substr(pos, comma - pos);
      int64_t row = -1;
      auto [end, err] = std::from_chars(item.data(), item.data() + item.size(), row);
      if (item.empty() || err != std::errc() || end != item.data() + item.size() || row < 0)
        throw Error(ErrorCode::InvalidArgument, fmt::format("--rows: '{}' is not a row number", item),
                    "give all, culprit, or rows like 3,5");
      chosen.insert(row);
      pos = comma + 1;
    }

  auto reader = formats::BundleReader::open(in, o.limits);
  if (!reader->report().complete())
    rep.warnings.push_back(fmt::format("{} is damaged ({}): packed from what is intact", in, reader->report().summary()));
  if (supervisor::isJobArchive(*reader))
    throw Error(ErrorCode::Unsupported,
                fmt::format("{} is a job archive (crashcap merge): every rank's bundle of a job, the attachment already; "
                            "packing a job smaller is not built yet",
                            in),
                "attach it as it is; crashcap replay " + in + " replays its ranks");
  const auto view = formats::readRecords(*reader);
  if (view.distributed && view.distributed->worldSize > 1)
    // A rank replays only with every rank of its job: one rank's attachment would not replay.
    throw Error(ErrorCode::Unsupported,
                fmt::format("{} is rank {} of a {}-rank job, which replays only with every rank's bundle: one rank "
                            "packed alone would not replay, and packing a job smaller is not built yet",
                            in, view.distributed->rank, view.distributed->worldSize),
                "attach the whole job in one file: crashcap merge DIR -o JOB.ccap (DIR: where its ranks' bundles are)");

  // The step that failed: the crash's, else where a killed process was (its run status), else the last recorded.
  std::map<int64_t, const formats::StepBeginData*> begun;
  for (const auto& s : view.stepBegins) begun[s.step] = &s;
  if (view.crash && view.crash->step >= 0)
    rep.crashStep = view.crash->step;
  else if (auto killed = formats::killedInStep(view))
    rep.crashStep = *killed;
  else if (!begun.empty())
    rep.crashStep = begun.rbegin()->first;
  if (!view.crash && !view.supervision)
    rep.warnings.push_back("the bundle has no crash record: packed around its last step");

  // The newest recorded step at or before it (a killed process's last step may not have reached the disk).
  int64_t target = -1;
  if (auto it = begun.upper_bound(rep.crashStep); it != begun.begin() && rep.crashStep >= 0) target = std::prev(it)->first;
  if (target >= 0 && target != rep.crashStep)
    rep.warnings.push_back(fmt::format("step {}'s batch is not in the bundle: packed up to step {}, the newest recorded",
                                       rep.crashStep, target));

  auto stepWhole = [&](int64_t step) {
    auto it = begun.find(step);
    if (it == begun.end()) return false;
    for (const auto& n : it->second->batch)
      if (!reader->find(n)) return false;
    for (const auto& n : it->second->rng)
      if (!reader->find(n)) return false;
    return true;
  };
  auto keyframeWhole = [&](const formats::KeyframeData& k) {
    for (const auto* names : {&k.parameters, &k.buffers, &k.optimizerState, &k.documents})
      for (const auto& n : *names)
        if (!reader->find(n)) return false;
    return true;
  };
  // The newest keyframe at or before the target from which every step up to it is whole.
  std::vector<const formats::KeyframeData*> keyframes;
  for (const auto& k : view.keyframes)
    if (k.step <= target) keyframes.push_back(&k);
  std::sort(keyframes.begin(), keyframes.end(), [](auto* x, auto* y) { return x->step > y->step; });
  for (const auto* k : keyframes) {
    if (!keyframeWhole(*k)) continue;
    bool whole = true;
    for (int64_t s = k->step; s <= target && whole; ++s) whole = stepWhole(s);
    if (whole) {
      rep.keyframeStep = k->step;
      break;
    }
  }
  // The crash step's batch: which of its tensors hold rows, and in which dimension (the recorded
  // one: a sequence-first tensor's samples are its dimension 1). Rows asked for are checked
  // against it before anything runs.
  std::map<std::string, int> rowTensors;
  if (target >= 0) {
    const auto& begin = *begun.at(target);
    const auto rows = formats::batchRows(begin, *reader);
    rep.batchSize = rows.count;
    for (size_t i = 0; i < begin.batch.size(); ++i)
      if (rows.dims[i] >= 0) rowTensors.emplace(begin.batch[i], rows.dims[i]);
  }
  if (o.rows != "all" && rep.batchSize == 0)
    throw Error(ErrorCode::InvalidArgument,
                target < 0 ? std::string("--rows: the bundle records no step whose rows could be chosen")
                           : fmt::format("--rows: step {}'s batch has no rows to choose (no tensor holds its samples)", target));
  for (int64_t row : chosen)
    if (row >= rep.batchSize)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("--rows: row {} is outside step {}'s batch (rows 0..{})", row, target, rep.batchSize - 1));
  // Every row (distinct, each within the batch): the batch as recorded, not a cut of it.
  const bool everyRow = rep.batchSize > 0 && static_cast<int64_t>(chosen.size()) == rep.batchSize;
  // A ragged batch whose spans no lengths or offsets tell cannot be cut: said before anything runs.
  auto cutOf = [&](const std::vector<int64_t>& keep) {
    return replayer::cutBatch(*reader, view, *begun.at(target), keep,
                              "a pack that keeps some rows would keep all of its values and hold another batch",
                              "pack the whole batch (--rows all)");
  };
  bool ragged = false;  // the crash step's batch holds its samples concatenated (formats::raggedSpans)
  if (o.rows != "all" && !everyRow) {
    try {
      cutOf(chosen.empty() ? std::vector<int64_t>{0} : std::vector<int64_t>(chosen.begin(), chosen.end()));
    } catch (const Error& e) {
      Error refused(e.code(), "--rows: " + e.message(), e.hint());
      for (auto frame = e.context().rbegin(); frame != e.context().rend(); ++frame) refused.with(*frame);
      throw refused;
    }
    // A list of each row's own tensors changes sizes from step to step too, and is cut by its items.
    const auto& begin = *begun.at(target);
    const auto own = replayer::rowOwnTensorNames(
        replayer::rowOwnLists(begin, *reader, formats::batchRows(begin, *reader)), target);
    const auto concatenated = formats::concatenatedBatchTensors(view.stepBegins, target, *reader);
    ragged = std::any_of(concatenated.begin(), concatenated.end(),
                         [&](const formats::ConcatenatedTensor& c) { return !own.count(c.name); });
  }

  // Replay the crash from that keyframe: does the attachment reproduce, and, when every step up
  // to the crash replays bit for bit, the state the crash step starts from, as a keyframe.
  std::unique_ptr<formats::BundleReader> materialised;
  std::optional<formats::KeyframeData> materialisedRecord;
  if (o.replay && rep.keyframeStep >= 0) {
    replayer::ReplayOptions ro;
    ro.step = target;
    ro.allowChangedSources = changedSourcesAllowed();
    const std::string keyframeOut = fs::absolute(o.out).string() + ".keyframe";
    // With its partial file: a replay that died while writing it.
    RemoveOnExit removeLater{{keyframeOut, keyframeOut + ".partial"}};
    if (rep.keyframeStep < target) ro.keyframeOut = keyframeOut;
    try {
      rep.replay = investigate::replay(in, ro);
    } catch (const ProgramKilled& e) {
      rep.replayFailed = e.what();
    } catch (const Error& e) {
      rep.replayFailed = e.message();
    } catch (const std::exception& e) {
      rep.replayFailed = e.what();  // a LibTorch error loading the program, memory: the fallback still packs
    }
    if (rep.replay) {
      const auto& r = *rep.replay;
      if (view.crash && replayer::loadNotRepeated(r, view.crash->phase))
        rep.warnings.push_back(fmt::format(
            "the crash came while the DataLoader loaded the batch after step {}, which a replay cannot load again "
            "(crashcap replay says why): packed anyway; the attachment replays the steps before it, and the crash's "
            "error text and stack are what it holds of the failure",
            r.step));
      else if (!replayer::showsFailure(r))
        rep.warnings.push_back(fmt::format(
            "the crash does not reproduce from this bundle here (replay verdict {}{}): packed anyway; the attachment "
            "replays no better than the bundle",
            replayer::verdictName(r.verdict),
            !r.error.empty()                                         ? ", " + lastLine(r.error)
            : r.verdict != replayer::Verdict::RecordingIncomplete ? fmt::format(", step {} runs clean", r.step)
                                                                    : ""));
      // The keyframe was written before the target step ran; the target's own fingerprint, when
      // recorded, checks the last update before it too.
      std::string notUsed = r.keyframeNotWritten;
      for (const auto& s : r.steps)
        if (s.step == target && s.recorded && !s.bitwise && r.keyframeWritten)
          notUsed = fmt::format("step {} itself did not replay bit for bit, so the state it started from is unproven", target);
      if (r.keyframeWritten && notUsed.empty()) {
        materialised = formats::BundleReader::open(keyframeOut, o.limits);
        auto view = formats::readRecords(*materialised);
        if (view.keyframes.size() == 1 && view.keyframes[0].step == target) materialisedRecord = view.keyframes[0];
      } else if (!ro.keyframeOut.empty()) {
        if (notUsed.empty()) notUsed = fmt::format("the replay did not reach step {}", target);
        rep.warnings.push_back(fmt::format("no keyframe at step {}: {}; packed from the keyframe at step {} with every "
                                           "step after it",
                                           target, notUsed, rep.keyframeStep));
      }
    } else {
      rep.warnings.push_back(fmt::format("the crash could not be replayed here ({}): packed from the keyframe at step "
                                         "{} with every step after it, unchecked",
                                         lastLine(rep.replayFailed), rep.keyframeStep));
    }
    if (materialisedRecord) rep.keyframeStep = target;
  }

  std::set<int64_t> keptSteps;
  if (rep.keyframeStep >= 0) {
    for (int64_t s = rep.keyframeStep; s <= target; ++s) keptSteps.insert(s);
  } else {
    if (target >= 0) keptSteps.insert(target);
    rep.warnings.push_back(
        target < 0 ? std::string("the bundle records no step: the packed bundle holds the crash and the environment, and "
                                 "cannot replay")
                   : fmt::format("no keyframe at or before step {} with every step after it in the bundle: the packed "
                                 "bundle keeps that step's batch as evidence, but cannot replay it",
                                 target));
  }
  if (!keptSteps.empty()) {
    rep.firstStep = *keptSteps.begin();
    rep.lastStep = *keptSteps.rbegin();
    rep.steps = keptSteps.size();
  }
  rep.keyframesLeftOut = view.keyframes.size();
  for (const auto& [step, s] : begun)
    if (!keptSteps.count(step)) ++rep.stepsLeftOut;

  // The recorded keyframe kept: none when the replay materialised one at the target.
  const int64_t recordedKeyframe = materialisedRecord ? -1 : rep.keyframeStep;
  for (const auto& k : view.keyframes)
    if (k.step == recordedKeyframe) --rep.keyframesLeftOut;
  bool cutRows = false;  // the rows of rep.rows replace the crash step's batch
  // Which sample each row of the crash step's batch holds, when a collate function of the
  // program's reordered them (replayer::RowOrder, from bisect samples' whole-batch replay).
  std::optional<std::vector<int64_t>> rowDatasetIndices;
  replayer::BatchCut cut;  // then, its tensors cut to them (replayer::cutBatch)
  std::set<std::string> cutAway;  // the crash step's tensors the cut batch does not hold (rows' own)
  std::optional<formats::StepBeginData> cutBegin;  // and its record, when its names or per-row lists are cut too
  auto keepTensor = [&](const formats::TensorInfo& t) {
    if (cutRows && (cut.tensors.count(t.name) || cutAway.count(t.name))) return false;
    if (auto s = stepOf(t.name, "steps/")) return keptSteps.count(*s) > 0;
    if (auto s = stepOf(t.name, "keyframes/")) return *s == recordedKeyframe;
    return true;
  };
  auto keepRecord = [&](const formats::RecordEntry& r) {
    const auto type = static_cast<RecordType>(r.type);
    if (type != RecordType::StepBegin && type != RecordType::StepEnd && type != RecordType::Keyframe) return true;
    auto raw = reader->readRecord(r.offset);
    if (type == RecordType::StepBegin) {
      const int64_t step = formats::decodeStepBegin(raw.meta, o.limits).step;
      return keptSteps.count(step) > 0 && !(cutBegin && step == target);
    }
    if (type == RecordType::StepEnd) {
      // The recorded fingerprint of a cut batch is the whole batch's: it goes with the rows.
      const int64_t step = formats::decodeStepEnd(raw.meta, o.limits).step;
      return keptSteps.count(step) > 0 && !(cutRows && step == target);
    }
    return formats::decodeKeyframe(raw.meta, o.limits).step == recordedKeyframe;
  };

  // Writes the pack to `path`: the kept records as stored, the crash step's rows when cut, the
  // materialised keyframe, and the note (when given). Returns its size.
  formats::CopyReport copied;
  auto write = [&](const std::string& path, const std::string& note) {
    formats::WriterOptions wo;
    wo.overwrite = true;
    wo.producer = "crashcap pack";
    auto writer = formats::BundleWriter::createCopy(path, reader->fileHeader(), wo);
    copied = formats::copyRecords(*reader, *writer, keepRecord, true, keepTensor);
    if (cutRows)
      for (const auto& [n, t] : cut.tensors) formats::torch::writeTensor(*writer, n, t);
    if (cutBegin) formats::writeMetaRecord(*writer, *cutBegin);
    if (materialisedRecord) {
      for (const auto& t : materialised->tensors()) {
        auto bytes = materialised->readTensor(t);
        writer->writeTensor(t.name, t.dtype, t.shape, bytes.data(), bytes.size());
      }
      formats::writeMetaRecord(*writer, *materialisedRecord);
    }
    if (!note.empty()) writer->writeNote("crashcap.pack", note);
    writer->seal();
    return writer->stats().fileBytes;
  };

  // The rows to keep.
  if (o.rows != "all") {
    if (o.rows == "culprit") {
      // bisect samples on a pack of all rows: its replays start at the crash step's keyframe.
      const std::string stage = fs::absolute(o.out).string() + ".rows-search.ccap";
      RemoveOnExit removeLater{{stage}};
      write(stage, "");
      ExperimentOptions eo;
      eo.timeoutSeconds = o.experimentTimeoutSeconds;
      eo.progress = o.progress;
      eo.allowChangedSources = changedSourcesAllowed();
      ExperimentRunner runner(eo);
      // A ragged batch is told by its tensors' sizes at other steps, which the one-step stage
      // lacks: its experiments would cut its row tensors beside every concatenated sample. Such
      // a batch is bisected in the bundle as given.
      auto b = bisectSamples(ragged ? in : stage, target, runner);
      rep.rowReplays = b.replays;
      if (b.rowOrder && (b.rowOrder->order == "reordered" || b.rowOrder->order == "partial"))
        rowDatasetIndices = b.rowOrder->datasetIndices;
      if (b.reproduced && !b.rows.empty() && static_cast<int64_t>(b.rows.size()) < rep.batchSize &&
          b.filledBecause.empty()) {
        rep.rows = b.rows;
      } else {
        rep.warnings.push_back(
            !b.filledBecause.empty()
                ? fmt::format("--rows culprit: step {} cannot run on fewer rows ({}); its culprit rows [{}] were found "
                              "in batches of the whole size: all kept",
                              target, b.filledBecause, fmt::join(b.culprits(), ","))
            : !b.cutsFail.empty()
                ? fmt::format("--rows culprit: step {} cannot run on part of its batch (every part tried fails another "
                              "way: {}): all kept",
                              target, b.cutsFail)
            : b.reproduced ? fmt::format("--rows culprit: the failure needs every row of step {}'s batch: all kept", target)
                         : fmt::format("--rows culprit: the crash does not reproduce from step {}'s batch, so no rows can "
                                       "be blamed: all kept",
                                       target));
      }
    } else {
      if (static_cast<int64_t>(chosen.size()) < rep.batchSize) rep.rows.assign(chosen.begin(), chosen.end());
    }
    cutRows = !rep.rows.empty();
    if (cutRows) {
      cut = cutOf(rep.rows);
      if (rowDatasetIndices && std::any_of(rep.rows.begin(), rep.rows.end(), [&](int64_t r) {
            return rowDatasetIndices->at(static_cast<size_t>(r)) < 0;  // a row the match left open
          })) {
        rowDatasetIndices.reset();
        rep.warnings.push_back(
            "the collate function reordered the samples of the kept rows' batch, and a kept row matches several "
            "of them: its index tensor keeps the sampler's order, which may not name the kept rows' own samples");
      }
      // The index tensor holds the sampler's order; the pack's rows are named by the samples they
      // hold, in their order, so that the pack's own replay finds each at its place.
      const auto indexName = formats::batchTensorName(target, formats::kDatasetIndexName);
      if (rowDatasetIndices && cut.tensors.count(indexName) && cut.tensors[indexName].dim() == 1 &&
          cut.tensors[indexName].scalar_type() == at::kLong) {
        std::vector<int64_t> own;
        for (int64_t r : rep.rows) own.push_back(rowDatasetIndices->at(static_cast<size_t>(r)));
        cut.tensors[indexName] = at::tensor(own, at::kLong);
      }
      // A Python batch's lists of one value per row (lengths, file names) go with the rows, and
      // its lists of each row's own tensors keep the kept rows' items, under new names.
      const auto& begin = *begun.at(target);
      if (cut.structure != begin.structure || cut.batch != begin.batch) {
        cutBegin = begin;
        cutBegin->structure = cut.structure;
        cutBegin->batch = cut.batch;
        cutBegin->rowDims = cut.rowDims;
        const std::set<std::string> held(cut.batch.begin(), cut.batch.end());
        for (const auto& n : begin.batch)
          if (!held.count(n)) cutAway.insert(n);
      }
      // A PackedSequence's tensors were packed anew: whatever row dimension their recorded sizes
      // happened to give them (batch_sizes as long as the batch), the cut ones have none, and the
      // pack's batch counts its rows by the tensors that have them.
      if (const auto packed = replayer::packedSequences(begin.structure);
          !packed.empty() && begin.rowDims.size() == begin.batch.size()) {
        if (!cutBegin) cutBegin = begin;
        const auto packedNames = replayer::packedTensorNames(packed, target);
        for (size_t i = 0; i < cutBegin->batch.size(); ++i)
          if (packedNames.count(cutBegin->batch[i])) cutBegin->rowDims[i] = -1;
      }
    }
  }

  // What the attachment holds, in words.
  for (int64_t step : keptSteps) {
    const auto* s = begun.at(step);
    const auto batchRows = formats::batchRows(*s, *reader);
    const uint64_t rows = batchRows.count > 0 ? static_cast<uint64_t>(batchRows.count) : s->batch.empty() ? 0 : 1;
    for (const auto& n : s->batch) {
      const auto* t = reader->find(n);
      if (!t) continue;
      if (n == formats::batchTensorName(step, "index") && t->dtype == formats::DType::Int64 &&
          t->totalBytes <= reader->limits().maxTensorBytes) {
        auto bytes = reader->readTensor(*t);
        std::vector<int64_t> indices(bytes.size() / sizeof(int64_t));
        std::memcpy(indices.data(), bytes.data(), indices.size() * sizeof(int64_t));
        if (cutRows && step == target && rowTensors.count(n)) {
          std::vector<int64_t> kept;
          for (int64_t r : rep.rows)
            kept.push_back((rowDatasetIndices ? *rowDatasetIndices : indices).at(static_cast<size_t>(r)));
          indices = kept;
        }
        rep.datasetIndices.emplace_back(step, std::move(indices));
      }
    }
    rep.samples += cutRows && step == target ? rep.rows.size() : rows;
  }
  if (view.program)
    for (const auto& f : view.program->sources)
      if (!f.tensor.empty() && reader->find(f.tensor)) rep.sources.push_back(f.path);
  uint64_t keyframeBytes = 0;
  if (materialised)
    for (const auto& t : materialised->tensors()) {
      keyframeBytes += t.storedBytes;
      if (t.name.find("/documents/") == std::string::npos) ++rep.weightTensors;
    }
  for (const auto& t : reader->tensors())
    if (keepTensor(t) && stepOf(t.name, "keyframes/") && t.name.find("/documents/") == std::string::npos) {
      keyframeBytes += t.storedBytes;
      ++rep.weightTensors;
    }

  if (rep.steps) {
    std::string line;
    if (cutRows && rep.steps == 1) {
      line = fmt::format("{} training sample{}: row{} {} of the {} of step {}'s batch", rep.rows.size(),
                         rep.rows.size() == 1 ? "" : "s", rep.rows.size() == 1 ? "" : "s", listText(rep.rows, 12),
                         rep.batchSize, target);
    } else {
      line = fmt::format("{} training sample{}: the batch{} of {}", rep.samples, rep.samples == 1 ? "" : "s",
                         rep.steps == 1 ? "" : "es", stepsText(rep.firstStep, rep.lastStep));
      if (cutRows) line += fmt::format(" (of step {}'s, rows {} only)", target, listText(rep.rows, 12));
    }
    if (!rep.datasetIndices.empty()) {
      std::set<int64_t> distinct;
      size_t drawn = 0;
      bool repeatedInABatch = false;
      for (const auto& [step, indices] : rep.datasetIndices) {
        distinct.insert(indices.begin(), indices.end());
        drawn += indices.size();
        repeatedInABatch = repeatedInABatch || std::set<int64_t>(indices.begin(), indices.end()).size() < indices.size();
      }
      const std::vector<int64_t> values(distinct.begin(), distinct.end());
      // A sampler that draws with replacement repeats an index within a batch: the samples
      // outnumber the indices. (Across batches, a new epoch repeats them all.)
      if (repeatedInABatch)
        line += fmt::format(", dataset ind{} {} ({} distinct among the {} drawn: the sampler drew some more than once)",
                            distinct.size() == 1 ? "ex" : "ices", listText(values, 12, false), distinct.size(), drawn);
      else
        line += fmt::format(", dataset ind{} {}", distinct.size() == 1 ? "ex" : "ices", listText(values, 12));
    }
    rep.contents.push_back(line);
  } else {
    rep.contents.push_back("no training samples");
  }
  if (rep.keyframeStep >= 0)
    rep.contents.push_back(fmt::format("the model's weights, buffers and optimizer state at step {}: {} tensors ({})",
                                       rep.keyframeStep, rep.weightTensors, inspect::formatBytes(keyframeBytes)));
  else
    rep.contents.push_back("no weights");
  if (!rep.sources.empty())
    rep.contents.push_back(fmt::format("the program's source files: {}", [&] {
      std::string s;
      for (size_t i = 0; i < rep.sources.size() && i < 8; ++i) s += (i ? ", " : "") + rep.sources[i];
      if (rep.sources.size() > 8) s += fmt::format(", ... ({} in all)", rep.sources.size());
      return s;
    }()));
  if (view.program && view.program->format == "torchscript")
    rep.contents.push_back("the step program (TorchScript: the model's code and the loss)");
  if (reader->environment())
    rep.contents.push_back("the environment: host name, command line (secret values withheld), library versions, "
                           "the environment variables crashcap keeps");
  if (view.crash || view.supervision)
    rep.contents.push_back(
        fmt::format("the crash: its error text and stack{}{}", view.opTrace ? ", the last ops (names and input shapes, no values)" : "",
                    view.supervision ? ", the tails of the run's output" : ""));
  rep.contents.push_back("no other data");

  std::string note = fmt::format("packed from {} ({}): ", fs::path(in).filename().string(),
                                 inspect::formatBytes(rep.originalBytes));
  note += rep.keyframeStep >= 0 ? fmt::format("keyframe {}{}, {}", rep.keyframeStep,
                                              materialisedRecord ? " (materialised by a bit-for-bit replay)" : "",
                                              stepsText(rep.firstStep, rep.lastStep))
                                : std::string("no keyframe");
  note += fmt::format("; left out {} keyframe(s) and {} step(s)", rep.keyframesLeftOut, rep.stepsLeftOut);
  if (cutRows)
    note += fmt::format("; of step {}'s batch of {}, rows {} only{}", target, rep.batchSize, listText(rep.rows, 32),
                        o.rows == "culprit" ? " (the smallest set of rows that still fails, from bisect samples)" : "");
  if (rep.replay)
    note += fmt::format("\nreplayed before packing: {}{}", replayer::verdictName(rep.replay->verdict),
                        rep.replay->error.empty() ? "" : " (" + lastLine(rep.replay->error) + ")");
  for (const auto& c : rep.contents) note += "\nholds: " + c;
  for (const auto& w : rep.warnings) note += "\nwarning: " + w;
  // The copy's losses are known only after it; the note is written last, so a first pass finds them.
  formats::PartialOutput output(o.out);
  // With zip, the bundle goes into the zip from a working file beside it.
  const std::string bundlePath = o.zip ? fs::absolute(o.out).string() + ".ccap.partial" : output.path();
  RemoveOnExit removeBundle{o.zip ? std::vector<std::string>{bundlePath} : std::vector<std::string>{}};
  uint64_t bytes = write(bundlePath, note);
  if (!copied.lines.empty()) {
    for (const auto& l : copied.lines) note += "\n" + l;
    if (note.size() > formats::kMaxNoteTextBytes) note.resize(formats::kMaxNoteTextBytes - 16);
    bytes = write(bundlePath, note);
  }
  rep.bundleBytes = bytes;

  // What is largest, measured on the written file.
  {
    auto packed = formats::BundleReader::open(bundlePath, o.limits);
    uint64_t batchBytes = 0, rngBytes = 0, kfBytes = 0, otherBytes = 0, heldBytes = 0;
    const std::string held = formats::batchTensorName(formats::kCrashBatchStep, "");
    for (const auto& t : packed->tensors()) {
      if (t.name.rfind(held, 0) == 0)
        heldBytes += t.storedBytes;
      else if (stepOf(t.name, "steps/"))
        (t.name.find("/rng/") != std::string::npos ? rngBytes : batchBytes) += t.storedBytes;
      else if (stepOf(t.name, "keyframes/"))
        kfBytes += t.storedBytes;
      else {
        otherBytes += t.storedBytes;
        ++rep.otherTensors;
      }
    }
    if (kfBytes) rep.parts.push_back({fmt::format("the keyframe at step {}", rep.keyframeStep), kfBytes});
    if (batchBytes)
      rep.parts.push_back({fmt::format("the batch{} of {}{}", rep.steps == 1 ? "" : "es", stepsText(rep.firstStep, rep.lastStep),
                                       cutRows ? fmt::format(" ({} of step {}'s rows)", rep.rows.size(), target) : ""),
                           batchBytes});
    if (rngBytes) rep.parts.push_back({"the generator states", rngBytes});
    if (otherBytes) rep.parts.push_back({"the step program and source files", otherBytes});
    if (heldBytes) rep.parts.push_back({"the batch another DataLoader gave before the crash (crash/batch/)", heldBytes});
    std::sort(rep.parts.begin(), rep.parts.end(), [](const PackPart& x, const PackPart& y) { return x.bytes > y.bytes; });
  }
  if (o.zip) {
    fs::path name = fs::path(o.out).filename();
    const std::string bundleName = name.replace_extension(".ccap").string();
    std::vector<ZipEntry> entries;
    entries.push_back({bundleName, bundlePath, "", false});
    // The report describes the attachment: its own replay, not the original's (when it can replay).
    if (o.replay && rep.keyframeStep >= 0) {
      replayer::ReplayOptions ro;
      ro.allowChangedSources = changedSourcesAllowed();
      try {
        rep.packedReplay = investigate::replay(bundlePath, ro);
      } catch (const std::exception& e) {
        rep.warnings.push_back(fmt::format("the packed bundle could not be replayed for its report: {}", lastLine(e.what())));
      }
    }
    const replayer::ReplayResult* packedReplay = rep.packedReplay ? &*rep.packedReplay : nullptr;
    std::string why;
    const bool html = htmlReportAvailable(&why);
    if (!html) rep.warnings.push_back("the zip holds no report.html: " + why);
    entries.push_back({"report.md", "", markdownReport(bundlePath, std::nullopt, packedReplay, bundleName, html ? "report.html" : ""),
                       true});
    if (html) entries.push_back({"report.html", "", htmlReport(bundlePath, std::nullopt, packedReplay, bundleName), true});
    for (const auto& e : entries) rep.zipEntries.push_back(e.name);
    writeZip(output.path(), entries);
    bytes = fs::file_size(output.path());
  }
  rep.packedBytes = bytes;
  if (o.maxBytes && bytes > o.maxBytes) {
    rep.tooLarge = true;  // OUT.partial goes with `output`
    return rep;
  }
  output.commit();
  rep.packMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace crashcap::investigate
