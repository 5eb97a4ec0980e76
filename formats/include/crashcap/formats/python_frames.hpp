#pragma once
// The frames of a Python stack in a crash record (`File "train.py", line 12, in f`, with the
// source line after ": " for an exception's): which are the program's own and which are the
// interpreter's libraries'. No LibTorch here.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace crashcap::formats {

/// Whether `frame` is a Python frame (`File "…", line N, in f`).
inline bool isPythonFrame(const std::string& frame) { return frame.rfind("File \"", 0) == 0; }

/// Whether a Python frame is in the interpreter's libraries (the standard library, installed
/// packages: a path through `/lib/python` or `-packages/`, or a module frozen into the interpreter,
/// `<frozen os>`) rather than in the program's code.
inline bool isLibraryFrame(const std::string& frame) {
  const auto end = frame.find('"', 6);
  const std::string path = frame.substr(0, end);
  return path.find("/lib/python") != std::string::npos || path.find("-packages/") != std::string::npos ||
         path.rfind("File \"<frozen ", 0) == 0;
}

/// The innermost Python frame of the program's own code in `stack` (innermost first); nullopt
/// when none.
inline std::optional<std::string> programFrame(const std::vector<std::string>& stack) {
  const auto it = std::find_if(stack.begin(), stack.end(),
                               [](const std::string& f) { return isPythonFrame(f) && !isLibraryFrame(f); });
  if (it == stack.end()) return std::nullopt;
  return *it;
}

}  // namespace crashcap::formats
