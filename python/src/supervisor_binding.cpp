// What `crashcap run` knows, for the Python front end that does its job in one process
// (crashcap.optuna with isolate=False): why a run died, and its line in the run log.
#include "bindings.hpp"
#include "crashcap/supervisor/classify.hpp"
#include "crashcap/supervisor/run_log.hpp"

namespace py = pybind11;

namespace crashcap::python {

void bindSupervisor(py::module_& m) {
  m.def(
      "classify",
      [](int exitCode, int signal, const std::string& out, const std::string& err) {
        auto c = supervisor::classifyExit(exitCode, signal, out, err);
        return py::make_tuple(c.id, c.evidence);
      },
      py::arg("exit_code"), py::arg("signal"), py::arg("stdout"), py::arg("stderr"),
      "(classification, evidence) of a death, as crashcap run classifies it (docs/RUN.md)");
  m.def(
      "append_run_log",
      [](const std::string& dir, std::vector<std::string> command, int64_t startNs, int64_t endNs, int exitCode,
         const std::string& classification, const std::string& evidence, const std::string& bundle,
         std::vector<std::string> params) {
        supervisor::RunLogEntry e;
        e.command = std::move(command);
        e.pid = static_cast<uint32_t>(::getpid());
        e.startNs = startNs;
        e.endNs = endNs;
        e.exitCode = exitCode;
        e.classification = classification;
        e.evidence = evidence;
        e.bundle = bundle;
        e.params = std::move(params);
        py::gil_scoped_release nogil;
        supervisor::appendRunLog(dir, e);
      },
      py::arg("directory"), py::arg("command"), py::arg("start_ns"), py::arg("end_ns"), py::arg("exit_code"),
      py::arg("classification"), py::arg("evidence"), py::arg("bundle"), py::arg("params"),
      "Appends a run's line to <directory>/runs.jsonl, as crashcap run does");
}

}  // namespace crashcap::python
