#pragma once
// Private helpers shared by the meta encoders/decoders: Cap'n Proto messages to bytes and
// back, with untrusted input turned into Error{Corrupt} and every text bounded.

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bundle.capnp.h"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/limits.hpp"
#include "crashcap/formats/tensor_info.hpp"

namespace crashcap::formats::detail {


inline std::vector<uint8_t> toBytes(capnp::MessageBuilder& b) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

/// Decodes a Cap'n Proto message from untrusted bytes and hands its root to `fn`, turning
/// every kj exception into Error{Corrupt}.
template <typename Root, typename Fn>
inline auto withRoot(const uint8_t* data, size_t size, const ReaderLimits& limits, const char* what, Fn&& fn) {
  if (size % sizeof(capnp::word) != 0 || size == 0)
    throw Error(ErrorCode::Corrupt, fmt::format("{} message is {} bytes, not a positive multiple of 8", what, size));
  // Cap'n Proto reads whole words: bytes at an unaligned address (a record inside a larger
  // buffer) are copied into word-aligned memory first; a meta read into its own buffer is not.
  kj::Array<capnp::word> copy;
  kj::ArrayPtr<const capnp::word> words;
  if (reinterpret_cast<uintptr_t>(data) % alignof(capnp::word) == 0) {
    words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(data), size / sizeof(capnp::word));
  } else {
    copy = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
    std::memcpy(copy.begin(), data, size);
    words = copy.asPtr();
  }
  capnp::ReaderOptions options;
  // A well-formed message reads each of its words about once; allow twice that.
  options.traversalLimitInWords = std::min<uint64_t>(limits.capnpTraversalWords, 2 * (size / 8) + 1024);
  options.nestingLimit = limits.capnpNestingLimit;
  try {
    capnp::FlatArrayMessageReader reader(words, options);
    if (reader.getEnd() != words.end())
      throw Error(ErrorCode::Corrupt, fmt::format("{} message has trailing bytes", what));
    return fn(reader.getRoot<Root>());
  } catch (const kj::Exception& e) {
    throw Error(ErrorCode::Corrupt, fmt::format("{} message is malformed: {}", what, e.getDescription().cStr()));
  }
}

inline std::string text(capnp::Text::Reader t, size_t maxBytes, const char* what) {
  if (t.size() > maxBytes)
    throw Error(ErrorCode::Corrupt, fmt::format("{} is {} bytes; at most {} allowed", what, t.size(), maxBytes));
  return std::string(t.cStr(), t.size());
}

inline DType dtypeOf(schema::DType d) {
  auto dt = dtypeFromNumber(static_cast<unsigned>(d));
  if (!dt) throw Error(ErrorCode::Corrupt, fmt::format("unknown dtype number {}", static_cast<unsigned>(d)));
  return *dt;
}

inline std::vector<int64_t> shapeOf(capnp::List<int64_t>::Reader s) {
  if (s.size() > kMaxRank)
    throw Error(ErrorCode::Corrupt, fmt::format("tensor rank {} exceeds the limit of {}", s.size(), kMaxRank));
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (auto v : s) out.push_back(v);
  return out;
}


}  // namespace crashcap::formats::detail
