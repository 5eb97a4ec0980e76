// `crashcap triage`: the plan of experiments that establishes the facts, and the facts read
// from the bundle itself; the rules that judge them are in triage_rules.cpp.
#include "crashcap/investigate/triage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/inspect/host_tensor.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/stats.hpp"
#include "crashcap/investigate/results_json.hpp"

namespace crashcap::investigate {

using nlohmann::json;

std::vector<RowFinding> findRowOddities(const std::string& bundle, int64_t step, const std::vector<int64_t>& rows) {
  std::vector<RowFinding> out;
  auto reader = formats::BundleReader::open(bundle);
  const std::string prefix = formats::batchTensorName(step, "");
  const std::string index = formats::batchTensorName(step, formats::kDatasetIndexName);
  for (const auto& info : reader->tensors()) {
    if (info.name.rfind(prefix, 0) != 0 || info.name == index) continue;
    auto t = inspect::loadTensor(*reader, info.name);  // once per tensor, not per culprit row
    for (int64_t r : rows) {
      if (t.shape.empty() || t.shape[0] <= r) continue;
      auto row = inspect::applySlice(t, inspect::parseSlice(std::to_string(r)));
      auto st = inspect::computeStats(row);
      RowFinding f;
      f.row = r;
      f.tensor = info.name;
      if (st.nanCount || st.posInfCount || st.negInfCount) {
        f.kind = RowFinding::Kind::NonFinite;
        f.nanCount = st.nanCount;
        f.infCount = st.posInfCount + st.negInfCount;
      } else if (st.count > 0 && st.zeroCount == st.count) {
        f.kind = RowFinding::Kind::AllZeros;
      } else if (!formats::isFloating(t.dtype) && !formats::isComplex(t.dtype) && row.numel() == 1 && st.max) {
        f.kind = RowFinding::Kind::Value;
        f.value = static_cast<int64_t>(*st.max);
      } else {
        continue;
      }
      out.push_back(f);
    }
  }
  return out;
}

std::optional<LossClasses> findLossClasses(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  auto records = formats::readRecords(*reader);
  if (!records.opTrace) return std::nullopt;
  const auto& ops = records.opTrace->ops;
  // The newest classification loss: the one the failing step ran.
  for (auto it = ops.rbegin(); it != ops.rend(); ++it)
    if (it->name.find("nll_loss") != std::string::npos && !it->inputs.empty() && it->inputs[0].shape.size() == 2)
      return LossClasses{it->inputs[0].shape[1], it->inputs[0].shape};
  return std::nullopt;
}

Triage runTriage(const std::string& bundle, const TriageOptions& options) {
  ExperimentRunner runner(options.experiments);
  const std::string timeout = fmt::format("{}", runner.timeoutSeconds());
  // A failed experiment is a missing fact: its log entry says why.
  auto run = [&](const std::string& name, std::vector<std::string> args, auto fromJson, double scale = 1) {
    auto e = runner.run(name, args, scale);
    return e.output ? std::optional(fromJson(*e.output)) : std::nullopt;
  };
  Triage t;
  TriageFacts& f = t.facts;
  f.bundle = bundle;
  f.replay = run("reproduce", {"replay", bundle, "--json"}, replayResultFromJson);
  if (!f.replay) f.replayOutcome = runner.log().back().outcome;
  f.steps = run("bisect-steps", {"bisect", "steps", bundle, "--json"}, stepBisectionFromJson);
  if (f.reproduced()) {
    const int64_t batchSize = f.replay->batchSize;
    f.samples = run("bisect-samples", {"bisect", "samples", bundle, "--json", "--timeout", timeout},
                    sampleBisectionFromJson, 2 * std::log2(batchSize + 1) + 3);
    const auto rows = f.culpritRows();
    std::vector<int64_t> rest;
    for (int64_t r = 0; r < batchSize; ++r)
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rest.push_back(r);
    if (!rows.empty() && !rest.empty())
      f.withoutRows = run("without-rows", replayArgs(bundle, f.step(), {"--rows", fmt::format("{}", fmt::join(rest, ","))}),
                          replayResultFromJson);
    if (!rows.empty()) f.rowFindings = findRowOddities(bundle, f.step(), rows);
  }
  // Ops and settings are tested at the failing step: pointless when replay cannot reach it.
  if (!f.replayBlocked()) {
    f.ops = run("bisect-ops", {"bisect", "ops", bundle, "--json"}, opBisectionFromJson);
    f.config = run("bisect-config", {"bisect", "config", bundle, "--json", "--timeout", timeout}, configBisectionFromJson,
                   formats::torch::settingNames().size() + replayer::availableDevices().size() + 1);
  }
  f.lossClasses = findLossClasses(bundle);
  t.hypotheses = judge(f);
  t.culprit = findCulprit(f, t.hypotheses);
  t.experiments = runner.log();
  return t;
}

json toJson(const Hypothesis& h) {
  return {{"id", h.id}, {"verdict", verdictName(h.verdict)}, {"evidence", h.evidence}, {"rerun", h.rerun}};
}

json toJson(const Triage& t, bool withReplay) {
  const auto& f = t.facts;
  json hypotheses = json::array();
  for (const auto& h : t.hypotheses) hypotheses.push_back(toJson(h));
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  const auto& c = t.culprit;
  json out = {{"bundle", f.bundle},
              {"reproduced", f.reproduced()},
              {"verdict", f.replay ? json(replayer::verdictName(f.replay->verdict)) : json(nullptr)},
              {"step", f.step() >= 0 ? json(f.step()) : json(nullptr)},
              {"hypotheses", hypotheses},
              {"culprit",
               {{"step", opt(c.step)},
                {"rows", opt(c.rows)},
                {"dataset_indices", opt(c.datasetIndices)},
                {"op", opt(c.op)},
                {"phase", opt(c.phase)},
                {"changes", opt(c.changes)}}},
              {"experiments", experimentLogJson(t.experiments)}};
  if (withReplay) out["replay"] = f.replay ? toJson(*f.replay) : json(nullptr);
  return out;
}

}  // namespace crashcap::investigate
