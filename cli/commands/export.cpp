// crashcap export: one tensor as .npy or .pt, or the kernel and op traces as one Chrome
// Trace Event Format time line.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/chrome_trace.hpp"
#include "crashcap/inspect/host_tensor.hpp"
#include "crashcap/inspect/npy.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/summary.hpp"
#ifdef CRASHCAP_HAVE_TORCH
#include "crashcap/formats/torch/pt_file.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#endif

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle, name, npy, pt, slice, chrome;
  ReadOptions read;
};

/// `export B --chrome OUT.json`: the kernel trace and the op trace as one Trace Event Format file.
int exportChrome(const Options& e) {
  auto reader = formats::BundleReader::open(e.bundle, e.read.limits());
  auto view = formats::readRecords(*reader);
  inspect::ChromeTraceOptions co;
  if (auto info = reader->recordingInfo()) co.opTracePid = info->pid;
  auto trace = inspect::chromeTrace(view, co);
  writeFileAtomically(e.chrome, trace.dump(-1, ' ', false, json::error_handler_t::replace));
  const auto& other = trace["otherData"];
  const size_t events = trace["traceEvents"].size();
  const auto kernels = other["kernels"].get<uint64_t>(), flows = other["flows"].get<uint64_t>();
  const auto gpuUntimed = other["gpu_activities_without_time"].get<uint64_t>();
  const auto kernelsUntimed = other["kernels_without_time"].get<uint64_t>();
  if (e.read.json) {
    printJson({{"output", e.chrome},
               {"events", events},
               {"kernels", kernels},
               {"kernels_without_time", kernelsUntimed},
               {"gpu_activities_without_time", gpuUntimed},
               {"flows", flows},
               {"ops", other["ops"]},
               {"kernel_trace", other["kernel_trace"]}});
    return kExitOk;
  }
  std::cout << fmt::format("wrote {} ({} events: {} kernels, {} flows); load it in https://ui.perfetto.dev or "
                           "chrome://tracing\n",
                           e.chrome, events, kernels, flows);
  if (gpuUntimed > 0)
    std::cerr << fmt::format(
        "note: {} GPU activities ({} kernels) are not on the time line: CUPTI gave them no GPU time, as it "
        "does when the CUDA context faults before it has read their clocks; their launches are on it (category "
        "launch_ring), and `crashcap inspect {} --trace` counts them by kind\n",
        gpuUntimed, kernelsUntimed, e.bundle);
  bool allRecorded = !view.kernelTraces.empty();
  for (const auto& t : view.kernelTraces) allRecorded = allRecorded && t.available();
  if (!allRecorded) std::cerr << "note: kernel trace " << other["kernel_trace"].get<std::string>() << "\n";
  return kExitOk;
}

int exportTensor(const Options& e) {
  if (e.name.empty())
    throw Error(ErrorCode::InvalidArgument, "export needs a tensor name (or --chrome OUT.json for the trace)",
                "`crashcap ls B` lists the tensors; e.g. crashcap export B batch/images --npy images.npy");
  if (e.npy.empty() == e.pt.empty()) throw Error(ErrorCode::InvalidArgument, "give exactly one of --npy FILE or --pt FILE");
  auto reader = formats::BundleReader::open(e.bundle, e.read.limits());
  auto t = inspect::loadTensor(*reader, e.name);
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
  if (e.read.json)
    printJson({{"name", e.name}, {"dtype", formats::dtypeName(t.dtype)}, {"shape", t.shape}, {"output", out}});
  else
    std::cout << fmt::format("wrote {} ({} {}, {})\n", out, formats::dtypeName(t.dtype), formats::formatShape(t.shape),
                             inspect::formatBytes(t.bytes.size()));
  return kExitOk;
}

int exportAny(const Options& e) {
  if (e.chrome.empty()) return exportTensor(e);
  if (!e.name.empty() || !e.npy.empty() || !e.pt.empty() || !e.slice.empty())
    throw Error(ErrorCode::InvalidArgument,
                "--chrome exports the whole trace, not a tensor: it takes no tensor name, --npy, --pt or --slice",
                "run two commands: crashcap export B --chrome trace.json; crashcap export B NAME --npy FILE");
  return exportChrome(e);
}

Command exportCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand(
      "export", "Write one tensor as .npy (numpy) or .pt (torch.load), or the trace as Chrome JSON (Perfetto)");
  cmd->add_option("bundle", o->bundle, "Bundle file")->required();
  cmd->add_option("name", o->name, "Tensor name, as `crashcap ls` prints it (not with --chrome)");
  cmd->add_option("--npy", o->npy, "Output .npy file (bfloat16 is widened to float32)");
  cmd->add_option("--pt", o->pt, "Output .pt file, loadable with torch.load");
  cmd->add_option("--slice", o->slice, "Export only this numpy-style selection");
  cmd->add_option("--chrome", o->chrome,
                  "Output .json: the kernel trace and the ATen ops on one time line (Trace Event Format)");
  cmd->footer("A tensor: exactly one of --npy or --pt.\n"
              "  crashcap export crash.ccap batch/images --npy images.npy\n"
              "The trace: --chrome, no tensor name. Host threads show the ops and the CUDA API calls, each GPU is\n"
              "a process with a row per stream, arrows link each launch to its kernel, and a global marker shows\n"
              "the first CUDA error. Open it in https://ui.perfetto.dev (or chrome://tracing). docs/INSPECT.md.\n"
              "  crashcap export crash.ccap --chrome trace.json");
  addReadOptions(cmd, o->read);
  return {cmd, [o] { return onBundleOrJobArchive(o->bundle, [&] { return exportAny(*o); }, /*membersOnly=*/true); },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(40, crashcap::cli::exportCommand)
