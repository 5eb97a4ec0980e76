#include "crashcap/formats/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace crashcap {

std::string_view errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::Io: return "io";
    case ErrorCode::NotABundle: return "not-a-bundle";
    case ErrorCode::IncompatibleVersion: return "incompatible-version";
    case ErrorCode::Truncated: return "truncated";
    case ErrorCode::Corrupt: return "corrupt";
    case ErrorCode::LimitExceeded: return "limit-exceeded";
    case ErrorCode::NotFound: return "not-found";
    case ErrorCode::InvalidArgument: return "invalid-argument";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::Internal: return "internal";
  }
  return "unknown";
}

Error::Error(ErrorCode code, std::string message, std::string hint)
    : std::runtime_error(message), code_(code), message_(std::move(message)), hint_(std::move(hint)) {
  rebuild();
}

Error& Error::with(std::string frame) {
  context_.push_back(std::move(frame));
  rebuild();
  return *this;
}

void Error::rebuild() {
  full_ = message_;
  if (!context_.empty()) {
    full_ += " (";
    for (size_t i = 0; i < context_.size(); ++i) {
      if (i) full_ += "; ";
      full_ += context_[i];
    }
    full_ += ")";
  }
  if (!hint_.empty()) full_ += "\nhint: " + hint_;
}

std::string lastLine(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  auto start = text.rfind('\n', end);
  size_t from = start == std::string::npos ? 0 : start + 1;
  return text.substr(from, end - from + 1);
}

void assertionFailed(const char* expr, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "crashcap: internal error: assertion `%s` failed at %s:%d: %s\n", expr, file, line,
               detail.c_str());
  throw Error(ErrorCode::Internal, std::string("assertion `") + expr + "` failed at " + file + ":" +
                                       std::to_string(line) + ": " + detail,
              "this is a crashcap bug; please report it with the command that triggered it");
}

}  // namespace crashcap
