#pragma once
// The reader limits every bundle fuzz target uses.
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/limits.hpp"

namespace crashcap::fuzz {

/// Limits small enough that the biggest legal allocation is far below the fuzz drivers'
/// allocation cap.
inline formats::ReaderLimits fuzzLimits() {
  formats::ReaderLimits l;
  l.maxMetaBytes = 1 << 20;
  l.maxChunkBytes = 16 << 20;
  l.maxIndexBytes = 16 << 20;
  l.maxTensorBytes = 32 << 20;
  l.maxRecords = 100000;
  return l;
}

/// Runs fn; a crashcap::Error is an accepted outcome for untrusted input.
template <typename Fn>
void expectValueOrError(Fn&& fn) {
  try {
    fn();
  } catch (const crashcap::Error&) {
  }
}

}  // namespace crashcap::fuzz
