// crashcap._native's replay side: the request of a process started by `crashcap replay`, and
// the DrivenReplay a Python training's own loop drives (python/crashcap/_replay.py), which
// writes the outcome crashcap reads back.
#include <ATen/ATen.h>

#include "bindings.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <tuple>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/replayer/driven_replay.hpp"
#include "crashcap/replayer/program_replay.hpp"

namespace py = pybind11;

namespace crashcap::python {
namespace {

replayer::ReplayRequest requestFrom(const std::string& json) {
  return replayer::replayRequestFromJson(nlohmann::json::parse(json));
}

/// Writes an error outcome for the request; the Python side then ends the process.
bool writeError(const std::string& request, const std::string& code, const std::string& message, const std::string& hint) {
  auto o = replayer::replayOutcomeFromJson(
      nlohmann::json{{"error", {{"code", code}, {"message", message}, {"hint", hint}}}});
  return replayer::writeReplayOutcome(requestFrom(request), o);
}

/// A Python program's loop runs once per process: an ops bisection asks it for one side at a time.
replayer::DrivenReplay::Comparison comparisonOf(const replayer::ReplayRequest& request) {
  if (!request.compare) return {};
  if (request.side == replayer::ComparisonSide::Both)
    throw Error(ErrorCode::Unsupported,
                "an ops bisection of a Python program runs its float64 reference and its replay as two replays, "
                "and this request asks for both at once",
                "replay with the crashcap this package was built with");
  return {request.side, request.referenceOutputs, request.tolerance};
}

/// The replay and the request it answers.
class Session {
 public:
  Session(const std::string& request, const replayer::DrivenReplay::NamedTensors& params,
          const replayer::DrivenReplay::NamedTensors& buffers)
      : request_(requestFrom(request)),
        replay_(request_.bundle, request_.options, params, buffers, comparisonOf(request_)) {}

  replayer::DrivenReplay& replay() { return replay_; }

  /// Concludes the replay and writes its outcome (a verdict, or the error that stopped it).
  bool finishAndWrite() {
    replayer::ReplayOutcome o;
    try {
      if (request_.compare)
        o.comparison = replay_.finishComparison();
      else
        o.replay = replay_.finish();
    } catch (const Error& e) {
      o = {};
      o.error = e;
    } catch (const std::exception& e) {
      o = {};
      o.error = Error(ErrorCode::Internal, std::string("replay in the program failed: ") + e.what());
    }
    return replayer::writeReplayOutcome(request_, o);
  }

 private:
  replayer::ReplayRequest request_;
  replayer::DrivenReplay replay_;
};

}  // namespace

void bindReplay(py::module_& m) {
  m.attr("REPLAY_REQUEST_VARIABLE") = replayer::kReplayRequestVariable;
  // The request as JSON text, or None when this process serves no replay. The variable is
  // removed, so that processes the program starts record as usual.
  m.def("take_replay_request", []() -> py::object {
    auto request = replayer::replayRequestOfThisProcess();
    ::unsetenv(replayer::kReplayRequestVariable);
    if (!request) return py::none();
    return py::str(replayer::toJson(*request).dump());
  });
  m.def("write_replay_error", &writeError, py::arg("request"), py::arg("code"), py::arg("message"), py::arg("hint") = "");
  // One fact of a bundle's environment record ("" when absent), before a replay is set up.
  m.def(
      "bundle_fact",
      [](const std::string& bundle, const std::string& key) {
        auto env = formats::BundleReader::open(bundle)->environment();
        return env ? env->fact(key) : std::string();
      },
      py::arg("bundle"), py::arg("key"));

  py::class_<Session>(m, "DrivenReplay")
      .def(py::init<const std::string&, const replayer::DrivenReplay::NamedTensors&,
                    const replayer::DrivenReplay::NamedTensors&>(),
           py::arg("request"), py::arg("parameters"), py::arg("buffers"))
      .def_property_readonly("target", [](Session& s) { return s.replay().target(); })
      .def_property_readonly("keyframe", [](Session& s) { return s.replay().keyframe(); })
      .def("steps", [](Session& s) { return s.replay().steps(); })
      .def("keyframe_documents", [](Session& s) { return s.replay().keyframeRecord().documents; })
      .def("sources",
           [](Session& s) {
             py::list out;
             for (const auto& f : s.replay().program().sources) out.append(py::make_tuple(f.path, f.sha256, f.bytes));
             return out;
           })
      .def("environment_fact", [](Session& s, const std::string& key) { return s.replay().environmentFact(key); })
      .def("note", [](Session& s, const std::string& text) { s.replay().note(text); })
      .def("read_tensor", [](Session& s, const std::string& name) { return s.replay().readTensor(name); })
      .def("read_text",
           [](Session& s, const std::string& name) {
             at::Tensor t = s.replay().readTensor(name).contiguous();
             return py::bytes(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
           })
      .def("restore_model", [](Session& s) { s.replay().restoreModel(); })
      .def("begin_step",
           [](Session& s, int64_t step) {
             auto st = s.replay().beginStep(step);
             return py::make_tuple(st.batch, st.structure, st.learningRates, st.updateLearningRates, st.generators);
           })
      .def_property_readonly("wants_keyframe", [](Session& s) { return s.replay().wantsKeyframe(); })
      .def(
          "write_keyframe",
          [](Session& s, const replayer::DrivenReplay::NamedTensors& optimizer,
             const std::vector<std::pair<std::string, std::string>>& documents) {
            s.replay().writeKeyframe(optimizer, documents);
          },
          py::arg("optimizer"), py::arg("documents"))
      .def("start_probe", [](Session& s) { s.replay().startProbe(); })
      .def(
          "end_step", [](Session& s, const at::Tensor& loss, bool later) { return s.replay().endStep(loss, later); },
          py::arg("loss"), py::arg("later_backwards") = false)
      .def("later_backward", [](Session& s, const at::Tensor& loss) { return s.replay().laterBackward(loss); })
      .def("step_failed", [](Session& s, const std::string& error) { s.replay().stepFailed(error); })
      .def("batch_to_load",
           [](Session& s) -> py::object {
             auto load = s.replay().batchToLoad();
             if (!load) return py::none();
             return py::make_tuple(load->indices, load->datasetIndices, load->searched);
           })
      .def(
          "batch_loaded",
          [](Session& s, std::string error, const std::vector<std::tuple<int64_t, std::string>>& culprits,
             std::string culpritsBy) {
            auto load = s.replay().batchToLoad();
            if (!load) throw crashcap::Error(crashcap::ErrorCode::Internal, "batch_loaded() without a batch to load");
            load->error = std::move(error);
            for (const auto& [position, text] : culprits) {
              if (position < 0 || position >= static_cast<int64_t>(load->indices.size()))
                throw crashcap::Error(crashcap::ErrorCode::Internal,
                                      fmt::format("batch_loaded(): position {} of a batch of {}", position, load->indices.size()));
              replayer::LoadCulprit c;
              c.position = position;
              c.index = load->indices[static_cast<size_t>(position)];
              c.datasetIndex = load->datasetIndices[static_cast<size_t>(position)];
              c.error = text;
              load->culprits.push_back(std::move(c));
            }
            load->culpritsBy = load->culprits.empty() ? "" : std::move(culpritsBy);
            if (!load->searched && !load->culprits.empty())
              throw crashcap::Error(crashcap::ErrorCode::Internal, "batch_loaded(): culprits of a load that was not to search them");
            s.replay().batchLoaded(std::move(*load));
          },
          py::arg("error"), py::arg("culprits"), py::arg("culprits_by"))
      .def("rows_to_match", [](Session& s) { return s.replay().rowsToMatch(); })
      .def(
          "rows_matched",
          [](Session& s, std::string order, std::vector<int64_t> datasetIndices, std::string why) {
            s.replay().rowsMatched({std::move(order), std::move(datasetIndices), std::move(why)});
          },
          py::arg("order"), py::arg("dataset_indices"), py::arg("why"))
      .def("finish_and_write", [](Session& s) { return s.finishAndWrite(); });
}

}  // namespace crashcap::python
