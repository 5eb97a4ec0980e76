#pragma once
// Kernel symbols made readable: C++ names demangled with abi::__cxa_demangle, safely, for
// untrusted input (a bundle's symbols come from whatever process was traced).

#include <string>
#include <vector>

namespace crashcap::inspect {

/// Each name demangled when it is a mangled C++ name (starts with "_Z" and abi::__cxa_demangle
/// accepts it: libstdc++ refuses names over 1024 characters), else unchanged. Names are
/// untrusted (a few hundred crafted bytes can demangle to gigabytes), so the demangling runs
/// in one forked child with a memory budget; a name it is stuck on for 2 s stays mangled, and
/// after 3 such names the rest do. Nothing is demangled in-process; no fork without a "_Z" name.
/// A demangled form over 64 KiB stays mangled too. Blocks until the child is done; keeps no
/// state between calls.
std::vector<std::string> demangleSymbols(const std::vector<std::string>& names);
/// demangleSymbols for one name.
std::string demangleSymbol(const std::string& name);

}  // namespace crashcap::inspect
