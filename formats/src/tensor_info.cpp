#include "crashcap/formats/tensor_info.hpp"

#include <fmt/format.h>

#include "crashcap/formats/error.hpp"

namespace crashcap::formats {

void validateTensorName(const std::string& name) {
  if (name.empty()) throw Error(ErrorCode::InvalidArgument, "tensor name is empty");
  if (name.size() > kMaxNameBytes)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor name is {} bytes long; the limit is {}", name.size(), kMaxNameBytes));
  for (size_t i = 0; i < name.size(); ++i) {
    auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("tensor name has control character 0x{:02x} at byte {}", c, i),
                  "names are UTF-8 paths like \"batch/images\"");
  }
}

uint64_t tensorByteSize(DType dtype, const std::vector<int64_t>& shape, const std::string& what) {
  if (shape.size() > kMaxRank)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor {} has rank {}; the limit is {}", what, shape.size(), kMaxRank));
  unsigned __int128 total = elementSize(dtype);
  if (total == 0) throw Error(ErrorCode::InvalidArgument, fmt::format("tensor {} has an invalid dtype", what));
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("tensor {} has negative size {} in dimension {}", what, shape[i], i));
    total *= static_cast<uint64_t>(shape[i]);
    if (total > (unsigned __int128)(UINT64_MAX / 2) && shape[i] != 0) {
      // Keep going only if a later zero could bring it back; a zero anywhere makes it empty.
      bool laterZero = false;
      for (size_t j = i + 1; j < shape.size(); ++j) laterZero |= shape[j] == 0;
      if (!laterZero)
        throw Error(ErrorCode::InvalidArgument,
                    fmt::format("tensor {} of shape {} has more than 2^63 bytes", what, formatShape(shape)));
      return 0;
    }
  }
  return static_cast<uint64_t>(total);
}

std::string formatShape(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace crashcap::formats
