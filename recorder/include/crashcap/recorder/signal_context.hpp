#pragma once
// What a fatal signal's crash record carries besides the native stack: the stack of the
// interpreter the training runs in (a Python training's own lines), written by the thread
// that took the signal. No LibTorch here.

namespace crashcap::recorder {

/// Writes the interpreter's stack of the calling thread as text to `fd`. It runs inside the
/// fatal signal's handler, so it must be async-signal-safe (CPython's faulthandler dump is).
using SignalContextDump = void (*)(int fd);

/// Sets the dump a fatal signal runs before the crash is sealed (nullptr: none). Its text goes
/// into the crash record: frames of the form `File "train.py", line 12 in f` (CPython's) are kept
/// after the native frames, innermost first, and the innermost is named in the error.
void setSignalContextDump(SignalContextDump dump);

/// Called first by the crash guard's handler: a fault inside the dump returns to the handler that
/// ran it, which seals the crash without the interpreter's frames. Does nothing otherwise.
void escapeSignalContextDump();

}  // namespace crashcap::recorder
