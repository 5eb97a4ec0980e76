#include "crashcap/formats/torch/errors.hpp"

#include <c10/util/Exception.h>

namespace crashcap::formats::torch {

std::string errorMessage(const std::exception& e) {
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

}  // namespace crashcap::formats::torch
