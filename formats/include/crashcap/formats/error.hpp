#pragma once
// crashcap::Error: the one exception type for bad input and bad environment.
// Bugs use CRASHCAP_ASSERT instead. Only `main` maps errors to exit codes.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crashcap {

/// Stable error codes; the numbers are part of the CLI's JSON output and never change.
enum class ErrorCode : int {
  Io = 1,                   ///< the OS refused a read, write, open or sync
  NotABundle = 2,           ///< the file does not start with the bundle magic
  IncompatibleVersion = 3,  ///< made by a crashcap whose format major version we do not read
  Truncated = 4,            ///< the file ends inside a structure
  Corrupt = 5,              ///< a checksum, sync word or invariant does not hold
  LimitExceeded = 6,        ///< a length or count beyond the reader's limits, or a replay past its time limit
  NotFound = 7,             ///< a named tensor, record or file does not exist
  InvalidArgument = 8,      ///< the caller passed something malformed (name, slice, shape)
  Unsupported = 9,          ///< a valid request this build cannot serve (e.g. no LibTorch)
  Internal = 10,            ///< a crashcap bug surfaced as an error
};

/// Short stable name of a code ("corrupt", "not-a-bundle", ...), used in JSON output.
std::string_view errorCodeName(ErrorCode code);

/// An error with a stable code, a message that says what was expected and what was found,
/// an optional hint on how to fix it, and the context added on the way up.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, std::string hint = {});

  ErrorCode code() const noexcept { return code_; }
  /// The innermost message, without context or hint.
  const std::string& message() const noexcept { return message_; }
  const std::string& hint() const noexcept { return hint_; }
  /// Context frames, innermost first ("while reading tensor w chunk 3", "while opening B").
  const std::vector<std::string>& context() const noexcept { return context_; }

  /// Adds a context frame and returns *this, for `catch (Error& e) { throw e.with(...); }`.
  Error& with(std::string frame);

  /// "message (context; context)" plus "\nhint: ..." when there is a hint.
  const char* what() const noexcept override { return full_.c_str(); }

 private:
  void rebuild();
  ErrorCode code_;
  std::string message_;
  std::string hint_;
  std::vector<std::string> context_;
  std::string full_;
};

/// Runs `fn`, adding `frame` to any crashcap::Error it throws.
template <typename Fn>
auto withContext(const std::string& frame, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (Error& e) {
    e.with(frame);
    throw;
  }
}

/// The last non-empty line of an error text, "" for a blank one. Errors raised inside TorchScript
/// carry the interpreter's traceback with the original message last ("Target 7 is out of bounds.").
std::string lastLine(const std::string& text);

[[noreturn]] void assertionFailed(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace crashcap

/// Bug check that prints the expression and the values involved; always on.
#define CRASHCAP_ASSERT(cond, detail)                                                     \
  do {                                                                                    \
    if (!(cond)) ::crashcap::assertionFailed(#cond, __FILE__, __LINE__, (detail));        \
  } while (0)
