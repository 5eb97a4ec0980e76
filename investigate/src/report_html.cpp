// `crashcap report --html`: one self-contained HTML file with plots. The facts are the Markdown
// report's (the bundle's story, the replay, triage), laid out for a person: the curves of the
// recorded steps with the crash marked, the first non-finite op's values, the culprit rows beside
// a normal row of the same batch, the triage table, the environment and the kernel trace. Tables
// are written here; the plots are drawn by Chart.js, embedded in the file with the data, so the
// report makes no network request and renders anywhere.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/inspect/demangle.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/investigate/report.hpp"
#include "crashcap/investigate/triage.hpp"

namespace crashcap::investigate {

#if CRASHCAP_HAVE_CHART_JS
extern const unsigned char kChartJs[];
extern const std::size_t kChartJs_size;
#endif

using nlohmann::json;

namespace {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A number for the plots' data: null when it is not finite (JSON has no NaN).
json finite(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string numberText(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Inf" : "-Inf";
  return fmt::format("{:.6g}", v);
}

std::string statsCells(const replayer::ValueStats& v) {
  return fmt::format("<td>{}</td><td>[{}]</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>", escape(v.dtype),
                     fmt::join(v.shape, ", "), v.nanCount, v.infCount, v.min ? numberText(*v.min) : "-",
                     v.max ? numberText(*v.max) : "-");
}

/// One row of a batch tensor: its statistics, and (image-like tensors) a small picture of it.
struct RowView {
  int64_t nan = 0, inf = 0;
  std::optional<double> min, max, mean;
  json image;  ///< {w, h, values (null: not finite)} or null
};

RowView viewRow(const at::Tensor& batch, int64_t row) {
  RowView v;
  at::Tensor r = batch[row].to(at::kDouble);
  v.nan = r.isnan().sum().item<int64_t>();
  v.inf = r.isinf().sum().item<int64_t>();
  at::Tensor fin = r.masked_select(r.isfinite());
  if (fin.numel() > 0) {
    v.min = fin.min().item<double>();
    v.max = fin.max().item<double>();
    v.mean = fin.mean().item<double>();
  }
  // [H, W] or [C <= 4, H, W] with sides of at least 8: a picture, the channels averaged (a NaN in
  // any channel shows), sampled down to at most 64 on a side.
  at::Tensor img;
  if (r.dim() == 2) img = r;
  if (r.dim() == 3 && r.size(0) <= 4) img = r.mean(0);
  if (img.defined() && img.size(0) >= 8 && img.size(1) >= 8) {
    const int64_t stride = std::max<int64_t>(1, (std::max(img.size(0), img.size(1)) + 63) / 64);
    img = img.slice(0, 0, img.size(0), stride).slice(1, 0, img.size(1), stride).contiguous();
    json values = json::array();
    const double* p = img.data_ptr<double>();
    for (int64_t i = 0; i < img.numel(); ++i) values.push_back(finite(p[i]));
    v.image = {{"w", img.size(1)}, {"h", img.size(0)}, {"values", std::move(values)}};
  }
  return v;
}

}  // namespace

bool htmlReportAvailable(std::string* why) {
#if CRASHCAP_HAVE_CHART_JS
  return true;
#else
  if (why)
    *why = "this crashcap was built without Chart.js, which draws the HTML report's plots (Debian: libjs-chart.js; "
           "`./dev setup` installs it; then rebuild)";
  return false;
#endif
}

std::string htmlReport(const std::string& path, const std::optional<Triage>& triage,
                       const replayer::ReplayResult* replayed, const std::string& shownAs) {
  std::string why;
  if (!htmlReportAvailable(&why)) throw Error(ErrorCode::Unsupported, "no HTML report: " + why);
  auto reader = formats::BundleReader::open(path);
  const std::string& bundle = shownAs.empty() ? path : shownAs;
  const auto view = formats::readRecords(*reader);
  const json story = inspect::storyJson(*reader);
  const json& crash = story["crash"];
  const replayer::ReplayResult* replay = triage && triage->facts.replay ? &*triage->facts.replay : replayed;
  const int64_t crashStep = reportedStep(view).value_or(-1);
  // A crash between steps or while loading the next batch names the step before it, which completed.
  const std::string crashAt =
      crashStep < 0 ? "at step ?"
                    : fmt::format("{} step {}", formats::failedInStep(view) ? "at" : "after", crashStep);
  const std::string error = crash.is_null() ? std::string("no crash record") : lastLine(crash["error"].get<std::string>());

  // The curves: one point per recorded step.
  std::map<int64_t, double> lr, weightNorm;
  std::map<int64_t, const formats::StepEndData*> endOf;
  for (const auto& e : view.stepEnds) endOf.emplace(e.step, &e);
  for (const auto& b : view.stepBegins) {  // the one the update used
    auto e = endOf.find(b.step);
    const auto& lrs = formats::updateLearningRates(b, e == endOf.end() ? nullptr : e->second);
    if (!lrs.empty()) lr[b.step] = lrs[0];
  }
  if (replay)
    for (const auto& s : replay->steps)
      if (s.weightNorm) weightNorm[s.step] = *s.weightNorm;
  json steps = json::array();
  std::set<int64_t> ended;
  for (const auto& e : view.stepEnds) {
    if (!ended.insert(e.step).second) continue;
    json point = {{"step", e.step}, {"loss", finite(e.loss)}, {"grad_norm", e.hasGradNorm ? finite(e.gradNorm) : json(nullptr)}};
    point["lr"] = lr.count(e.step) ? finite(lr[e.step]) : json(nullptr);
    point["weight_norm"] = weightNorm.count(e.step) ? finite(weightNorm[e.step]) : json(nullptr);
    point["nonfinite"] = !std::isfinite(e.loss) || (e.hasGradNorm && !std::isfinite(e.gradNorm));
    steps.push_back(std::move(point));
  }

  std::string body;
  auto section = [&](const std::string& title) { body += "<h2>" + escape(title) + "</h2>\n"; };

  // Summary.
  body += fmt::format("<h1>Training crash {}</h1>\n<p class=\"error\"><code>{}</code></p>\n", crashAt, escape(error));
  body += "<ul class=\"facts\">";
  body += fmt::format("<li>bundle <code>{}</code></li>", escape(bundle));
  if (!crash.is_null())
    body += fmt::format("<li>{} in the {} phase{}</li>", escape(crash["kind"].get<std::string>()),
                        escape(crash["phase"].is_string() ? crash["phase"].get<std::string>() : "unknown"),
                        crash["signal_name"].is_string() ? ", " + escape(crash["signal_name"].get<std::string>()) : "");
  if (replay) {
    body += fmt::format("<li>replay: <b>{}</b> (steps {}..{} from keyframe {})</li>", replayer::verdictName(replay->verdict),
                        replay->keyframe, replay->step, replay->keyframe);
    if (view.crash && view.crash->phase == "loading" && replay->batchLoad)
      body += fmt::format("<li{}>{}</li>", replayer::showsFailure(*replay) ? "" : " class=\"warn\"",
                          escape(loadingReplayText(*replay, std::to_string(replay->step))));
    else if (!replayer::showsFailure(*replay) && view.crash && view.crash->phase == "loading")
      body += "<li class=\"warn\">the error came from the DataLoader while it loaded the next batch, which never "
              "arrived, and replay did not load it again</li>";
    else if (!replayer::showsFailure(*replay))
      body += "<li class=\"warn\">the crash does not reproduce in replay here: the bundle alone may not be enough to "
              "reproduce it</li>";
  }
  if (triage) {
    std::vector<std::string> confirmed;
    for (const auto& h : triage->hypotheses)
      if (h.verdict == HypothesisVerdict::Confirmed) confirmed.push_back(h.id);
    body += fmt::format("<li>triage confirms: <b>{}</b></li>",
                        confirmed.empty() ? std::string("nothing yet") : escape(fmt::format("{}", fmt::join(confirmed, ", "))));
  }
  body += "</ul>\n";
  for (const auto& note : reader->notes())
    if (note.key == "crashcap.pack")
      body += "<details open><summary>made by <code>crashcap pack</code> for sharing</summary><pre>" + escape(note.text) +
              "</pre></details>\n";

  // Curves.
  section("The recorded steps");
  body += fmt::format("<p>{} recorded step{}, the crash{} marked in red.{}</p>\n", steps.size(), steps.size() == 1 ? "" : "s",
                      crashStep >= 0 ? fmt::format(" (step {})", crashStep) : "",
                      weightNorm.empty() ? " The weight norm is known for replayed steps only; none were replayed."
                                         : " The weight norm is known for replayed steps only.");
  body += "<div class=\"charts\">";
  for (const char* id : {"loss", "grad_norm", "weight_norm", "lr"})
    body += fmt::format("<div class=\"chart\"><canvas id=\"chart-{}\"></canvas></div>", id);
  body += "</div>\n";

  // The first non-finite op.
  if (replay && replay->firstNonFiniteOp) {
    const auto& op = *replay->firstNonFiniteOp;
    section("The first op whose output is not finite");
    body += fmt::format("<p><code>{}</code> ({} phase{}, op #{} of step {})</p>\n", escape(op.name), escape(op.phase),
                        escape(nodeText(op.node)), op.index, replay->step);
    body += "<table><tr><th></th><th>dtype</th><th>shape</th><th>NaN</th><th>Inf</th><th>finite min</th><th>finite max</th></tr>";
    for (size_t i = 0; i < op.inputs.size(); ++i) body += fmt::format("<tr><td>input {}</td>{}</tr>", i, statsCells(op.inputs[i]));
    for (size_t i = 0; i < op.outputs.size(); ++i)
      body += fmt::format("<tr class=\"bad\"><td>output {}</td>{}</tr>", i, statsCells(op.outputs[i]));
    body += "</table>\n";
  }

  // The culprit rows beside a normal row of the same batch.
  json pictures = json::array();
  const formats::StepBeginData* begun = nullptr;
  for (const auto& b : view.stepBegins)
    if (b.step == crashStep) begun = &b;
  if (begun) {
    // Each tensor that holds the batch's rows, with them first (a sequence-first tensor's are
    // its dimension 1).
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    const auto rows = formats::batchRows(*begun, *reader);
    const int64_t batchSize = rows.count;
    for (size_t i = 0; i < begun->batch.size(); ++i) {
      const auto& n = begun->batch[i];
      const auto* t = reader->find(n);
      if (!t || rows.dims[i] < 0 || t->totalBytes > reader->limits().maxTensorBytes) continue;
      at::Tensor v = formats::torch::readTensor(*reader, *t).movedim(rows.dims[i], 0);
      tensors.emplace_back(n.substr(formats::batchTensorName(crashStep, "").size()), v);
    }
    std::vector<int64_t> culprits;
    std::string whose;
    if (triage && triage->culprit.rows && !triage->culprit.loader && triage->culprit.step &&
        *triage->culprit.step == crashStep) {
      culprits = *triage->culprit.rows;
      whose = "the rows triage's sample bisection names";
    } else {
      for (int64_t r = 0; r < batchSize; ++r)
        for (const auto& [name, t] : tensors)
          if (t.is_floating_point() && !t[r].isfinite().all().item<bool>()) {
            culprits.push_back(r);
            break;
          }
      whose = "the rows holding a NaN or Inf";
    }
    std::optional<int64_t> normal;
    for (int64_t r = 0; r < batchSize && !normal; ++r)
      if (std::find(culprits.begin(), culprits.end(), r) == culprits.end()) normal = r;
    section("The culprit rows");
    if (culprits.empty()) {
      body += fmt::format("<p>No row of step {}'s batch of {} holds a NaN or Inf{}.</p>\n", crashStep, batchSize,
                          triage ? ", and triage names no rows" : " (triage, which bisects the rows, did not run)");
    } else {
      std::vector<int64_t> shown(culprits.begin(), culprits.begin() + std::min<size_t>(culprits.size(), 4));
      if (normal) shown.push_back(*normal);
      std::vector<int64_t> indices;  // of each shown row; -1 not known
      const auto* order = replay && replay->step == crashStep && replay->rowOrder && replay->rowOrder->matched()
                              ? &*replay->rowOrder
                              : nullptr;
      for (const auto& [name, t] : tensors)
        if (name == formats::kDatasetIndexName && t.scalar_type() == at::kLong)
          for (int64_t r : shown)  // the sampler's order, unless a collate function reordered the rows
            indices.push_back(!order ? t[r].item<int64_t>()
                              : r < static_cast<int64_t>(order->datasetIndices.size()) ? order->datasetIndices[static_cast<size_t>(r)]
                                                                                        : -1);
      body += fmt::format("<p>Step {}'s batch of {}: {} ({}), beside row {}, a normal row of the same batch.</p>\n",
                          crashStep, batchSize, whose, fmt::join(culprits, ", "), normal ? std::to_string(*normal) : "-");
      body += "<table><tr><th>tensor</th><th>row</th><th>dataset index</th><th>NaN</th><th>Inf</th><th>finite min</th>"
              "<th>finite max</th><th>mean</th><th>picture</th></tr>";
      for (const auto& [name, t] : tensors) {
        if (!t.is_floating_point() && name == formats::kDatasetIndexName) continue;
        for (size_t i = 0; i < shown.size(); ++i) {
          const int64_t r = shown[i];
          const bool isCulprit = !normal || r != *normal;
          std::string picture;
          RowView v;
          if (!t.is_complex()) v = viewRow(t, r);
          if (!v.image.is_null()) {
            picture = fmt::format("<canvas class=\"heat\" id=\"picture-{}\"></canvas>", pictures.size());
            pictures.push_back({{"row", r}, {"tensor", name}, {"image", v.image}});
          }
          body += fmt::format(
              "<tr class=\"{}\"><td><code>{}</code></td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
              "<td>{}</td><td>{}</td></tr>",
              isCulprit ? "bad" : "", escape(name), r, isCulprit ? " (culprit)" : " (normal)",
              i < indices.size() && indices[i] >= 0 ? std::to_string(indices[i]) : "-", v.nan, v.inf, v.min ? numberText(*v.min) : "-",
              v.max ? numberText(*v.max) : "-", v.mean ? numberText(*v.mean) : "-", picture);
        }
      }
      body += "</table>\n<p class=\"note\">Pictures: the row's values (channels averaged), dark to light; red marks a NaN "
              "or Inf.</p>\n";
    }
  }

  // Triage.
  if (triage) {
    section("Triage");
    body += "<table><tr><th>hypothesis</th><th>verdict</th><th>evidence</th><th>rerun</th></tr>";
    for (const auto& h : triage->hypotheses)
      body += fmt::format("<tr class=\"{}\"><td>{}</td><td><b>{}</b></td><td>{}</td><td><code>{}</code></td></tr>",
                          h.verdict == HypothesisVerdict::Confirmed ? "confirmed" : "", escape(h.id), verdictName(h.verdict),
                          escape(fmt::format("{}", fmt::join(h.evidence, "; "))), escape(h.rerun));
    body += "</table>\n";
  }

  // Environment.
  section("Environment");
  body += "<table>";
  const json facts = story["env"].value("facts", json::object());
  for (const auto& [key, value] : facts.items()) {
    std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    // A spawned rank's function and arguments, pickled: what a replay starts it from, not for reading.
    if (key == "python.spawn") text = fmt::format("({} bytes: what crashcap replay starts this rank from)", text.size());
    body += fmt::format("<tr><td><code>{}</code></td><td>{}</td></tr>", escape(key), escape(text));
  }
  std::string command;
  for (const auto& a : story["env"].value("command_line", json::array()))
    command += (command.empty() ? "" : " ") + a.get<std::string>();
  body += fmt::format("<tr><td>command</td><td><code>{}</code></td></tr></table>\n", escape(command.empty() ? "unknown" : command));

  // Kernel trace.
  for (const auto& k : view.kernelTraces) {
    section("GPU kernel trace");
    if (!k.available()) {
      body += "<p>" + escape(k.status) + "</p>\n";
      continue;
    }
    std::map<std::string, std::pair<uint64_t, double>> byName;  // count, total ms
    for (const auto& a : k.activities)
      if (a.kind == formats::TraceActivityData::Kind::Kernel) {
        auto& e = byName[a.name];
        ++e.first;
        e.second += a.endNs > a.startNs ? (a.endNs - a.startNs) / 1e6 : 0;
      }
    std::vector<std::pair<std::string, std::pair<uint64_t, double>>> top(byName.begin(), byName.end());
    std::sort(top.begin(), top.end(), [](const auto& x, const auto& y) { return x.second.second > y.second.second; });
    // Demangled in one go (the demangler runs in a child process, once per call).
    std::vector<std::string> symbols;
    for (size_t i = 0; i < top.size() && i < 10; ++i) symbols.push_back(top[i].first);
    for (const auto* e : {&k.firstError, &k.stickyError}) symbols.push_back(*e ? (*e)->symbol : "");
    const std::vector<std::string> shown = inspect::demangleSymbols(symbols);
    const size_t kernels = std::min<size_t>(top.size(), 10);
    body += fmt::format("<p>process {}: {} activities ({} kept), {} launches.</p>\n", k.pid, k.totalActivities,
                        k.activities.size(), k.totalLaunches);
    for (const auto* e : {&k.firstError, &k.stickyError})
      if (*e)
        body += fmt::format("<p class=\"error\">{} error: <code>{}</code> from <code>{}</code>{}</p>\n",
                            e == &k.firstError ? "first" : "context-poisoning", escape((*e)->name.empty() ? std::to_string((*e)->code) : (*e)->name),
                            escape((*e)->api),
                            (*e)->symbol.empty() ? "" : " launching <code>" + escape(shown[kernels + (e == &k.firstError ? 0 : 1)]) + "</code>");
    body += "<table><tr><th>kernel</th><th>launches</th><th>total ms</th></tr>";
    for (size_t i = 0; i < kernels; ++i)
      body += fmt::format("<tr><td><code>{}</code></td><td>{}</td><td>{:.3f}</td></tr>", escape(shown[i]),
                          top[i].second.first, top[i].second.second);
    body += "</table>\n";
  }

  json data = {{"steps", steps}, {"crash_step", crashStep >= 0 ? json(crashStep) : json(nullptr)}, {"pictures", pictures}};
  // Names from the bundle need not be UTF-8; and no "<" may reach the script element's text, where
  // "</script" or "<!--" would change how the page parses.
  std::string dataText = data.dump(-1, ' ', false, json::error_handler_t::replace);
  for (size_t at = dataText.find('<'); at != std::string::npos; at = dataText.find('<', at)) dataText.replace(at, 1, "\\u003c");

  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  html += fmt::format("<title>crashcap: training crash {}</title>\n", crashAt);
  html += fmt::format("<meta name=\"generator\" content=\"crashcap {}\">\n", formats::toolVersion());
  html += R"(<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
code { font: 12.5px ui-monospace, monospace; } .error code { color: #b00020; } .warn { color: #b00020; font-weight: bold; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
tr.bad td { background: #fff0f0; } tr.confirmed td { background: #f0fff0; } .note { color: #666; font-size: 12px; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; } .chart { height: 240px; position: relative; }
canvas.heat { image-rendering: pixelated; width: 96px; border: 1px solid #ccc; } pre { white-space: pre-wrap; font-size: 12px; }
</style>
)";
  html += "<script>\n";
#if CRASHCAP_HAVE_CHART_JS
  html.append(reinterpret_cast<const char*>(kChartJs), kChartJs_size);
#endif
  html += "\n</script>\n</head><body>\n" + body;
  html += std::string("<p class=\"note\">Written by crashcap ") + formats::toolVersion() +
          " from the bundle alone; this file loads nothing from the network.</p>\n";
  html += "<script type=\"application/json\" id=\"crashcap-data\">" + dataText + "</script>\n";
  html += R"(<script>
(function () {
  const data = JSON.parse(document.getElementById('crashcap-data').textContent);
  const crash = data.crash_step;
  const crashLine = { id: 'crashLine', afterDatasetsDraw(chart) {
    if (crash === null) return;
    const x = chart.scales.x.getPixelForValue(crash), area = chart.chartArea, ctx = chart.ctx;
    ctx.save(); ctx.strokeStyle = '#d00'; ctx.lineWidth = 2; ctx.setLineDash([5, 3]);
    ctx.beginPath(); ctx.moveTo(x, area.top); ctx.lineTo(x, area.bottom); ctx.stroke(); ctx.restore(); } };
  const titles = { loss: 'loss', grad_norm: 'gradient norm', weight_norm: 'weight norm (replayed steps)', lr: 'learning rate' };
  const drawn = {};
  for (const key of Object.keys(titles)) {
    const points = data.steps.map(s => ({ x: s.step, y: s[key] }));
    const values = points.map(p => p.y).filter(v => v !== null);
    const positive = values.length > 0 && values.every(v => v > 0);
    const log = positive && Math.max(...values) / Math.min(...values) > 1e3;
    const flat = positive && Math.max(...values) === Math.min(...values);
    const chart = new Chart(document.getElementById('chart-' + key), {
      type: 'line',
      data: { datasets: [{ label: titles[key], data: points, borderColor: '#1565c0', backgroundColor: '#1565c0',
                           pointRadius: points.length > 200 ? 0 : 2, spanGaps: false, borderWidth: 1.5 }] },
      options: { animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
                 plugins: { title: { display: true, text: titles[key] + (values.length ? '' : ': not recorded') },
                            legend: { display: false } },
                 scales: { x: { type: 'linear', title: { display: true, text: 'step' },
                                suggestedMax: crash === null ? undefined : crash },
                           y: { type: log ? 'logarithmic' : 'linear',
                                // a constant (a learning rate without a schedule) is drawn from 0, not as 0 +- 1
                                suggestedMin: flat ? 0 : undefined, suggestedMax: flat ? 2 * values[0] : undefined } } },
      plugins: [crashLine] });
    drawn[key] = chart.data.datasets[0].data.length;
  }
  data.pictures.forEach((p, i) => {
    const canvas = document.getElementById('picture-' + i), img = p.image;
    canvas.width = img.w; canvas.height = img.h;
    const ctx = canvas.getContext('2d'), pixels = ctx.createImageData(img.w, img.h);
    const finite = img.values.filter(v => v !== null);
    const lo = finite.length ? Math.min(...finite) : 0, hi = finite.length ? Math.max(...finite) : 1;
    img.values.forEach((v, j) => {
      const shade = v === null ? 0 : Math.round(255 * (hi > lo ? (v - lo) / (hi - lo) : 0.5));
      pixels.data.set(v === null ? [220, 0, 0, 255] : [shade, shade, shade, 255], 4 * j);
    });
    ctx.putImageData(pixels, 0, 0);
  });
  document.body.dataset.lossPoints = drawn.loss;
  document.body.dataset.pictures = data.pictures.length;
  document.body.dataset.rendered = 'true';
})();
</script>
</body></html>
)";
  return html;
}

}  // namespace crashcap::investigate
