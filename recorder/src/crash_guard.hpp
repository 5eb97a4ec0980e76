#pragma once
// The crash guard: fatal signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL; SIGTERM where the
// program has no handler of its own) and std::terminate hand the failure to the active LiveWriter, which drains and seals within a
// bounded time; then the process dies as it would have (the previous handler runs, or the
// signal is re-raised with it). No LibTorch here.

#include <exception>

#include "crashcap/formats/records.hpp"

namespace crashcap::recorder::detail {

/// Fills error, errorType and stack from an exception (the recorder installs one that knows
/// c10::Error, whose what() carries a C++ backtrace after the message).
using DescribeException = void (*)(const std::exception&, formats::CrashData&);

/// Installs the handlers (idempotent). Handlers act only while a writer is active.
void installCrashGuard(DescribeException describe);
/// Restores the handlers that were there before installCrashGuard.
void uninstallCrashGuard();

/// Describes any exception: std::exception through `describe`, others as "unknown exception".
void describeCurrentException(std::exception_ptr e, formats::CrashData& crash);

/// The stack of the calling thread, innermost first, skipping `skip` frames.
std::vector<std::string> currentStack(int skip);

/// Demangled type name of `e`.
std::string exceptionTypeName(const std::exception& e);

}  // namespace crashcap::recorder::detail
