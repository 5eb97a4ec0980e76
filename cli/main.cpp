// crashcap: the command-line entry point. Wiring only: each subcommand parses its options,
// calls the libraries and prints; errors become exit codes here and nowhere else.
//
// Exit codes: 0 ok; 1 a check failed (verify found damage); 2 bad input or usage (missing or
// corrupt file, unknown tensor, bad option); 3 internal error (a crashcap bug).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/npy.hpp"
#include "crashcap/inspect/print.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/stats.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/inspect/summary.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#ifdef CRASHCAP_HAVE_TORCH
#include "crashcap/replayer/bisect.hpp"
#include "crashcap/replayer/replay.hpp"
#include "crashcap/formats/torch/pt_file.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#endif

namespace {

using namespace crashcap;
using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 3;

const char* kExitCodesHelp =
    "Exit codes: 0 ok; 1 a check failed (verify found damage); 2 bad input or usage (missing or\n"
    "corrupt file, unknown tensor, bad option); 3 internal error (a crashcap bug; please report it).";

/// Options shared by the commands that open a bundle.
struct ReadOptions {
  bool json = false;
  uint64_t maxTensorBytes = formats::ReaderLimits{}.maxTensorBytes;

  formats::ReaderLimits limits() const {
    formats::ReaderLimits l;
    l.maxTensorBytes = maxTensorBytes;
    return l;
  }
};

void addReadOptions(CLI::App* cmd, ReadOptions& o) {
  cmd->add_flag("--json", o.json, "Print one JSON object instead of text");
  cmd->add_option("--max-tensor-bytes", o.maxTensorBytes,
                  "Refuse to load a tensor larger than this into memory (untrusted bundles)")
      ->capture_default_str();
}

/// Prints JSON; bytes from a bundle that are not valid UTF-8 (a note, a hostname) become U+FFFD
/// instead of aborting the output.
/// Progress on stderr for long scans, only when stderr is a terminal.
formats::Progress progressPrinter(const char* what) {
  if (!isatty(2)) return {};
  return [what](uint64_t done, uint64_t total) {
    std::fprintf(stderr, "\r%s: %3d%% (%s of %s)\033[K", what, total ? int(100 * done / total) : 100,
                 inspect::formatBytes(done).c_str(), inspect::formatBytes(total).c_str());
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

/// Clears a progress line (if one was drawn) before the result is printed.
void endProgress() {
  if (isatty(2)) std::fprintf(stderr, "\r\033[K");
}

void printJson(const json& j) { std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n"; }

inspect::HostTensor loadTensor(const formats::BundleReader& reader, const std::string& name) {
  const auto& t = reader.get(name);
  inspect::HostTensor h;
  h.dtype = t.dtype;
  h.shape = t.shape;
  h.bytes = reader.readTensor(t);
  return h;
}

int cmdInfo(const std::string& path, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits(), progressPrinter("scanning"));
  endProgress();
  if (o.json)
    printJson(inspect::bundleInfoJson(*reader));
  else
    std::cout << inspect::bundleInfoText(*reader);
  return kExitOk;
}

int cmdLs(const std::string& path, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits());
  if (o.json)
    printJson(inspect::tensorListJson(*reader));
  else
    std::cout << inspect::tensorListText(*reader);
  if (!reader->report().complete() && !o.json)
    std::cerr << "note: " << reader->report().summary() << "\n";
  return kExitOk;
}

struct ShowOptions {
  std::string name;
  std::string slice;
  bool stats = false;
  bool full = false;
  int precision = 4;
};

int cmdShow(const std::string& path, const ShowOptions& s, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits());
  auto t = loadTensor(*reader, s.name);
  const auto fullShape = t.shape;
  if (!s.slice.empty()) t = inspect::applySlice(t, inspect::parseSlice(s.slice));
  inspect::PrintOptions p;
  p.precision = s.precision;
  if (s.full) p.threshold = UINT64_MAX;
  if (o.json) {
    json j = {{"name", s.name},
              {"dtype", formats::dtypeName(t.dtype)},
              {"shape", fullShape},
              {"slice", s.slice.empty() ? json(nullptr) : json(s.slice)},
              {"slice_shape", t.shape}};
    if (s.stats) j["stats"] = inspect::statsToJson(inspect::computeStats(t));
    j["text"] = inspect::formatTensor(t, p);
    printJson(j);
    return kExitOk;
  }
  std::cout << fmt::format("{}  {}  {}{}\n", s.name, formats::dtypeName(t.dtype), formats::formatShape(fullShape),
                           s.slice.empty() ? "" : fmt::format("  [{}] -> {}", s.slice, formats::formatShape(t.shape)));
  if (s.stats) std::cout << inspect::formatStats(inspect::computeStats(t)) << "\n";
  std::cout << inspect::formatTensor(t, p) << "\n";
  return kExitOk;
}

struct ExportOptions {
  std::string name, npy, pt, slice;
};

int cmdExport(const std::string& path, const ExportOptions& e, const ReadOptions& o) {
  if (e.npy.empty() == e.pt.empty())
    throw Error(ErrorCode::InvalidArgument, "give exactly one of --npy FILE or --pt FILE");
  auto reader = formats::BundleReader::open(path, o.limits());
  auto t = loadTensor(*reader, e.name);
  if (!e.slice.empty()) t = inspect::applySlice(t, inspect::parseSlice(e.slice));
  std::string out;
  if (!e.npy.empty()) {
    bool widened = inspect::writeNpy(t, e.npy);
    out = e.npy;
    if (widened) std::cerr << "note: numpy has no bfloat16; wrote float32 (exact widening)\n";
  } else {
#ifdef CRASHCAP_HAVE_TORCH
    formats::torch::savePt(formats::torch::tensorFromBytes(t.dtype, t.shape, t.bytes.data(), t.bytes.size()), e.pt);
    out = e.pt;
#else
    throw Error(ErrorCode::Unsupported, "this crashcap was built without LibTorch, so it cannot write .pt files",
                "use --npy, or rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
  }
  if (o.json)
    printJson({{"name", e.name}, {"dtype", formats::dtypeName(t.dtype)}, {"shape", t.shape}, {"output", out}});
  else
    std::cout << fmt::format("wrote {} ({} {}, {})\n", out, formats::dtypeName(t.dtype), formats::formatShape(t.shape),
                             inspect::formatBytes(t.bytes.size()));
  return kExitOk;
}

struct ImportOptions {
  std::string out;
  std::vector<std::string> items;
  std::vector<std::string> notes;
  int level = 3;
  bool force = false;
  bool json = false;
};

int cmdImport(const ImportOptions& im) {
  struct Item {
    std::string name, file;
  };
  std::vector<Item> items;
  for (const auto& a : im.items) {
    auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.size())
      throw Error(ErrorCode::InvalidArgument, fmt::format("'{}' is not NAME=FILE.npy", a),
                  "example: crashcap import bug.ccap batch/images=images.npy labels=labels.npy");
    items.push_back({a.substr(0, eq), a.substr(eq + 1)});
    formats::validateTensorName(items.back().name);
  }
  std::vector<std::pair<std::string, std::string>> notes;
  for (const auto& n : im.notes) {
    auto eq = n.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(ErrorCode::InvalidArgument, fmt::format("'{}' is not KEY=TEXT", n));
    notes.emplace_back(n.substr(0, eq), n.substr(eq + 1));
  }
  // Read every input before creating the output, so a bad file leaves nothing behind.
  std::vector<inspect::HostTensor> tensors;
  for (const auto& it : items)
    tensors.push_back(withContext("while importing " + it.file, [&] { return inspect::readNpy(it.file); }));
  formats::WriterOptions w;
  w.zstdLevel = im.level;
  w.overwrite = im.force;
  w.producer = "crashcap import";
  std::string tmp = im.out + ".partial";
  auto writer = formats::BundleWriter::create(tmp, [&] {
    auto t = w;
    t.overwrite = true;
    return t;
  }());
  try {
    if (!im.force && access(im.out.c_str(), F_OK) == 0)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", im.out),
                  "pass --force to replace it");
    for (size_t i = 0; i < items.size(); ++i) {
      writer->writeTensor(items[i].name, tensors[i].dtype, tensors[i].shape, tensors[i].bytes.data(),
                          tensors[i].bytes.size());
      writer->writeNote("crashcap.import.source", items[i].name + "=" + items[i].file);
    }
    for (const auto& [k, v] : notes) writer->writeNote(k, v);
    writer->seal();
    if (std::rename(tmp.c_str(), im.out.c_str()) != 0)
      throw Error(ErrorCode::Io, fmt::format("cannot rename {} to {}: {}", tmp, im.out, std::strerror(errno)));
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (im.json)
    printJson({{"output", im.out}, {"tensors", items.size()}, {"bytes", writer->stats().fileBytes}});
  else
    std::cout << fmt::format("wrote {}: {} tensor{}, {}\n", im.out, items.size(), items.size() == 1 ? "" : "s",
                             inspect::formatBytes(writer->stats().fileBytes));
  return kExitOk;
}

int cmdVerify(const std::string& path, const ReadOptions& o) {
  auto v = formats::verifyBundle(path, o.limits(), progressPrinter("verifying"));
  endProgress();
  if (o.json)
    printJson(inspect::verifyJson(path, v));
  else
    std::cout << inspect::verifyText(path, v);
  return v.ok() ? kExitOk : kExitCheckFailed;
}

int cmdRecover(const std::string& in, const std::string& out, const ReadOptions& o) {
  auto r = formats::recoverBundle(in, out, o.limits(), progressPrinter("recovering"));
  endProgress();
  if (o.json)
    printJson(inspect::recoverJson(in, out, r));
  else
    std::cout << inspect::recoverText(in, out, r);
  return kExitOk;
}

int cmdInspect(const std::string& path, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits(), progressPrinter("scanning"));
  endProgress();
  if (o.json)
    printJson(inspect::storyJson(*reader));
  else
    std::cout << inspect::storyText(*reader);
  return kExitOk;
}

struct SealCliOptions {
  std::string dir;
  std::string out;
  bool keep = false;
  bool json = false;
};

int cmdSeal(const SealCliOptions& s) {
  auto recordings = recorder::findRecordings(s.dir);
  if (recordings.empty())
    throw Error(ErrorCode::NotFound, fmt::format("{} holds no recording", s.dir),
                "give the directory passed to the recorder (or a recording-<time>-<pid> directory in it)");
  if (!s.out.empty() && recordings.size() > 1)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{} holds {} recordings; -o names one output", s.dir, recordings.size()),
                "seal them one by one: crashcap seal DIR/recording-... -o OUT");
  json all = json::array();
  for (const auto& r : recordings) {
    recorder::SealOptions so;
    so.out = s.out;
    so.removeRecording = !s.keep;
    so.progress = progressPrinter("sealing");
    auto rep = recorder::sealRecording(r, so);
    endProgress();
    if (s.json) {
      all.push_back({{"recording", r},
                     {"bundle", rep.out},
                     {"state", rep.state},
                     {"records", rep.records},
                     {"tensors", rep.tensors},
                     {"steps", rep.steps},
                     {"first_step", rep.firstStep >= 0 ? json(rep.firstStep) : json(nullptr)},
                     {"last_step", rep.lastStep >= 0 ? json(rep.lastStep) : json(nullptr)},
                     {"lost", rep.lost},
                     {"bytes", rep.bytes}});
    } else {
      std::cout << fmt::format("sealed {} -> {} ({}): {} steps", r, rep.out, rep.state, rep.steps);
      if (rep.steps) std::cout << fmt::format(" ({}..{})", rep.firstStep, rep.lastStep);
      std::cout << fmt::format(", {} tensors, {}\n", rep.tensors, inspect::formatBytes(rep.bytes));
      for (const auto& l : rep.lost) std::cout << "  lost: " << l << "\n";
      std::cout << fmt::format("next: crashcap inspect {}\n", rep.out);
    }
  }
  if (s.json) printJson({{"sealed", all}});
  return kExitOk;
}

struct ReplayCliOptions {
  int64_t step = -1;
  std::string device = "cpu";
  bool json = false;
  std::string rows;         ///< "0,3,5": keep only these rows of the target step's batch
  bool noInstrument = false;
};

struct BisectCliOptions {
  std::string what;
  int64_t step = -1;
  double timeout = 300;
  bool json = false;
};

std::vector<int64_t> parseRows(const std::string& text) {
  std::vector<int64_t> rows;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    try {
      size_t used = 0;
      rows.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("--rows: '{}' is not a row number", part),
                  "give comma-separated batch rows, e.g. --rows 0,3,5");
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return rows;
}

std::string lastLineOf(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return text;
  auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

std::string joinRows(const std::vector<int64_t>& rows) {
  std::string s;
  for (auto r : rows) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

#ifdef CRASHCAP_HAVE_TORCH
json valueStatsJson(const std::vector<crashcap::replayer::ValueStats>& values) {
  json out = json::array();
  for (const auto& v : values)
    out.push_back({{"dtype", v.dtype},
                   {"shape", v.shape},
                   {"nan_count", v.nanCount},
                   {"inf_count", v.infCount},
                   {"min", v.min ? json(*v.min) : json(nullptr)},
                   {"max", v.max ? json(*v.max) : json(nullptr)}});
  return out;
}

int cmdReplay(const std::string& path, const ReplayCliOptions& o) {
  if (o.device != "cpu")
    throw Error(ErrorCode::Unsupported, fmt::format("replay on '{}' is not available yet", o.device),
                "this crashcap replays on the CPU: --device cpu");
  crashcap::replayer::ReplayOptions ro;
  ro.step = o.step;
  ro.instrument = !o.noInstrument;
  if (!o.rows.empty()) ro.rows = parseRows(o.rows);
  auto r = crashcap::replayer::replay(path, ro);
  auto fp = [](double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); };
  json steps = json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"loss", fp(s.loss)},
                     {"grad_norm", s.hasGradNorm ? fp(s.gradNorm) : json(nullptr)},
                     {"recorded_loss", s.recorded ? fp(s.recordedLoss) : json(nullptr)},
                     {"recorded_grad_norm", s.recorded ? fp(s.recordedGradNorm) : json(nullptr)},
                     {"bitwise", s.bitwise},
                     {"error", s.error.empty() ? json(nullptr) : json(s.error)}});
  json op = nullptr;
  if (r.firstNonFiniteOp)
    op = {{"name", r.firstNonFiniteOp->name},
          {"phase", r.firstNonFiniteOp->phase},
          {"seq", r.firstNonFiniteOp->seq},
          {"index", r.firstNonFiniteOp->index},
          {"inputs", valueStatsJson(r.firstNonFiniteOp->inputs)},
          {"outputs", valueStatsJson(r.firstNonFiniteOp->outputs)}};
  if (o.json) {
    printJson({{"verdict", r.verdict},
               {"step", r.step},
               {"keyframe", r.keyframe},
               {"error", r.error.empty() ? json(nullptr) : json(r.error)},
               {"recorded_error", r.recordedError.empty() ? json(nullptr) : json(r.recordedError)},
               {"diverged_at", r.divergedAt ? json(*r.divergedAt) : json(nullptr)},
               {"first_nonfinite_op", op},
               {"steps", steps},
               {"steps_replayed", r.steps.size()},
               {"batch_size", r.batchSize},
               {"rows", ro.rows.empty() ? json(nullptr) : json(ro.rows)},
               {"load_ms", r.loadMs},
               {"replay_ms", r.replayMs},
               {"device", "cpu"},
               {"threads", r.threads}});
    return kExitOk;
  }
  std::cout << fmt::format("replayed steps {}..{} of {} from keyframe {} on the CPU ({} threads) in {:.0f} ms\n",
                           r.keyframe, r.step, path, r.keyframe, r.threads, r.loadMs + r.replayMs);
  for (const auto& s : r.steps) {
    std::cout << fmt::format("  step {:<5} loss {:<14} grad norm {:<14} {}", s.step, fmt::format("{:.7g}", s.loss),
                             s.hasGradNorm ? fmt::format("{:.7g}", s.gradNorm) : "-",
                             !s.recorded ? "(no recorded fingerprint)" : s.bitwise ? "= recording, bit for bit"
                                                                                   : fmt::format("!= recording ({:.7g}, {:.7g})", s.recordedLoss, s.recordedGradNorm));
    if (!s.error.empty()) std::cout << "  error: " << s.error.substr(s.error.find_last_of('\n', s.error.size() - 2) + 1);
    std::cout << "\n";
  }
  std::cout << fmt::format("verdict  {}\n", r.verdict);
  if (r.divergedAt) std::cout << fmt::format("diverged at step {}: replay departs from the recording (nondeterminism?)\n", *r.divergedAt);
  if (!r.error.empty()) std::cout << fmt::format("error    {}\n", r.error);
  if (r.firstNonFiniteOp) {
    const auto& f = *r.firstNonFiniteOp;
    std::cout << fmt::format("first op with a non-finite output: {} ({}, op #{} of the step, autograd seq {})\n", f.name,
                             f.phase, f.index, f.seq);
    auto line = [](const char* what, const crashcap::replayer::ValueStats& v) {
      std::string shape;
      for (auto d : v.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      return fmt::format("  {} {}[{}]  NaN {}  Inf {}  finite range {}..{}\n", what, v.dtype, shape, v.nanCount,
                         v.infCount, v.min ? fmt::format("{:.6g}", *v.min) : "-", v.max ? fmt::format("{:.6g}", *v.max) : "-");
    };
    for (const auto& v : f.inputs) std::cout << line("input ", v);
    for (const auto& v : f.outputs) std::cout << line("output", v);
  }
  return kExitOk;
}

#endif

#ifdef CRASHCAP_HAVE_TORCH
/// `crashcap bisect steps`: replays the whole retained history (from the earliest keyframe)
/// and names the first step that throws or whose loss, gradient norm or updated weights go
/// non-finite.
int cmdBisectSteps(const std::string& path, const BisectCliOptions& o) {
  crashcap::replayer::ReplayOptions ro;
  ro.step = o.step;
  ro.instrument = false;
  ro.fromEarliestKeyframe = true;
  auto r = crashcap::replayer::replay(path, ro);
  auto first = crashcap::replayer::firstFailure(r.steps);
  auto fp = [](double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); };
  if (o.json) {
    json steps = json::array();
    for (const auto& s : r.steps)
      steps.push_back({{"step", s.step},
                       {"loss", fp(s.loss)},
                       {"grad_norm", s.hasGradNorm ? fp(s.gradNorm) : json(nullptr)},
                       {"lr", s.learningRate},
                       {"weight_norm", s.step < r.step ? fp(s.weightNorm) : json(nullptr)},
                       {"weights_finite", s.weightsFinite},
                       {"bitwise", s.bitwise},
                       {"error", s.error.empty() ? json(nullptr) : json(lastLineOf(s.error))}});
    printJson({{"kind", "steps"},
               {"from_keyframe", r.keyframe},
               {"target", r.step},
               {"first_failing_step", first ? json(first->step) : json(nullptr)},
               {"reason", first ? json(first->reason) : json(nullptr)},
               {"diverged_at", r.divergedAt ? json(*r.divergedAt) : json(nullptr)},
               {"steps", steps}});
    return kExitOk;
  }
  std::cout << fmt::format("replayed steps {}..{} from keyframe {}\n", r.keyframe, r.step, r.keyframe);
  std::cout << "  step   lr           loss           grad norm      weight norm after update\n";
  for (const auto& s : r.steps)
    std::cout << fmt::format("  {:<6} {:<12.4g} {:<14.7g} {:<14.7g} {}\n", s.step, s.learningRate, s.loss,
                             s.hasGradNorm ? s.gradNorm : std::nan(""),
                             s.step < r.step ? fmt::format("{:.7g}", s.weightNorm) : std::string("-"));
  if (first)
    std::cout << fmt::format("first failing step: {} ({})\n", first->step,
                             first->reason == "weights" ? "its update made weights non-finite"
                             : first->reason == "error" ? "it throws"
                                                        : "its " + first->reason + " is non-finite");
  else
    std::cout << "no replayed step fails\n";
  return kExitOk;
}

/// `crashcap bisect samples`: delta debugging over the failing step's batch rows, each
/// experiment a `crashcap replay --rows` in a fresh child process with a timeout.
int cmdBisect(const std::string& path, const BisectCliOptions& o) {
  if (o.what == "steps") return cmdBisectSteps(path, o);
  if (o.what != "samples")
    throw Error(ErrorCode::Unsupported, fmt::format("bisect {} is not available yet", o.what),
                "this crashcap bisects steps and samples: crashcap bisect steps|samples BUNDLE");
  // The whole-batch replay tells the step and the batch size (and that it reproduces).
  crashcap::replayer::ReplayOptions first;
  first.step = o.step;
  first.instrument = false;
  auto base = crashcap::replayer::replay(path, first);
  const std::string self = "/proc/self/exe";
  char exe[4096];
  ssize_t n = readlink(self.c_str(), exe, sizeof exe - 1);
  std::string crashcapPath = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "crashcap";
  bool tty = isatty(2) && !o.json;
  json experiments = json::array();
  auto test = [&](const std::vector<int64_t>& rows) {
    std::vector<std::string> argv = {crashcapPath, "replay",        path, "--step", std::to_string(base.step),
                                     "--rows",     joinRows(rows), "--json", "--no-instrument"};
    auto child = crashcap::replayer::runChild(argv, o.timeout);
    crashcap::replayer::Trial t;
    t.seconds = child.seconds;
    if (child.timedOut) {
      t.outcome = fmt::format("timeout after {:.0f} s", o.timeout);
      t.fails = false;
    } else if (child.exitCode < 0) {
      t.outcome = fmt::format("child killed by signal {}", -child.exitCode);
      t.fails = true;  // a crash is the failure showing up in another form
    } else if (child.exitCode != 0) {
      t.outcome = fmt::format("replay error: {}", child.err.substr(0, 300));
    } else {
      auto j = json::parse(child.out);
      std::string verdict = j["verdict"];
      t.fails = verdict.rfind("reproduced", 0) == 0;
      t.outcome = t.fails ? fmt::format("fails ({})", j["error"].is_string() ? lastLineOf(j["error"]) : verdict)
                          : "passes";
    }
    std::string command = fmt::format("crashcap replay {} --step {} --rows {}", path, base.step, joinRows(rows));
    experiments.push_back({{"rows", rows}, {"fails", t.fails}, {"outcome", t.outcome}, {"seconds", t.seconds},
                           {"command", command}});
    if (tty) std::fprintf(stderr, "  replay %2zu: rows [%s] -> %s (%.1f s)\n", experiments.size(), joinRows(rows).c_str(),
                          t.outcome.c_str(), t.seconds);
    return t;
  };
  auto b = crashcap::replayer::bisectRows(base.batchSize, test);
  int bound = 2 * static_cast<int>(std::ceil(std::log2(std::max<int64_t>(base.batchSize, 2)))) + 2;
  if (o.json) {
    printJson({{"kind", "samples"},
               {"step", base.step},
               {"batch_size", base.batchSize},
               {"reproduced", b.reproduced},
               {"rows", b.rows},
               {"replays", b.replays},
               {"replay_bound_single_row", bound},
               {"experiments", experiments}});
    return kExitOk;
  }
  if (!b.reproduced) {
    std::cout << fmt::format("step {} does not fail when replayed with its whole batch: nothing to bisect\n", base.step);
    return kExitOk;
  }
  std::cout << fmt::format("step {}: the failure needs batch row{} [{}] of {} ({} replays; a single culprit row takes at most {})\n",
                           base.step, b.rows.size() == 1 ? "" : "s", joinRows(b.rows), base.batchSize, b.replays, bound);
  std::cout << fmt::format("rerun: crashcap replay {} --step {} --rows {}\n", path, base.step, joinRows(b.rows));
  return kExitOk;
}
#endif

#ifdef CRASHCAP_HAVE_TORCH
struct TriageCliOptions {
  double timeout = 600;
  bool json = false;
};

/// `crashcap triage`: a fixed plan of experiments, each a crashcap command in a fresh child
/// process with a timeout, and the hypothesis table their outcomes support.
json runTriage(const std::string& path, const TriageCliOptions& o) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string self = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "crashcap";
  bool tty = isatty(2) && !o.json;
  json experiments = json::array();
  auto experiment = [&](const std::string& name, std::vector<std::string> args) -> std::optional<json> {
    std::string command = "crashcap";
    for (const auto& a : args) command += " " + a;
    if (tty) std::fprintf(stderr, "  %-18s %s ...", name.c_str(), command.c_str());
    args.insert(args.begin(), self);
    auto child = crashcap::replayer::runChild(args, o.timeout);
    std::string outcome;
    std::optional<json> result;
    if (child.timedOut) {
      outcome = fmt::format("timeout after {:.0f} s", o.timeout);
    } else if (child.exitCode < 0) {
      outcome = fmt::format("child killed by signal {}", -child.exitCode);
    } else if (child.exitCode != 0) {
      outcome = "failed: " + lastLineOf(child.err);
    } else {
      try {
        result = json::parse(child.out);
        outcome = "ok";
      } catch (const std::exception& e) {
        outcome = std::string("unreadable output: ") + e.what();
      }
    }
    if (tty) std::fprintf(stderr, " %s (%.1f s)\n", outcome.c_str(), child.seconds);
    experiments.push_back({{"name", name}, {"command", command}, {"outcome", outcome}, {"seconds", child.seconds}});
    return result;
  };

  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader);
  auto replay = experiment("reproduce", {"replay", path, "--json"});
  bool reproduced = replay && (*replay)["verdict"].get<std::string>().rfind("reproduced", 0) == 0;
  auto steps = experiment("bisect-steps", {"bisect", "steps", path, "--json"});
  std::optional<json> samples, complement;
  std::vector<int64_t> rows;
  int64_t step = replay ? (*replay)["step"].get<int64_t>() : -1;
  int64_t batchSize = replay ? (*replay)["batch_size"].get<int64_t>() : 0;
  if (reproduced) {
    samples = experiment("bisect-samples", {"bisect", "samples", path, "--json"});
    if (samples && (*samples)["reproduced"] == true) rows = (*samples)["rows"].get<std::vector<int64_t>>();
    std::vector<int64_t> rest;
    for (int64_t r = 0; r < batchSize; ++r)
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rest.push_back(r);
    if (!rows.empty() && !rest.empty())
      complement = experiment("without-rows", {"replay", path, "--step", std::to_string(step), "--rows", joinRows(rest),
                                               "--json", "--no-instrument"});
  }

  auto hypothesis = [](const std::string& id, const std::string& verdict, std::vector<std::string> evidence,
                       const std::string& rerun) {
    return json{{"id", id}, {"verdict", verdict}, {"evidence", evidence}, {"rerun", rerun}};
  };
  json hypotheses = json::array();
  json firstOp = replay ? (*replay)["first_nonfinite_op"] : json(nullptr);

  // invalid-data: the failure needs these rows and goes away without them; what is odd in them.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    bool complementPasses = complement && (*complement)["verdict"].get<std::string>().rfind("reproduced", 0) != 0;
    bool complementFails = complement && !complementPasses;
    if (!reproduced) {
      ev.push_back("the crash does not reproduce on replay, so its data cannot be tested");
    } else if (!rows.empty() && complementPasses) {
      verdict = "confirmed";
      ev.push_back(fmt::format("step {} fails with batch row{} [{}] alone and passes without {} ({} replays)", step,
                               rows.size() == 1 ? "" : "s", joinRows(rows), rows.size() == 1 ? "it" : "them",
                               (*samples)["replays"].get<int>() + 1));
      for (const auto& name : reader->tensors()) {
        if (name.name.rfind(formats::batchTensorName(step, ""), 0) != 0) continue;
        auto t = loadTensor(*reader, name.name);  // once per tensor, not per culprit row
        for (int64_t r : rows) {
          if (t.shape.empty() || t.shape[0] <= r) continue;
          auto row = inspect::applySlice(t, inspect::parseSlice(std::to_string(r)));
          auto st = inspect::computeStats(row);
          if (st.nanCount || st.posInfCount || st.negInfCount)
            ev.push_back(fmt::format("row {} of {} holds {} NaN and {} Inf values", r, name.name, st.nanCount,
                                     st.posInfCount + st.negInfCount));
          else if (st.count > 0 && st.zeroCount == st.count)
            ev.push_back(fmt::format("row {} of {} is all zeros", r, name.name));
          else if (!formats::isFloating(t.dtype) && !formats::isComplex(t.dtype) && row.numel() == 1 && st.max)
            ev.push_back(fmt::format("row {} of {} is {}", r, name.name, static_cast<int64_t>(*st.max)));
        }
      }
      // The number of classes, from the loss op's logits in the op trace.
      for (const auto& op : story["last_ops"])
        if (op["name"].get<std::string>().find("nll_loss") != std::string::npos && !op["inputs"].empty() &&
            op["inputs"][0]["shape"].size() == 2) {
          ev.push_back(fmt::format("the loss sees {} classes (logits {}), so valid labels are 0..{}",
                                   op["inputs"][0]["shape"][1].get<int64_t>(), op["inputs"][0]["shape"].dump(),
                                   op["inputs"][0]["shape"][1].get<int64_t>() - 1));
          break;
        }
    } else if (complementFails) {
      verdict = "refuted";
      ev.push_back(fmt::format("step {} still fails without rows [{}]: no particular sample is needed", step,
                               joinRows(rows)));
    } else {
      ev.push_back("sample bisection did not isolate rows");
    }
    hypotheses.push_back(hypothesis("invalid-data", verdict, ev, fmt::format("crashcap bisect samples {}", path)));
  }
  // loss-numerics: the first non-finite value is made by an op from finite inputs.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    if (!firstOp.is_null()) {
      int64_t bad = 0;
      for (const auto& in : firstOp["inputs"]) bad += in["nan_count"].get<int64_t>() + in["inf_count"].get<int64_t>();
      std::string where = fmt::format("{} ({}, step {})", firstOp["name"].get<std::string>(),
                                      firstOp["phase"].get<std::string>(), step);
      double largest = 0;
      for (const auto& in : firstOp["inputs"]) {
        if (!in["min"].is_null()) largest = std::max(largest, std::abs(in["min"].get<double>()));
        if (!in["max"].is_null()) largest = std::max(largest, std::abs(in["max"].get<double>()));
      }
      if (bad == 0 && largest > 1e15) {
        // Overflow of values that were already running away is divergence, not the loss's
        // arithmetic.
        verdict = "refuted";
        ev.push_back(fmt::format("{} overflows on inputs as large as {:.3g}: the values were already diverging", where,
                                 largest));
      } else if (bad == 0) {
        verdict = "confirmed";
        ev.push_back(fmt::format("{} turns finite inputs into NaN/Inf", where));
        for (const auto& in : firstOp["inputs"])
          if (!in["min"].is_null() && in["min"].get<double>() == 0.0) {
            ev.push_back(fmt::format("an input of {} reaches 0 (a division or log of zero?)", firstOp["name"].get<std::string>()));
            break;
          }
      } else {
        verdict = "refuted";
        ev.push_back(fmt::format("the first non-finite output, of {}, comes from inputs that already hold {} NaN/Inf", where, bad));
      }
    } else if (replay) {
      ev.push_back("no op output went non-finite in the replayed step");
      if (reproduced) verdict = "refuted";
    }
    hypotheses.push_back(hypothesis("loss-numerics", verdict, ev, fmt::format("crashcap replay {}", path)));
  }
  // optimizer-divergence: the weights run away over the steps before the failure.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    if (steps && !(*steps)["steps"].empty()) {
      const auto& ss = (*steps)["steps"];
      auto num = [](const json& v) { return v.is_number() ? v.get<double>() : INFINITY; };
      double w0 = num(ss[0]["weight_norm"]), wMax = w0, lr0 = ss[0]["lr"], lrMax = lr0;
      int64_t lrStep = -1;
      for (const auto& s : ss) {
        if (!s["weight_norm"].is_null()) wMax = std::max(wMax, num(s["weight_norm"]));
        if (s["lr"].get<double>() > lrMax) {
          lrMax = s["lr"];
          if (lrStep < 0) lrStep = s["step"];
        }
      }
      if (wMax > 100 * w0) {
        verdict = "confirmed";
        ev.push_back(fmt::format("the weight norm grows from {:.4g} to {:.4g} over steps {}..{} before step {} fails",
                                 w0, wMax, ss[0]["step"].get<int64_t>(), (*steps)["target"].get<int64_t>() - 1,
                                 (*steps)["target"].get<int64_t>()));
        if (lrStep >= 0)
          ev.push_back(fmt::format("the learning rate jumps from {:.4g} to {:.4g} from step {} on", lr0, lrMax, lrStep));
        if (!(*steps)["first_failing_step"].is_null())
          ev.push_back(fmt::format("first step whose loss, gradients or weights go non-finite: {} ({})",
                                   (*steps)["first_failing_step"].get<int64_t>(), (*steps)["reason"].get<std::string>()));
      } else if (wMax <= 2 * w0) {
        verdict = "refuted";
        ev.push_back(fmt::format("the weight norm stays within {:.4g}..{:.4g} up to the failing step", w0, wMax));
      } else {
        ev.push_back(fmt::format("the weight norm grows {:.1f}x: not conclusive", wMax / w0));
      }
    }
    hypotheses.push_back(hypothesis("optimizer-divergence", verdict, ev, fmt::format("crashcap bisect steps {}", path)));
  }
  {
    auto env = story["env"].value("facts", json::object());
    std::string device = env.value("cuda.available", "false") == "true" ? "a CUDA device" : "the CPU";
    hypotheses.push_back(hypothesis(
        "device-specific", "inconclusive",
        {fmt::format("recorded on {}; replayed on the CPU only: another device was not available to compare", device)},
        fmt::format("crashcap replay {} --device cpu", path)));
    hypotheses.push_back(hypothesis("config-dependent", "inconclusive",
                                    {"config bisection (cudnn, TF32, determinism, threads) is not implemented yet"},
                                    fmt::format("crashcap replay {}", path)));
  }
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    if (replay) {
      std::string v = (*replay)["verdict"];
      if (v == "reproduced-bitwise") {
        verdict = "refuted";
        ev.push_back(fmt::format("replay matched the recording bit for bit over {} steps", (*replay)["steps_replayed"].get<int64_t>()));
      } else if (v == "diverged") {
        verdict = "confirmed";
        ev.push_back(fmt::format("replay departs from the recording at step {}", (*replay)["diverged_at"].dump()));
      } else {
        ev.push_back("replay verdict " + v);
      }
    }
    hypotheses.push_back(hypothesis("nondeterminism", verdict, ev, fmt::format("crashcap replay {}", path)));
  }
  // Rows are a culprit only when the data hypothesis holds (any single row fails a diverged run).
  bool dataConfirmed = hypotheses[0]["verdict"] == "confirmed";
  json culprit = {{"step", step >= 0 ? json(step) : json(nullptr)},
                  {"rows", rows.empty() || !dataConfirmed ? json(nullptr) : json(rows)},
                  {"op", firstOp.is_null() ? json(nullptr) : firstOp["name"]},
                  {"phase", firstOp.is_null() ? json(nullptr) : firstOp["phase"]}};
  return {{"bundle", path},
          {"reproduced", reproduced},
          {"verdict", replay ? (*replay)["verdict"] : json(nullptr)},
          {"step", step >= 0 ? json(step) : json(nullptr)},
          {"replay", replay ? *replay : json(nullptr)},
          {"hypotheses", hypotheses},
          {"culprit", culprit},
          {"experiments", experiments}};
}

int cmdTriage(const std::string& path, const TriageCliOptions& o) {
  json t = runTriage(path, o);
  if (o.json) {
    json out = t;
    out.erase("replay");
    printJson(out);
    return kExitOk;
  }
  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader, {0, 0, false});
  const json& hypotheses = t["hypotheses"];
  const json& culprit = t["culprit"];
  std::cout << fmt::format("triage of {}: crash {} at step {}; replay {}\n\n", path,
                           story["crash"].is_null() ? "(none recorded)" : story["crash"]["kind"].get<std::string>(),
                           t["step"].dump(), t["verdict"].is_null() ? "failed" : t["verdict"].get<std::string>());
  std::cout << fmt::format("  {:<22} {:<13} {}\n", "hypothesis", "verdict", "evidence");
  for (const auto& h : hypotheses) {
    auto ev = h["evidence"];
    std::cout << fmt::format("  {:<22} {:<13} {}\n", h["id"].get<std::string>(), h["verdict"].get<std::string>(),
                             ev.empty() ? "" : ev[0].get<std::string>());
    for (size_t i = 1; i < ev.size(); ++i) std::cout << fmt::format("  {:<22} {:<13} {}\n", "", "", ev[i].get<std::string>());
    std::cout << fmt::format("  {:<22} {:<13} rerun: {}\n", "", "", h["rerun"].get<std::string>());
  }
  std::cout << fmt::format("\nculprit: step {}, rows {}, op {} ({})\n", culprit["step"].dump(), culprit["rows"].dump(),
                           culprit["op"].dump(), culprit["phase"].dump());
  return kExitOk;
}
#endif

#ifdef CRASHCAP_HAVE_TORCH
struct ReportCliOptions {
  std::string out;
  bool noTriage = false;
  double timeout = 600;
};

/// `crashcap report`: a Markdown bug report in the shape engineers already write (summary,
/// environment, steps to reproduce with crashcap commands, expected, actual, logs and stack,
/// the triage table), ready to paste.
int cmdReport(const std::string& path, const ReportCliOptions& o) {
  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader);
  json triage;
  if (!o.noTriage) {
    TriageCliOptions to;
    to.timeout = o.timeout;
    triage = runTriage(path, to);
  }
  const json& crash = story["crash"];
  const json facts = story["env"].value("facts", json::object());
  auto fact = [&](const char* k) { return facts.contains(k) ? facts[k].get<std::string>() : std::string("unknown"); };
  std::string error = crash.is_null() ? std::string("(no crash record)") : lastLineOf(crash["error"].get<std::string>());
  std::string stepText = crash.is_null() || crash["step"].is_null() ? "?" : crash["step"].dump();
  std::string title = error.substr(0, 80);
  std::replace(title.begin(), title.end(), '"', '\'');  // keep the front matter valid YAML
  std::string md;
  md += fmt::format("---\ntitle: \"Training crash at step {}: {}\"\ndate: \"{}\"\ntype: \"bug_report\"\n"
                    "generated_by: \"crashcap {}\"\nbundle: \"{}\"\n---\n\n",
                    stepText, title, crash.is_null() ? "" : crash["time"].get<std::string>(),
                    formats::toolVersion(), path);
  md += "## Summary\n";
  if (crash.is_null()) {
    md += fmt::format("The recording ends without a crash record (state: {}).\n", story["status"].dump());
  } else {
    md += fmt::format("Training fails at step {} in the {} phase with `{}`.", stepText, crash["phase"].get<std::string>(), error);
    if (!triage.is_null()) {
      std::string confirmed;
      for (const auto& h : triage["hypotheses"])
        if (h["verdict"] == "confirmed") confirmed += (confirmed.empty() ? "" : ", ") + h["id"].get<std::string>();
      md += fmt::format(" Replay: **{}**. Triage confirms: **{}**.", triage["verdict"].is_null() ? "failed" : triage["verdict"].get<std::string>(),
                        confirmed.empty() ? "nothing yet" : confirmed);
    }
    md += "\n";
  }
  md += "\n## Environment\n";
  md += fmt::format("- OS: {} ({}), WSL2: {}\n", fact("os.name"), fact("os.kernel"), fact("os.wsl2"));
  md += fmt::format("- CPU: {}\n", fact("cpu.model"));
  md += fmt::format("- LibTorch: {} ({} threads); CUDA available: {}\n", fact("torch.version"), fact("torch.threads"),
                    fact("cuda.available"));
  md += fmt::format("- cuDNN: enabled {}, benchmark {}, deterministic {}; TF32 matmul {}; deterministic algorithms {}\n",
                    fact("cudnn.enabled"), fact("cudnn.benchmark"), fact("cudnn.deterministic"),
                    fact("cuda.matmul.allow_tf32"), fact("torch.deterministic_algorithms"));
  std::string command;
  for (const auto& a : story["env"].value("command_line", json::array())) command += (command.empty() ? "" : " ") + a.get<std::string>();
  md += fmt::format("- Command: `{}`\n", command.empty() ? "unknown" : command);
  if (!story["optimizer"].is_null()) md += fmt::format("- Optimizer: {}\n", story["optimizer"]["kind"].get<std::string>());
  md += "\n## Steps to Reproduce\n";
  md += fmt::format("1. Get the crash bundle `{}` (attached).\n", path);
  md += fmt::format("2. `crashcap inspect {}` (what was recorded, the crash, the last ops)\n", path);
  md += fmt::format("3. `crashcap replay {}` (re-runs step {} from keyframe {}, bit for bit on the CPU)\n", path,
                    stepText, triage.is_null() || triage["replay"].is_null() ? "?" : triage["replay"]["keyframe"].dump());
  md += fmt::format("4. `crashcap triage {}` (the experiments below)\n", path);
  md += "\n## Expected Behavior\nThe step completes with a finite loss and training continues.\n";
  md += "\n## Actual Behavior\n";
  if (!crash.is_null()) {
    md += fmt::format("- Step {} fails ({}, phase {}): `{}`\n", stepText, crash["kind"].get<std::string>(),
                      crash["phase"].get<std::string>(), error);
    if (!crash["signal"].is_null()) md += fmt::format("- The process died by {}.\n", crash["signal_name"].get<std::string>());
  }
  if (!triage.is_null() && !triage["replay"].is_null()) {
    const auto& r = triage["replay"];
    md += fmt::format("- Replay verdict: {} over {} steps.\n", r["verdict"].get<std::string>(), r["steps_replayed"].dump());
    if (!r["first_nonfinite_op"].is_null())
      md += fmt::format("- First op whose output goes non-finite: `{}` ({}).\n", r["first_nonfinite_op"]["name"].get<std::string>(),
                        r["first_nonfinite_op"]["phase"].get<std::string>());
  }
  for (const auto& t : story["crash_tensors"])
    if (t.contains("stats") && !t["stats"].is_null() && t["stats"]["nan_count"].get<uint64_t>() > 0)
      md += fmt::format("- `{}` holds {} NaN (first at {}).\n", t["name"].get<std::string>(), t["stats"]["nan_count"].dump(),
                        t["stats"]["first_nan"].dump());
  md += "\n## Logs / Stack Trace\n```\n";
  if (!crash.is_null()) {
    md += crash["error"].get<std::string>() + "\n";
    size_t shown = 0;
    for (const auto& f : crash["stack"]) {
      if (shown++ >= 15) break;
      md += "  " + f.get<std::string>() + "\n";
    }
  }
  if (!story["last_ops"].empty()) {
    md += "last ops before the crash:\n";
    for (const auto& op : story["last_ops"])
      md += fmt::format("  #{} {} {} (step {})\n", op["index"].dump(), op["phase"].get<std::string>(),
                        op["name"].get<std::string>(), op["step"].dump());
  }
  md += "```\n";
  if (!triage.is_null()) {
    md += "\n## Root Cause Analysis (crashcap triage)\n| hypothesis | verdict | evidence | rerun |\n|---|---|---|---|\n";
    for (const auto& h : triage["hypotheses"]) {
      std::string ev;
      for (const auto& e : h["evidence"]) ev += (ev.empty() ? "" : "; ") + e.get<std::string>();
      for (auto& c : ev)
        if (c == '|') c = '/';
      md += fmt::format("| {} | **{}** | {} | `{}` |\n", h["id"].get<std::string>(), h["verdict"].get<std::string>(), ev,
                        h["rerun"].get<std::string>());
    }
    const auto& c = triage["culprit"];
    md += fmt::format("\nCulprit: step {}, batch rows {}, op {} ({}).\n", c["step"].dump(), c["rows"].dump(), c["op"].dump(),
                      c["phase"].dump());
  }
  if (o.out.empty()) {
    std::cout << md;
  } else {
    std::ofstream f(o.out, std::ios::binary | std::ios::trunc);
    f << md;
    f.close();
    if (!f)
      throw Error(ErrorCode::Io, fmt::format("cannot write {}: {}", o.out, std::strerror(errno)),
                  "check the directory exists and is writable");
    std::cerr << "wrote " << o.out << "\n";
  }
  return kExitOk;
}
#endif

int exitCodeFor(ErrorCode code) {
  return code == ErrorCode::Internal ? kExitInternal : kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "crashcap: a flight recorder for deep-learning training crashes.\n"
      "A bundle (*.ccap) holds the tensors and context of a training run; these commands read,\n"
      "check, repair and build bundles."};
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("crashcap ") + formats::toolVersion());

  ReadOptions ro;
  std::string bundle, out;

  auto* info = app.add_subcommand("info", "Summarize a bundle: identity, state, what was recovered or lost");
  info->add_option("bundle", bundle, "Bundle file (*.ccap)")->required();
  addReadOptions(info, ro);

  auto* ls = app.add_subcommand("ls", "List the tensors in a bundle with dtype, shape and sizes");
  ls->add_option("bundle", bundle, "Bundle file")->required();
  addReadOptions(ls, ro);

  ShowOptions so;
  auto* show = app.add_subcommand("show", "Print a tensor (numpy-like, summarized when large) and its statistics");
  show->add_option("bundle", bundle, "Bundle file")->required();
  show->add_option("name", so.name, "Tensor name, as `crashcap ls` prints it")->required();
  show->add_flag("--stats", so.stats, "Also print min, max, mean, std, NaN/Inf counts and their first positions");
  show->add_option("--slice", so.slice, "numpy-style selection, e.g. '0,:,2:5' or '...,-1'");
  show->add_flag("--full", so.full, "Print every element, never summarize");
  show->add_option("--precision", so.precision, "Digits after the point for floats")->capture_default_str();
  show->footer("Example: crashcap show crash.ccap batch/images --stats --slice '0,0'");
  addReadOptions(show, ro);

  ExportOptions eo;
  auto* exp = app.add_subcommand("export", "Write one tensor as .npy (numpy) or .pt (torch.load)");
  exp->add_option("bundle", bundle, "Bundle file")->required();
  exp->add_option("name", eo.name, "Tensor name")->required();
  exp->add_option("--npy", eo.npy, "Output .npy file (bfloat16 is widened to float32)");
  exp->add_option("--pt", eo.pt, "Output .pt file, loadable with torch.load");
  exp->add_option("--slice", eo.slice, "Export only this numpy-style selection");
  exp->footer("Example: crashcap export crash.ccap batch/images --npy images.npy");
  addReadOptions(exp, ro);

  ImportOptions io;
  auto* imp = app.add_subcommand("import", "Build a bundle from .npy files (to attach tensors to a bug report)");
  imp->add_option("out", io.out, "Bundle to write")->required();
  imp->add_option("tensors", io.items, "NAME=FILE.npy pairs")->required();
  imp->add_option("--note", io.notes, "KEY=TEXT annotations to store with the tensors");
  imp->add_option("--level", io.level, "zstd level 0..19 (0 stores raw)")->capture_default_str()->check(
      CLI::Range(0, 19));
  imp->add_flag("--force", io.force, "Replace OUT if it exists");
  imp->add_flag("--json", io.json, "Print one JSON object instead of text");
  imp->footer("Example: crashcap import bug.ccap batch/images=images.npy batch/labels=labels.npy");

  auto* ver = app.add_subcommand("verify", "Check every checksum and invariant; exit 1 when anything is damaged");
  ver->add_option("bundle", bundle, "Bundle file")->required();
  addReadOptions(ver, ro);

  auto* rec = app.add_subcommand("recover", "Write a sealed copy of everything intact (never touches the input)");
  rec->add_option("bundle", bundle, "Damaged or unsealed bundle")->required();
  rec->add_option("out", out, "Where to write the repaired copy (must not exist)")->required();
  addReadOptions(rec, ro);

  auto* insp = app.add_subcommand("inspect", "The story of a recorded run: steps, keyframes, the crash, last ops, the failing batch");
  insp->add_option("bundle", bundle, "Bundle file (crash-*.ccap)")->required();
  insp->footer("Example: crashcap inspect runs/crash-20261121T233427Z-4242.ccap --json | jq .crash");
  addReadOptions(insp, ro);

  ReplayCliOptions rp;
  auto* replaySub = app.add_subcommand("replay", "Re-run the failing step from a bundle and say whether the crash reproduces");
  replaySub->add_option("bundle", bundle, "Bundle with a step program (crash-*.ccap)")->required();
  replaySub->add_option("--step", rp.step, "Step to reproduce (default: the crash's step)");
  replaySub->add_option("--device", rp.device, "Where to replay (cpu)")->capture_default_str();
  replaySub->add_flag("--json", rp.json, "Print one JSON object instead of text");
  replaySub->add_option("--rows", rp.rows, "Keep only these rows of the step's batch, e.g. 0,3 (an experiment)");
  replaySub->add_flag("--no-instrument", rp.noInstrument, "Skip the per-op NaN/Inf checks (faster)");

  BisectCliOptions bs;
  auto* bisectSub = app.add_subcommand("bisect", "Find what the failure needs: the first failing step (steps), the batch rows (samples)");
  bisectSub->add_option("what", bs.what, "steps | samples")->required()->check(CLI::IsMember({"samples", "steps", "ops", "config"}));
  bisectSub->add_option("bundle", bundle, "Bundle with a step program")->required();
  bisectSub->add_option("--step", bs.step, "Step to bisect (default: the crash's step)");
  bisectSub->add_option("--timeout", bs.timeout, "Seconds per experiment before it is killed")->capture_default_str();
  bisectSub->add_flag("--json", bs.json, "Print one JSON object instead of text");
  bisectSub->footer("steps: replays the retained history from the earliest keyframe; the first step that throws or whose\n"
                    "loss, gradient norm or updated weights go non-finite.\n"
                    "samples: delta debugging over the failing step's batch rows; each experiment is a\n"
                    "`crashcap replay --rows` in a fresh child process, so a crash or hang is a result, not the end.");
  replaySub->footer(
      "Restores the newest keyframe before the step, replays the steps after it with the recorded batches,\n"
      "generator states and learning rates, compares each step's loss and gradient norm with the recording\n"
      "bit for bit, and checks every op of the target step for NaN/Inf outputs.\n"
      "Verdicts: reproduced-bitwise, reproduced (same error class, numbers differ), diverged (an earlier step\n"
      "departs from the recording: nondeterminism), not-reproduced.");

#ifdef CRASHCAP_HAVE_TORCH
  TriageCliOptions tr;
#endif
  auto* triageSub = app.add_subcommand("triage", "Run a fixed plan of experiments and print the hypothesis table");
  triageSub->add_option("bundle", bundle, "Bundle with a step program")->required();
#ifdef CRASHCAP_HAVE_TORCH
  triageSub->add_option("--timeout", tr.timeout, "Seconds per experiment before it is killed")->capture_default_str();
  triageSub->add_flag("--json", tr.json, "Print one JSON object instead of text");
#endif
  triageSub->footer("Hypotheses: invalid-data, loss-numerics, optimizer-divergence, device-specific, config-dependent,\n"
                    "nondeterminism; each confirmed, refuted or inconclusive with its evidence and the command that\n"
                    "reruns it. Every experiment runs in a fresh child process with a timeout.");

#ifdef CRASHCAP_HAVE_TORCH
  ReportCliOptions rep;
#endif
  auto* reportSub = app.add_subcommand("report", "A Markdown bug report from a crash bundle, with the triage table, ready to paste");
  reportSub->add_option("bundle", bundle, "Crash bundle")->required();
#ifdef CRASHCAP_HAVE_TORCH
  reportSub->add_option("-o,--out", rep.out, "Write the report to this file (default: stdout)");
  reportSub->add_flag("--no-triage", rep.noTriage, "Skip the experiments (faster; no hypothesis table)");
  reportSub->add_option("--timeout", rep.timeout, "Seconds per triage experiment")->capture_default_str();
#endif

  SealCliOptions sl;
  auto* seal = app.add_subcommand(
      "seal", "Turn a recording left by a killed process (SIGKILL, power loss) into a bundle");
  seal->add_option("dir", sl.dir, "The recorder's directory, or one recording-<time>-<pid> in it")->required();
  seal->add_option("-o,--out", sl.out, "Output bundle (default: DIR/crash-<time>-<pid>.ccap)");
  seal->add_flag("--keep", sl.keep, "Keep the recording directory after sealing");
  seal->add_flag("--json", sl.json, "Print one JSON object instead of text");
  seal->footer("Every intact record that reached the disk is copied; what was cut short is listed.\n"
               "Example: crashcap seal runs/ && crashcap inspect runs/crash-*.ccap");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }

  bool json = ro.json || io.json || sl.json || rp.json || bs.json;
#ifdef CRASHCAP_HAVE_TORCH
  json = json || tr.json;
#endif
  try {
    if (*info) return cmdInfo(bundle, ro);
    if (*ls) return cmdLs(bundle, ro);
    if (*show) return cmdShow(bundle, so, ro);
    if (*exp) return cmdExport(bundle, eo, ro);
    if (*imp) return cmdImport(io);
    if (*ver) return cmdVerify(bundle, ro);
    if (*rec) return cmdRecover(bundle, out, ro);
    if (*insp) return cmdInspect(bundle, ro);
    if (*seal) return cmdSeal(sl);
    if (*reportSub) {
#ifdef CRASHCAP_HAVE_TORCH
      return cmdReport(bundle, rep);
#else
      throw Error(ErrorCode::Unsupported, "this crashcap was built without LibTorch: report needs it (for triage)",
                  "rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
    }
    if (*triageSub) {
#ifdef CRASHCAP_HAVE_TORCH
      return cmdTriage(bundle, tr);
#else
      throw Error(ErrorCode::Unsupported, "this crashcap was built without LibTorch: triage needs it",
                  "rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
    }
    if (*bisectSub) {
#ifdef CRASHCAP_HAVE_TORCH
      return cmdBisect(bundle, bs);
#else
      throw Error(ErrorCode::Unsupported, "this crashcap was built without LibTorch: bisect needs it",
                  "rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
    }
    if (*replaySub) {
#ifdef CRASHCAP_HAVE_TORCH
      return cmdReplay(bundle, rp);
#else
      throw Error(ErrorCode::Unsupported, "this crashcap was built without LibTorch: replay needs it",
                  "rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
    }
  } catch (const Error& e) {
    if (json)
      printJson({{"error",
                  {{"code", errorCodeName(e.code())},
                   {"code_number", int(e.code())},
                   {"message", e.message()},
                   {"context", e.context()},
                   {"hint", e.hint()}}}});
    std::cerr << "crashcap: error: " << e.what() << "\n";
    return exitCodeFor(e.code());
  } catch (const std::bad_alloc&) {
    std::cerr << "crashcap: error: out of memory\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "crashcap: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  return kExitInternal;
}
