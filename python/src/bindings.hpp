#pragma once
// The pieces of crashcap._native, one function per part; module.cpp calls them.
#include <torch/csrc/utils/pybind.h>

namespace crashcap::python {

void bindRecorder(pybind11::module_& m);
void bindReplay(pybind11::module_& m);
void bindSupervisor(pybind11::module_& m);

}  // namespace crashcap::python
