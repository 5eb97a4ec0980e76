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
    if (c < 0x80) continue;
    // UTF-8: a lead byte with 1-3 continuation bytes, shortest form, no surrogates, <= U+10FFFF.
    size_t extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    uint32_t cp = extra == 3 ? c & 0x07u : extra == 2 ? c & 0x0fu : c & 0x1fu;
    bool ok = extra > 0 && c < 0xf5 && i + extra < name.size();
    for (size_t k = 1; ok && k <= extra; ++k) {
      auto cc = static_cast<unsigned char>(name[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    const uint32_t minimum[] = {0, 0x80, 0x800, 0x10000};
    if (!ok || cp < minimum[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      throw Error(ErrorCode::InvalidArgument, fmt::format("tensor name is not valid UTF-8 at byte {}", i));
    i += extra;
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
