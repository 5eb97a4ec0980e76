// crashcap: the command-line entry point. Wiring only: each subcommand parses its options,
// calls the libraries and prints; errors become exit codes here and nowhere else.
//
// Exit codes: 0 ok; 1 a check failed (verify found damage); 2 bad input or usage (missing or
// corrupt file, unknown tensor, bad option); 3 internal error (a crashcap bug).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

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
#include "crashcap/inspect/chrome_trace.hpp"
#include "crashcap/inspect/trace_report.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/recorder/doctor.hpp"
#include "crashcap/recorder/supervisor.hpp"
#include "crashcap/formats/records.hpp"
#include "common.hpp"
#include "investigate.hpp"
#ifdef CRASHCAP_HAVE_TORCH
#include "crashcap/formats/torch/pt_file.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#endif

namespace {

using namespace crashcap;
using namespace crashcap::cli;

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
  std::string name, npy, pt, slice, chrome;
};

/// Writes `text` to `path` through `path.partial` and a rename, so a reader never sees half a file.
void writeFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(ErrorCode::Io, fmt::format("cannot write {} bytes to {}: {}", text.size(), tmp, std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw Error(ErrorCode::Io, fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err)));
  }
}

/// `export B --chrome OUT.json`: the kernel trace and the op trace as one Trace Event Format file.
int cmdExportChrome(const std::string& path, const ExportOptions& e, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits());
  auto view = formats::readRecording(*reader);
  inspect::ChromeTraceOptions co;
  if (auto info = reader->recordingInfo()) co.opTracePid = info->pid;
  auto trace = inspect::chromeTrace(view, co);
  writeFileAtomically(e.chrome, trace.dump(-1, ' ', false, json::error_handler_t::replace));
  const auto& other = trace["otherData"];
  const size_t events = trace["traceEvents"].size();
  const auto kernels = other["kernels"].get<uint64_t>(), flows = other["flows"].get<uint64_t>();
  if (o.json) {
    printJson({{"output", e.chrome},
               {"events", events},
               {"kernels", kernels},
               {"flows", flows},
               {"ops", other["ops"]},
               {"kernel_trace", other["kernel_trace"]}});
    return kExitOk;
  }
  std::cout << fmt::format("wrote {} ({} events: {} kernels, {} flows); load it in https://ui.perfetto.dev or "
                           "chrome://tracing\n",
                           e.chrome, events, kernels, flows);
  bool allRecorded = !view.kernelTraces.empty();
  for (const auto& t : view.kernelTraces) allRecorded = allRecorded && t.available();
  if (!allRecorded) std::cerr << "note: kernel trace " << other["kernel_trace"].get<std::string>() << "\n";
  return kExitOk;
}

int cmdExport(const std::string& path, const ExportOptions& e, const ReadOptions& o) {
  if (!e.chrome.empty()) {
    if (!e.name.empty() || !e.npy.empty() || !e.pt.empty() || !e.slice.empty())
      throw Error(ErrorCode::InvalidArgument,
                  "--chrome exports the whole trace, not a tensor: it takes no tensor name, --npy, --pt or --slice",
                  "run two commands: crashcap export B --chrome trace.json; crashcap export B NAME --npy FILE");
    return cmdExportChrome(path, e, o);
  }
  if (e.name.empty())
    throw Error(ErrorCode::InvalidArgument, "export needs a tensor name (or --chrome OUT.json for the trace)",
                "`crashcap ls B` lists the tensors; e.g. crashcap export B batch/images --npy images.npy");
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

struct InspectCliOptions {
  bool trace = false;
  size_t launches = inspect::TraceReportOptions{}.lastLaunches;
};

int cmdInspect(const std::string& path, const InspectCliOptions& in, const ReadOptions& o) {
  auto reader = formats::BundleReader::open(path, o.limits(), progressPrinter("scanning"));
  endProgress();
  if (in.trace) {
    auto view = formats::readRecording(*reader);
    inspect::TraceReportOptions to;
    to.lastLaunches = in.launches;
    if (o.json) {
      auto j = inspect::traceJson(view, to);
      j["bundle"] = path;
      printJson(j);
      return kExitOk;
    }
    std::cout << inspect::traceText(view, to);
    if (!view.kernelTraces.empty() || view.opTrace)
      std::cout << fmt::format("\nnext          crashcap export {} --chrome trace.json   (a time line for "
                               "https://ui.perfetto.dev)\n",
                               path);
    return kExitOk;
  }
  if (o.json) {
    printJson(inspect::storyJson(*reader));
    return kExitOk;
  }
  std::cout << inspect::storyText(*reader);
  // The story has no room for the GPU side; say that there is one and where to read it.
  for (const auto& t : formats::readRecording(*reader).kernelTraces) {
    // The error that poisoned the context is the failure; a soft one may have come first.
    const auto& e = t.stickyError ? t.stickyError : t.firstError;
    std::string error;
    if (e)
      error = fmt::format("; first {}CUDA error {} in {}", t.stickyError ? "sticky " : "",
                          e->name.empty() ? std::to_string(e->code) : e->name, e->api);
    std::cout << fmt::format("trace      pid {}: {}{}  (crashcap inspect {} --trace)\n", t.pid, t.status, error, path);
  }
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

struct RunCliOptions {
  recorder::SuperviseOptions supervise;
};

/// `crashcap run -- CMD...`: supervise, then one screen per crash saying what happened and
/// what to run next. Exits with the command's status.
int cmdRun(RunCliOptions& r, const std::vector<std::string>& command) {
  auto& o = r.supervise;
  o.command = command;
  o.say = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = recorder::supervise(o);
  std::string cmd;
  for (const auto& a : command) cmd += (cmd.empty() ? "" : " ") + a;
  for (const auto& a : report.attempts) {
    if (a.bundle.empty()) {
      std::cerr << fmt::format("crashcap run: `{}` exited 0 after {:.1f} s (run {})\n", cmd, a.seconds, a.attempt);
      continue;
    }
    std::cerr << fmt::format("\ncrashcap run: `{}` crashed after {:.1f} s (run {}): {}\n", cmd, a.seconds, a.attempt,
                             a.classification.id);
    std::cerr << fmt::format("  evidence  {}\n", a.classification.evidence);
    std::cerr << fmt::format("  ended     {}\n", a.signal ? fmt::format("killed by {}", recorder::signalName(a.signal)
                                                                                    ? recorder::signalName(a.signal)
                                                                                    : std::to_string(a.signal))
                                                            : fmt::format("exit status {}", a.exitCode));
    std::cerr << fmt::format("  trace     {}\n", a.trace);
    std::cerr << fmt::format("  bundle    {}\n", a.bundle);
    for (const auto& b : a.otherBundles) std::cerr << fmt::format("  also      {}\n", b);
    bool hasSteps = false;
    try {
      auto reader = formats::BundleReader::open(a.bundle);
      hasSteps = formats::readRecording(*reader).program.has_value();
    } catch (const Error&) {
    }
    std::cerr << fmt::format("  next      crashcap inspect {}\n", a.bundle);
    if (a.trace.rfind("recorded", 0) == 0) std::cerr << fmt::format("            crashcap inspect {} --trace\n", a.bundle);
    if (hasSteps) std::cerr << fmt::format("            crashcap triage {}\n", a.bundle);
  }
  if (!report.stoppedBecause.empty()) std::cerr << fmt::format("crashcap run: no more restarts: {}\n", report.stoppedBecause);
  return report.exitStatus();
}

/// `crashcap doctor`: the checklist, one line per check; exit 1 when a check fails.
int cmdDoctor(bool asJson) {
  auto checks = recorder::runDoctor();
  int failed = 0;
  json all = json::array();
  for (const auto& c : checks) {
    failed += c.verdict == "fail";
    all.push_back({{"id", c.id}, {"verdict", c.verdict}, {"detail", c.detail}, {"advice", c.advice}});
  }
  if (asJson) {
    printJson({{"checks", all}, {"failed", failed}, {"trace", recorder::traceStatus()}});
  } else {
    for (const auto& c : checks) {
      std::cout << fmt::format("{:<16} {:<5} {}\n", c.id, c.verdict, c.detail);
      if (!c.advice.empty()) std::cout << fmt::format("{:<16} {:<5} -> {}\n", "", "", c.advice);
    }
    std::cout << fmt::format("{:<16} {:<5} {}\n", "kernel-trace", "info", recorder::traceStatus());
  }
  return failed ? kExitCheckFailed : kExitOk;
}

int exitCodeFor(ErrorCode code) {
  return code == ErrorCode::Internal ? kExitInternal : kExitBadInput;
}

}  // namespace

#if !defined(CRASHCAP_HAVE_TORCH) && defined(CRASHCAP_TORCH_HELPER)
/// This `crashcap` starts without LibTorch (loading it takes about a second, which `crashcap run`
/// and the read commands should not pay); the commands that re-execute steps, and .pt export,
/// run in the sibling CRASHCAP_TORCH_HELPER, which has everything.
void forwardToTorchHelper(int argc, char** argv) {
  if (argc < 2) return;
  std::string cmd = argv[1];
  bool needs = cmd == "replay" || cmd == "bisect" || cmd == "triage" || cmd == "report";
  if (cmd == "export")
    for (int i = 2; i < argc; ++i) needs = needs || std::string(argv[i]).rfind("--pt", 0) == 0;
  if (!needs) return;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;
  std::string helper = std::string(self, static_cast<size_t>(n));
  helper = helper.substr(0, helper.rfind('/') + 1) + CRASHCAP_TORCH_HELPER;
  ::execv(helper.c_str(), argv);  // returns only when the helper is missing: the errors below say so
}
#endif

int main(int argc, char** argv) {
#if !defined(CRASHCAP_HAVE_TORCH) && defined(CRASHCAP_TORCH_HELPER)
  forwardToTorchHelper(argc, argv);
#endif
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
  auto* exp = app.add_subcommand(
      "export", "Write one tensor as .npy (numpy) or .pt (torch.load), or the trace as Chrome JSON (Perfetto)");
  exp->add_option("bundle", bundle, "Bundle file")->required();
  exp->add_option("name", eo.name, "Tensor name, as `crashcap ls` prints it (not with --chrome)");
  exp->add_option("--npy", eo.npy, "Output .npy file (bfloat16 is widened to float32)");
  exp->add_option("--pt", eo.pt, "Output .pt file, loadable with torch.load");
  exp->add_option("--slice", eo.slice, "Export only this numpy-style selection");
  exp->add_option("--chrome", eo.chrome,
                  "Output .json: the kernel trace and the ATen ops on one time line (Trace Event Format)");
  exp->footer("A tensor: exactly one of --npy or --pt.\n"
              "  crashcap export crash.ccap batch/images --npy images.npy\n"
              "The trace: --chrome, no tensor name. Host threads show the ops and the CUDA API calls, each GPU is\n"
              "a process with a row per stream, arrows link each launch to its kernel, and a global marker shows\n"
              "the first CUDA error. Open it in https://ui.perfetto.dev (or chrome://tracing). docs/INSPECT.md.\n"
              "  crashcap export crash.ccap --chrome trace.json");
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

  InspectCliOptions ino;
  auto* insp = app.add_subcommand("inspect", "The story of a recorded run: steps, keyframes, the crash, last ops, the failing batch");
  insp->add_option("bundle", bundle, "Bundle file (crash-*.ccap)")->required();
  auto* traceFlag = insp->add_flag(
      "--trace", ino.trace,
      "The kernel trace instead: per traced process the first CUDA error (kernel, op), the last launches, "
      "kernels per op");
  insp->add_option("--launches", ino.launches, "With --trace: how many of the last launches to list")
      ->capture_default_str()
      ->needs(traceFlag);
  insp->footer("Example: crashcap inspect runs/crash-20261121T233427Z-4242.ccap --json | jq .crash\n"
               "         crashcap inspect runs/crash-20261121T233427Z-4242.ccap --trace --launches 50\n"
               "The trace's time line: crashcap export B --chrome trace.json (docs/INSPECT.md).");
  addReadOptions(insp, ro);

  ReplayCliOptions rp;
  auto* replaySub = app.add_subcommand("replay", "Re-run the failing step from a bundle and say whether the crash reproduces");
  replaySub->add_option("bundle", bundle, "Bundle with a step program (crash-*.ccap)")->required();
  replaySub->add_option("--step", rp.step, "Step to reproduce (default: the crash's step)");
  replaySub->add_option("--device", rp.device, "Where to replay: cpu, cuda:K (default: the recorded device when here, else cpu)");
  replaySub->add_option("--dtype", rp.dtype, "float64: replay in double precision (the reference of bisect ops)")
      ->check(CLI::IsMember({"float64"}));
  replaySub->add_option("--set", rp.settings, "SETTING=VALUE instead of the recorded value, e.g. cudnn.benchmark=false (repeatable)");
  replaySub->add_flag("--json", rp.json, "Print one JSON object instead of text");
  replaySub->add_option("--rows", rp.rows, "Keep only these rows of the step's batch, e.g. 0,3 (an experiment)");
  replaySub->add_flag("--no-instrument", rp.noInstrument, "Skip the per-op NaN/Inf checks (faster)");

  BisectCliOptions bs;
  auto* bisectSub = app.add_subcommand(
      "bisect", "Find what the failure needs: the first failing step, op, batch rows, or setting");
  bisectSub->add_option("what", bs.what, "steps | ops | samples | config")->required()->check(CLI::IsMember({"samples", "steps", "ops", "config"}));
  bisectSub->add_option("bundle", bundle, "Bundle with a step program")->required();
  bisectSub->add_option("--step", bs.step, "Step to bisect (default: the crash's step)");
  bisectSub->add_option("--timeout", bs.timeout, "Seconds per experiment before it is killed")->capture_default_str();
  bisectSub->add_option("--tolerance", bs.tolerance, "ops: error allowed against float64, relative to the largest value")
      ->capture_default_str();
  bisectSub->add_flag("--json", bs.json, "Print one JSON object instead of text");
  bisectSub->footer("steps: replays the retained history from the earliest keyframe; the first step that throws or whose\n"
                    "  loss, gradient norm or updated weights go non-finite.\n"
                    "ops: the first op whose output goes non-finite, and the first whose output departs from a float64\n"
                    "  CPU replay of the same step beyond --tolerance.\n"
                    "samples: delta debugging over the failing step's batch rows.\n"
                    "config: the step under the recorded settings, then with each of cudnn.enabled, cudnn.benchmark,\n"
                    "  cudnn.deterministic, cudnn.allow_tf32, cuda.matmul.allow_tf32, torch.deterministic_algorithms,\n"
                    "  torch.autocast, torch.threads flipped, and on each other device here.\n"
                    "Experiments of samples and config are `crashcap replay` child processes with a timeout, so a crash\n"
                    "or hang is a result, not the end.");
  replaySub->footer(
      "Restores the newest keyframe before the step, replays the steps after it with the recorded batches,\n"
      "generator states and learning rates, compares each step's loss and gradient norm with the recording\n"
      "bit for bit, and checks every op of the target step for NaN/Inf outputs.\n"
      "Verdicts: reproduced-bitwise, reproduced (same error class, numbers differ), diverged (an earlier step\n"
      "departs from the recording: nondeterminism), not-reproduced. Bits are compared only in the recorded\n"
      "setup (device, dtype, settings); with --device, --dtype or --set only the failure is compared.\n"
      "Example: crashcap replay crash.ccap --set cudnn.benchmark=false --json");

  TriageCliOptions tr;
  auto* triageSub = app.add_subcommand("triage", "Run a fixed plan of experiments and print the hypothesis table");
  triageSub->add_option("bundle", bundle, "Bundle with a step program")->required();
#ifdef CRASHCAP_HAVE_TORCH
  triageSub->add_option("--timeout", tr.timeout, "Seconds per experiment before it is killed")->capture_default_str();
  triageSub->add_flag("--json", tr.json, "Print one JSON object instead of text");
#endif
  triageSub->footer("Hypotheses: invalid-data, loss-numerics, optimizer-divergence, device-specific, config-dependent,\n"
                    "nondeterminism; each confirmed, refuted or inconclusive with its evidence and the command that\n"
                    "reruns it. Every experiment runs in a fresh child process with a timeout.");

  ReportCliOptions rep;
  auto* reportSub = app.add_subcommand("report", "A Markdown bug report from a crash bundle, with the triage table, ready to paste");
  reportSub->add_option("bundle", bundle, "Crash bundle")->required();
#ifdef CRASHCAP_HAVE_TORCH
  reportSub->add_option("-o,--out", rep.out, "Write the report to this file (default: stdout)");
  reportSub->add_flag("--no-triage", rep.noTriage, "Skip the experiments (faster; no hypothesis table)");
  reportSub->add_option("--timeout", rep.timeout, "Seconds per triage experiment")->capture_default_str();
#endif

  RunCliOptions rn;
  std::vector<std::string> runCommand;
  auto* run = app.add_subcommand("run", "Run a training command under supervision: one crash bundle per crash, classified");
  run->add_option("--dir", rn.supervise.dir, "Where bundles go (also $CRASHCAP_DIR for an in-process recorder)")
      ->capture_default_str();
  run->add_option("--restart", rn.supervise.restarts, "Restart after a crash up to N times (N+1 runs at most)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  run->add_option("--max-consecutive", rn.supervise.maxConsecutive,
                  "Stop restarting after K crashes in a row with the same classification (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--backoff", rn.supervise.backoffSeconds, "Seconds before the first restart; doubles up to 60")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  run->add_option("--grace", rn.supervise.stopGraceSeconds,
                  "After Ctrl-C: seconds until SIGKILL (SIGINT at once, SIGTERM at half)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  run->add_flag("--blocking", rn.supervise.launchBlocking, "CUDA_LAUNCH_BLOCKING=1: CUDA errors surface at the failing launch");
  run->add_flag("--dsa", rn.supervise.deviceSideAssertions,
                "TORCH_USE_CUDA_DSA=1: device-side assertion details (needs a PyTorch built with it)");
  run->add_flag("--cudnn-log", rn.supervise.cudnnLog,
                "cuDNN's own API log (CUDNN_LOGLEVEL_DBG=3) into a pipe; the last 256 KiB go into the bundle, so a "
                "CUDNN_STATUS_EXECUTION_FAILED carries the failing call's descriptors and engine. Slows cuDNN calls");
  bool noTrace = false;
  run->add_flag("--no-trace", noTrace, "Do not inject the kernel tracer (libcrashcap_inject.so via CUDA_INJECTION64_PATH)");
  run->prefix_command();  // without --, the first word that is not an option starts the command
  run->footer("Everything after the options (or after --) is the command. Its output passes through; crashcap's\n"
              "lines go to stderr. Exit status: the command's (128+N when signal N ended it).\n"
              "Classifications: cuda-illegal-instruction, cuda-illegal-address, cuda-device-assert,\n"
              "cudnn-execution-failed, cudnn-error, cuda-oom, cuda-launch-failure, cuda-forked-subprocess,\n"
              "cuda-error, nccl-error, nonfinite-loss, dataloader-worker-died, python-exception, signal,\n"
              "exit-nonzero (docs/RUN.md).\n"
              "Kernel trace: on a machine with a GPU, CUDA loads libcrashcap_inject.so into the command's processes;\n"
              "their kernel launches and first sticky CUDA error go into the bundle (crashcap inspect B --trace).\n"
              "Example: crashcap run --dir runs --restart 3 --max-consecutive 2 -- python train.py --lr 3e-4");

  bool doctorJson = false;
  auto* doctor = app.add_subcommand("doctor", "Check this machine's GPU stack the way the seeds' engineers did by hand");
  doctor->add_flag("--json", doctorJson, "Print one JSON object instead of text");
  doctor->footer("Driver, CUDA runtime, cuDNN, CUPTI, GPU visibility, WSL2, the fork-after-CUDA hazard, CUDA-related\n"
                 "environment variables; each ok, warn, fail or info with advice. Exit 1 when a check fails.");

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
    // `crashcap run [options] -- CMD...`: everything after the first -- is the command, not ours.
    int parsed = argc;
    std::vector<std::string> afterDashes;
    if (argc > 1 && std::string(argv[1]) == "run")
      for (int i = 2; i < argc; ++i)
        if (std::string(argv[i]) == "--") {
          parsed = i;
          afterDashes.assign(argv + i + 1, argv + argc);
          break;
        }
    app.parse(parsed, argv);
    runCommand = afterDashes;
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }

  bool json = ro.json || io.json || sl.json || rp.json || bs.json || tr.json || doctorJson;
  try {
    if (*info) return cmdInfo(bundle, ro);
    if (*ls) return cmdLs(bundle, ro);
    if (*show) return cmdShow(bundle, so, ro);
    if (*exp) return cmdExport(bundle, eo, ro);
    if (*imp) return cmdImport(io);
    if (*ver) return cmdVerify(bundle, ro);
    if (*rec) return cmdRecover(bundle, out, ro);
    if (*insp) return cmdInspect(bundle, ino, ro);
    if (*seal) return cmdSeal(sl);
    if (*doctor) return cmdDoctor(doctorJson);
    if (*run) {
      auto command = runCommand.empty() ? run->remaining() : runCommand;
      rn.supervise.kernelTrace = !noTrace;
      return cmdRun(rn, command);
    }
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
