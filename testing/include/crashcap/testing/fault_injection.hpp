#pragma once
// The fault-injection hook, for tests only: it makes a chosen op misbehave under a chosen
// condition, so that the branches of bisect and triage that need a GPU, a setting or a
// nondeterministic kernel can be exercised on a CPU-only machine. It is compiled into the
// sample trainings and the replayer and does nothing unless CRASHCAP_FAULT_INJECT is set:
//
//   CRASHCAP_FAULT_INJECT='op=aten::conv2d;step=6;when=cudnn.benchmark=true;mode=nan'
//
//   op=NAME        the op (its RecordFunction name) whose first output is hit (required)
//   step=N         only in step N (the training loop and replay say which step runs)
//   device=D       only when the step runs on device D ("cpu", "cuda:0", ...)
//   when=S=V       only while setting S (a formats/torch/settings.hpp name) reads V; repeatable
//   mode=nan       the output's first element becomes NaN (a kernel computing garbage)
//   mode=perturb   every element of the output moves by one ulp (a nondeterministic kernel)
//   fake_devices=cuda:0[,cuda:1]  replay accepts these devices and runs them on the CPU; the
//                  hook sees the fake name, so `device=` can single one out
//
// The hook hits the first matching call each time a step runs (setFaultStep starts a step).

#include <cstdint>
#include <string>
#include <vector>

namespace crashcap::testing {

struct FaultSpec {
  std::string op;
  int64_t step = -1;
  std::string device;
  std::vector<std::pair<std::string, std::string>> when;
  std::string mode = "nan";
  std::vector<std::string> fakeDevices;
};

/// Parses a spec in the grammar above. Throws crashcap::Error (InvalidArgument).
FaultSpec parseFaultSpec(const std::string& text);

/// Installs the hook from CRASHCAP_FAULT_INJECT (once per process; later calls only return).
/// Returns whether a hook is active. A malformed spec throws: a test must not pass because its
/// fault silently never fired.
bool installFaultInjection();

/// The context the conditions are tested against: the step now running and its device.
void setFaultStep(int64_t step);
void setFaultDevice(const std::string& device);

/// The spec's fake devices (none when no hook is installed).
std::vector<std::string> fakeDevices();
bool isFakeDevice(const std::string& device);

/// The settings the spec's conditions (`when=`) name (none when no hook is installed): the hook
/// reads them on any device, the CPU included.
std::vector<std::string> faultSettings();

/// How many times the hook has hit an op in this process.
int faultHits();

}  // namespace crashcap::testing
