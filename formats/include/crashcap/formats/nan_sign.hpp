#pragma once
// A NaN's sign bit says nothing about what went wrong, yet printf-style formatting shows it:
// x86 makes its NaNs negative (0 * inf, inf - inf give -nan), Python prints every NaN as "nan".
// Messages that name a non-finite loss or norm print it through withoutNanSign, so one failure
// reads the same from the recorder, the replay and a Python training.

#include <cmath>
#include <limits>

namespace crashcap::formats {

inline double withoutNanSign(double v) { return std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v; }

}  // namespace crashcap::formats
