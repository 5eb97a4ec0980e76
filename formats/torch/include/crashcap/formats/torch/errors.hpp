#pragma once
// The text of an exception as a user should read it. LibTorch's c10::Error appends a C++
// backtrace to what(); its last line differs between any two binaries, so messages are
// compared and shown without it.

#include <exception>
#include <string>

namespace crashcap::formats::torch {

/// what() of `e`, without the C++ backtrace when `e` is a c10::Error.
std::string errorMessage(const std::exception& e);

}  // namespace crashcap::formats::torch
