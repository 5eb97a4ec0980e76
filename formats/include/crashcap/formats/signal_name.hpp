#pragma once
// The names crash records give fatal signals (CrashData::signalName, SupervisionData::signalName):
// the recorder's crash guard and `crashcap run` both write them.

namespace crashcap::formats {

/// "SIGSEGV" for 11; nullptr for a signal without a name here. Async-signal-safe (the crash
/// guard calls it from its handler).
const char* signalName(int signal);

}  // namespace crashcap::formats
