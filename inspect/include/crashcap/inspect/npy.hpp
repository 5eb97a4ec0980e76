#pragma once
// NumPy .npy files (format versions 1.0, 2.0, 3.0): export, and import of untrusted files.

#include <cstdint>
#include <string>

#include "crashcap/inspect/host_tensor.hpp"

namespace crashcap::inspect {

/// Writes `t` as a .npy (version 1.0, little-endian, C order). bfloat16 has no numpy dtype
/// and is written as float32 (exact widening); returns true when such a widening happened.
bool writeNpy(const HostTensor& t, const std::string& path);

/// Reads a .npy: dtypes b1, i1, u1, i2, i4, i8, f2, f4, f8, c8, c16 in either byte order
/// (big-endian is swapped), C or Fortran order (Fortran is transposed to C order).
/// Anything else (object arrays, structured dtypes, pickles) is refused with
/// Error{Unsupported} naming the descr; a header or data size that does not fit is
/// Error{Corrupt}; data larger than maxBytes is Error{LimitExceeded}. Never unpickles.
HostTensor readNpy(const std::string& path, uint64_t maxBytes = 16ull << 30);

}  // namespace crashcap::inspect
