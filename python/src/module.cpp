// crashcap._native: the C++ half of the crashcap Python package. The Python half
// (python/crashcap/) is the API; this module hands its tensors and callbacks to the recorder
// and the replayer.
#include "bindings.hpp"

#include <torch/version.h>

#include "crashcap/formats/error.hpp"

PYBIND11_MODULE(_native, m) {
  m.doc() = "crashcap's recorder and replayer for the crashcap Python package (use `import crashcap`)";
  m.attr("version") = CRASHCAP_VERSION;
  m.attr("torch_version") = TORCH_VERSION;  // the LibTorch this module was built against
  // crashcap::Error -> crashcap._native.Error(message) with .code and .hint.
  static pybind11::exception<crashcap::Error> error(m, "Error", PyExc_RuntimeError);
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const crashcap::Error& e) {
      pybind11::object exc = pybind11::reinterpret_borrow<pybind11::object>(error.ptr())(e.message());
      exc.attr("code") = std::string(crashcap::errorCodeName(e.code()));
      exc.attr("hint") = e.hint();
      PyErr_SetObject(error.ptr(), exc.ptr());
    }
  });
  crashcap::python::bindRecorder(m);
  crashcap::python::bindReplay(m);
  crashcap::python::bindSupervisor(m);
}
