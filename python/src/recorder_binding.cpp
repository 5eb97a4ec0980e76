// crashcap._native.Recorder: crashcap::recorder::Recorder for a Python training. The Python
// Recorder (python/crashcap/_recorder.py) flattens batches, reads the optimizer's state_dict
// and the Python generators, and hands them here; the C++ recorder does the copying, the
// writing, the op ring, the crash guard and the sealing, as for a C++ training.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <dlfcn.h>

#include "bindings.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/recorder/environment.hpp"
#include "crashcap/recorder/recorder.hpp"
#include "crashcap/recorder/signal_context.hpp"

namespace py = pybind11;
namespace rec = crashcap::recorder;

namespace crashcap::python {
namespace {

/// CPython's dump of one thread's stack, what faulthandler writes on a fatal signal, declared only
/// in its internal headers; nullptr where the interpreter does not export it (Debian's 3.11 does;
/// a build of hidden symbols, as 3.13's may be, does not).
using DumpTraceback = void (*)(int fd, PyThreadState* thread);
DumpTraceback gDumpTraceback = nullptr;

/// The Python stack of the thread a fatal signal hit (none on a thread Python never ran on).
void dumpPythonStack(int fd) {
  if (PyThreadState* thread = PyGILState_GetThisThreadState()) gDumpTraceback(fd, thread);
}

/// One step in flight, as Python holds it: ended by end(loss), finished by finish() when the
/// step's code is done (the next step, or the loop's end).
class Step {
 public:
  explicit Step(rec::StepGuard guard) : guard_(std::move(guard)) {}
  void end(const at::Tensor& loss) {
    if (guard_) guard_->end(loss);
  }
  void finish() { guard_.reset(); }

 private:
  std::optional<rec::StepGuard> guard_;
};

/// Calls a Python callable from the training thread (the GIL is held: beginStep runs in Python's
/// call). A Python exception becomes a C++ one the recorder reports in a warning.
template <typename R, typename... Args>
std::function<R(Args...)> fromPython(py::object fn) {
  if (fn.is_none()) return nullptr;
  // The callable is released with the GIL held, whichever thread drops the last copy.
  auto held = std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* o) {
    py::gil_scoped_acquire gil;
    delete o;
  });
  return [held](Args... args) -> R {
    py::gil_scoped_acquire gil;
    return (*held)(std::forward<Args>(args)...).template cast<R>();
  };
}

rec::Policy policyFrom(const py::dict& o) {
  rec::Policy p;
  auto get = [&](const char* k) -> py::object { return o.contains(k) ? py::object(o[k]) : py::object(py::none()); };
  if (auto every = get("keyframe_every"); !every.is_none()) {
    if (py::isinstance<py::str>(every)) {
      if (every.cast<std::string>() != "auto")
        throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                              "keyframe_every must be a number of steps or \"auto\" (got \"" + every.cast<std::string>() + "\")");
      p.keyframeEvery = rec::Policy::kKeyframeEveryAuto;
    } else {
      p.keyframeEvery = every.cast<int64_t>();
      if (p.keyframeEvery < 1)
        throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                              "keyframe_every must be >= 1, or \"auto\" (got " + std::to_string(p.keyframeEvery) + ")");
    }
  }
  if (!get("keyframe_budget").is_none()) p.keyframeBudget = get("keyframe_budget").cast<double>();
  if (!get("retain_segments").is_none()) p.retainSegments = get("retain_segments").cast<size_t>();
  if (!get("retain_bytes").is_none()) p.retainBytes = get("retain_bytes").cast<uint64_t>();
  if (!get("op_trace_depth").is_none()) p.opTraceDepth = get("op_trace_depth").cast<size_t>();
  if (!get("kernel_trace").is_none()) p.kernelTrace = get("kernel_trace").cast<bool>();
  if (!get("nonfinite").is_none()) {
    auto v = get("nonfinite").cast<std::string>();
    if (v != "raise" && v != "record")
      throw crashcap::Error(crashcap::ErrorCode::InvalidArgument,
                            "nonfinite must be \"raise\" or \"record\" (got \"" + v + "\")");
    p.nonFinite = v == "raise" ? rec::NonFinitePolicy::Raise : rec::NonFinitePolicy::Record;
  }
  if (!get("nonfinite_go_on").is_none()) p.nonFiniteGoOn = get("nonfinite_go_on").cast<std::string>();
  if (!get("check_gradients").is_none()) p.checkGradients = get("check_gradients").cast<bool>();
  if (!get("zstd_level").is_none()) p.zstdLevel = get("zstd_level").cast<int>();
  if (!get("queue_bytes").is_none()) p.queueBytes = get("queue_bytes").cast<uint64_t>();
  if (!get("crash_guard").is_none()) p.crashGuard = get("crash_guard").cast<bool>();
  if (!get("all_environment_variables").is_none()) p.allEnvironmentVariables = get("all_environment_variables").cast<bool>();
  if (!get("quiet").is_none()) p.quiet = get("quiet").cast<bool>();
  return p;
}

py::dict statsOf(const rec::RecorderStats& s) {
  py::dict d;
  d["steps_begun"] = s.stepsBegun;
  d["keyframes"] = s.keyframes;
  d["dropped_records"] = s.droppedRecords;
  d["dropped_bytes"] = s.droppedBytes;
  d["segments_deleted"] = s.segmentsDeleted;
  d["recording_peak_bytes"] = s.recordingPeakBytes;
  d["lost_steps"] = s.lostSteps;
  d["lost_step_count"] = s.lostStepCount;
  d["keyframes_skipped"] = s.keyframesSkipped;
  d["keyframes_written_raw"] = s.keyframesWrittenRaw;
  d["written_through"] = s.writtenThrough;
  d["buffer_pool_bytes"] = s.bufferPoolBytes;
  d["buffer_pool_peak_bytes"] = s.bufferPoolPeakBytes;
  d["keyframe_interval"] = s.keyframeInterval;
  d["auto_keyframe_interval"] = s.autoKeyframeInterval;
  d["keyframe_copy_seconds"] = s.keyframeCopySeconds;
  d["keyframe_write_seconds"] = s.keyframeWriteSeconds;
  d["keyframe_bytes"] = s.keyframeBytes;
  d["step_seconds"] = s.stepSeconds;
  d["degraded"] = s.degraded;
  d["recording"] = s.recording;
  d["warnings"] = s.warnings;
  return d;
}

}  // namespace

void bindRecorder(py::module_& m) {
  // A fatal signal's crash record names the Python line that was running.
  gDumpTraceback = reinterpret_cast<DumpTraceback>(::dlsym(RTLD_DEFAULT, "_Py_DumpTraceback"));
  if (gDumpTraceback) rec::setSignalContextDump(&dumpPythonStack);
  m.attr("python_stack_on_signal") = gDumpTraceback != nullptr;
  // Calls fn(*args), again when a Python signal handler raised into it before it could run (the
  // DataLoader's SIGCHLD handler raises as soon as a worker dies, which can be the moment the
  // training's own error reaches sys.excepthook): a pending handler fires at the first bytecode of
  // a Python function, so only a caller in C can try again. Gives up after three tries.
  m.def("call_despite_signals", [](py::object fn, py::args args) {
    for (int attempt = 0;; ++attempt) {
      try {
        fn(*args);
        return;
      } catch (py::error_already_set&) {
        if (attempt == 2) throw;
      }
    }
  });

  // A DataLoader worker's ATen ops are not the training's: without RecordFunction on its thread
  // they skip the op observer's callback (and the boxing of their arguments it asks for), which
  // otherwise runs for every op of every sample the worker loads.
  m.def("stop_observing_ops_in_this_thread", []() { at::enableRecordFunction(false); });

  // The command line as the environment record keeps it: values that look secret replaced.
  m.def("redact_arguments", &rec::redactArguments, py::arg("args"));

  static py::exception<rec::NonFiniteError> nonFinite(m, "NonFiniteError", PyExc_FloatingPointError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rec::NonFiniteError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(nonFinite.ptr())(std::string(e.what()));
      exc.attr("step") = e.step();
      PyErr_SetObject(nonFinite.ptr(), exc.ptr());
    }
  });

  py::class_<Step>(m, "Step")
      .def("end", &Step::end, py::arg("loss"))
      .def("finish", &Step::finish);

  py::class_<rec::Recorder>(m, "Recorder")
      .def(py::init([](std::string dir, py::dict policy) { return std::make_unique<rec::Recorder>(dir, policyFrom(policy)); }),
           py::arg("directory"), py::arg("policy"))
      .def("set_model", [](rec::Recorder& r, rec::NamedTensors params, rec::NamedTensors buffers) {
        r.setModel(std::move(params), std::move(buffers));
      })
      .def("set_foreign",
           [](rec::Recorder& r, py::list sources, std::string kind, py::list groups, py::object learningRates,
              py::object generators, py::object keyframe, std::vector<std::pair<std::string, std::string>> facts,
              py::object stack, py::object torchScript) {
             rec::ForeignTraining t;
             if (!torchScript.is_none()) t.torchScript = std::string(torchScript.cast<py::bytes>());
             t.stack = fromPython<std::vector<std::string>>(stack);
             t.facts = std::move(facts);
             for (const auto& item : sources) {
               auto s = item.cast<py::tuple>();  // (path, sha256, size, contents: bytes | None)
               formats::SourceFileData d;
               d.path = s[0].cast<std::string>();
               d.sha256 = s[1].cast<std::string>();
               d.bytes = s[2].cast<uint64_t>();
               std::string contents = s[3].is_none() ? std::string() : std::string(s[3].cast<py::bytes>());
               t.sources.emplace_back(std::move(d), std::move(contents));
             }
             t.optimizer.kind = kind;
             for (const auto& item : groups) {
               auto g = item.cast<py::tuple>();  // ([parameter names], {option: float})
               formats::ParamGroupData d;
               d.parameters = g[0].cast<std::vector<std::string>>();
               for (const auto& [k, v] : g[1].cast<py::dict>()) d.options.emplace_back(k.cast<std::string>(), v.cast<double>());
               t.optimizer.groups.push_back(std::move(d));
             }
             t.learningRates = fromPython<std::vector<double>>(learningRates);
             t.generators = fromPython<rec::NamedTensors>(generators);
             auto kf = fromPython<py::tuple, int64_t>(keyframe);
             if (kf)
               t.keyframe = [kf](int64_t step) {
                 rec::ForeignKeyframe out;
                 py::gil_scoped_acquire gil;
                 py::tuple r = kf(step);  // ([(name, tensor)], [(name, json)])
                 out.optimizerState = r[0].cast<rec::NamedTensors>();
                 out.documents = r[1].cast<std::vector<std::pair<std::string, std::string>>>();
                 return out;
               };
             r.setForeign(std::move(t));
           },
           py::arg("sources"), py::arg("kind"), py::arg("groups"), py::arg("learning_rates"), py::arg("generators"),
           py::arg("keyframe"), py::arg("facts"), py::arg("stack"), py::arg("torchscript") = py::none())
      .def("begin_step",
           [](rec::Recorder& r, int64_t step, rec::Batch batch, std::string structure, int64_t rows) {
             return Step(r.beginStep(step, batch, std::move(structure), rows));
           },
           py::arg("step"), py::arg("batch"), py::arg("structure"), py::arg("rows") = -1,
           py::keep_alive<0, 1>())  // a step keeps its Recorder alive
      .def("fail",
           [](rec::Recorder& r, std::string kind, std::string type, std::string error, std::vector<std::string> stack,
              std::string phase, std::vector<int64_t> loadingIndices, std::vector<int64_t> loadingDatasetIndices,
              int32_t otherLoader, rec::Batch otherBatch, std::string otherStructure, int64_t otherRows) {
             rec::Failure f;
             f.loadingIndices = std::move(loadingIndices);
             f.loadingDatasetIndices = std::move(loadingDatasetIndices);
             f.otherLoader = otherLoader;
             f.otherBatch = std::move(otherBatch);
             f.otherStructure = std::move(otherStructure);
             f.otherRows = otherRows;
             f.kind = std::move(kind);
             f.errorType = std::move(type);
             f.error = std::move(error);
             f.stack = std::move(stack);
             f.phase = std::move(phase);
             py::gil_scoped_release nogil;  // sealing waits for the writer thread
             return r.fail(f);
           },
           py::arg("kind"), py::arg("type"), py::arg("error"), py::arg("stack"), py::arg("phase") = "",
           py::arg("loading_indices") = std::vector<int64_t>{}, py::arg("loading_dataset_indices") = std::vector<int64_t>{},
           py::arg("other_loader") = -1, py::arg("other_batch") = rec::Batch{}, py::arg("other_structure") = "",
           py::arg("other_rows") = -1)
      .def(
          "close",
          [](rec::Recorder& r, bool durable) {
            py::gil_scoped_release nogil;
            r.close(durable);
          },
          py::arg("durable") = true)
      .def("set_distributed",
           [](rec::Recorder& r, int32_t rank, int32_t worldSize, int32_t localRank, std::string backend,
              std::string rendezvous, std::string source) {
             crashcap::formats::DistributedData d;
             d.rank = rank;
             d.worldSize = worldSize;
             d.localRank = localRank;
             d.backend = std::move(backend);
             d.rendezvous = std::move(rendezvous);
             d.source = std::move(source);
             r.setDistributed(std::move(d));
           },
           py::arg("rank"), py::arg("world_size"), py::arg("local_rank"), py::arg("backend"), py::arg("rendezvous"),
           py::arg("source"))
      .def("hold_keyframes", &rec::Recorder::holdKeyframes, py::arg("held"))
      .def("warn", &rec::Recorder::warn, py::arg("warning"), py::arg("print") = true)
      .def("stats", [](const rec::Recorder& r) { return statsOf(r.stats()); })
      .def("recording_dir", &rec::Recorder::recordingDir)
      .def("crash_bundle", &rec::Recorder::crashBundle);
}

}  // namespace crashcap::python
