#pragma once
// numpy-style basic slicing for `crashcap show --slice`.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/inspect/host_tensor.hpp"

namespace crashcap::inspect {

/// One dimension's selector: an index (drops the dimension), a start:stop:step range, or
/// an ellipsis (expands to ':' for the remaining dimensions).
struct SliceItem {
  enum class Kind { Index, Range, Ellipsis } kind = Kind::Range;
  int64_t index = 0;
  std::optional<int64_t> start, stop;
  int64_t step = 1;   ///< != 0; negative steps allowed as in numpy
};

/// Parses "0", "1:3", "::2", "-1", "...", ":, 0, 2:5", optionally wrapped in [ ].
/// Throws Error{InvalidArgument} naming the bad item and its position.
std::vector<SliceItem> parseSlice(const std::string& text);

/// Applies the slice with numpy semantics (negative indices count from the end, ranges
/// clamp, out-of-range indices are errors naming the dimension and its size).
HostTensor applySlice(const HostTensor& t, const std::vector<SliceItem>& slice);

}  // namespace crashcap::inspect
