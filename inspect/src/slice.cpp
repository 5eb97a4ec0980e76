#include "crashcap/inspect/slice.hpp"

#include <cctype>
#include <cstring>
#include <limits>

#include "crashcap/formats/error.hpp"
#include "tensor_util.hpp"

namespace crashcap::inspect {
namespace {

const char* const kSliceHint =
    "a slice is numpy basic indexing: comma-separated items, each an index (0, -1), a range "
    "(1:3, ::2, ::-1) or one '...', e.g. \"[:, 0, 2:5]\"";

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

[[noreturn]] void badItem(size_t position, const std::string& item, const std::string& why) {
  throw Error(ErrorCode::InvalidArgument,
              "invalid slice item " + std::to_string(position) + " \"" + item + "\": " + why, kSliceHint);
}

// A decimal integer with an optional sign; `what` names the part for the error.
int64_t parseInteger(const std::string& text, size_t position, const std::string& item, const char* what) {
  std::string s = trim(text);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) negative = s[i++] == '-';
  if (i == s.size()) badItem(position, item, std::string("expected an integer ") + what + ", found \"" + s + "\"");
  uint64_t magnitude = 0;
  const uint64_t limit = negative ? uint64_t(std::numeric_limits<int64_t>::max()) + 1
                                  : uint64_t(std::numeric_limits<int64_t>::max());
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i])))
      badItem(position, item, std::string("expected an integer ") + what + ", found \"" + s + "\"");
    unsigned digit = unsigned(s[i] - '0');
    if (magnitude > (limit - digit) / 10)
      badItem(position, item, std::string("the ") + what + " \"" + s + "\" does not fit in 64 bits");
    magnitude = magnitude * 10 + digit;
  }
  return negative ? int64_t(0 - magnitude) : int64_t(magnitude);
}

// A dimension after the slice is resolved: where it starts, how many, how far apart.
struct Resolved {
  int64_t start = 0, count = 0, step = 1;
  bool keep = true;   // false for an index, which drops the dimension
};

// numpy's PySlice_AdjustIndices.
Resolved resolveRange(const SliceItem& item, int64_t n) {
  Resolved r;
  r.step = item.step;
  int64_t start, stop;
  if (item.step > 0) {
    start = item.start.value_or(0);
    stop = item.stop.value_or(n);
    if (start < 0) start = start < -n ? 0 : start + n;
    if (start > n) start = n;
    if (stop < 0) stop = stop < -n ? 0 : stop + n;
    if (stop > n) stop = n;
    r.count = stop > start ? (stop - start - 1) / item.step + 1 : 0;
  } else {
    start = item.start.value_or(n - 1);
    stop = item.stop ? *item.stop : -1;
    if (item.start && start < 0) start = start < -n ? -1 : start + n;
    if (start >= n) start = n - 1;
    if (item.stop) {
      if (stop < 0) stop = stop < -n ? -1 : stop + n;
      if (stop >= n) stop = n - 1;
    }
    // -step does not fit int64 for INT64_MIN; the distance is computed unsigned.
    uint64_t stride = uint64_t(0) - uint64_t(item.step);
    r.count = start > stop ? int64_t((uint64_t(start - stop) - 1) / stride + 1) : 0;
  }
  r.start = r.count > 0 ? start : 0;
  return r;
}

}  // namespace

std::vector<SliceItem> parseSlice(const std::string& text) {
  std::string s = trim(text);
  if (!s.empty() && s.front() == '[') {
    if (s.back() != ']')
      throw Error(ErrorCode::InvalidArgument, "slice \"" + text + "\" opens with '[' but does not end with ']'",
                  kSliceHint);
    s = trim(s.substr(1, s.size() - 2));
  } else if (!s.empty() && s.back() == ']') {
    throw Error(ErrorCode::InvalidArgument, "slice \"" + text + "\" ends with ']' but does not open with '['",
                kSliceHint);
  }
  std::vector<SliceItem> items;
  if (s.empty()) return items;   // "" and "[]" select everything

  std::vector<std::string> parts;
  size_t begin = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == ',') {
      parts.push_back(trim(s.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  // numpy accepts one trailing comma ("0," is the tuple (0,)).
  if (parts.size() > 1 && parts.back().empty()) parts.pop_back();

  bool sawEllipsis = false;
  for (size_t pos = 0; pos < parts.size(); ++pos) {
    const std::string& p = parts[pos];
    SliceItem item;
    if (p.empty()) badItem(pos, p, "the item is empty (two commas in a row?)");
    if (p == "...") {
      if (sawEllipsis) badItem(pos, p, "a slice may hold only one '...'");
      sawEllipsis = true;
      item.kind = SliceItem::Kind::Ellipsis;
    } else if (p.find(':') != std::string::npos) {
      item.kind = SliceItem::Kind::Range;
      size_t c1 = p.find(':'), c2 = p.find(':', c1 + 1);
      if (c2 != std::string::npos && p.find(':', c2 + 1) != std::string::npos)
        badItem(pos, p, "expected start:stop:step, found more than two ':'");
      std::string a = trim(p.substr(0, c1));
      std::string b = trim(c2 == std::string::npos ? p.substr(c1 + 1) : p.substr(c1 + 1, c2 - c1 - 1));
      std::string c = c2 == std::string::npos ? "" : trim(p.substr(c2 + 1));
      if (!a.empty()) item.start = parseInteger(a, pos, p, "start");
      if (!b.empty()) item.stop = parseInteger(b, pos, p, "stop");
      if (!c.empty()) item.step = parseInteger(c, pos, p, "step");
      if (item.step == 0) badItem(pos, p, "the step must not be zero");
    } else {
      item.kind = SliceItem::Kind::Index;
      item.index = parseInteger(p, pos, p, "index");
    }
    items.push_back(item);
  }
  return items;
}

HostTensor applySlice(const HostTensor& t, const std::vector<SliceItem>& slice) {
  detail::requireConsistent(t, "tensor to slice");
  const size_t ndim = t.shape.size();
  size_t explicitItems = 0;
  bool sawEllipsis = false;
  for (const auto& item : slice) {
    if (item.kind == SliceItem::Kind::Ellipsis) {
      if (sawEllipsis)
        throw Error(ErrorCode::InvalidArgument, "a slice may hold only one '...'", kSliceHint);
      sawEllipsis = true;
    } else {
      ++explicitItems;
    }
  }
  if (explicitItems > ndim)
    throw Error(ErrorCode::InvalidArgument,
                "too many indices: the tensor has " + std::to_string(ndim) + " dimension(s) (shape " +
                    detail::shapeToString(t.shape) + ") but the slice has " + std::to_string(explicitItems) +
                    " item(s) besides '...'",
                kSliceHint);

  // One Resolved per input dimension; '...' and missing trailing items are full ranges.
  std::vector<Resolved> dims;
  dims.reserve(ndim);
  auto fullRange = [&](int64_t n) {
    Resolved r;
    r.count = n;
    return r;
  };
  for (const auto& item : slice) {
    if (item.kind == SliceItem::Kind::Ellipsis) {
      for (size_t k = 0; k < ndim - explicitItems; ++k) dims.push_back(fullRange(t.shape[dims.size()]));
      continue;
    }
    size_t d = dims.size();
    int64_t n = t.shape[d];
    if (item.kind == SliceItem::Kind::Index) {
      int64_t i = item.index;
      if (i < -n || i >= n)
        throw Error(ErrorCode::InvalidArgument,
                    "index " + std::to_string(item.index) + " is out of bounds for dimension " + std::to_string(d) +
                        " with size " + std::to_string(n) + " (shape " + detail::shapeToString(t.shape) + ")",
                    "valid indices for that dimension are " + std::to_string(-n) + " to " + std::to_string(n - 1));
      Resolved r;
      r.start = i < 0 ? i + n : i;
      r.count = 1;
      r.keep = false;
      dims.push_back(r);
    } else {
      if (item.step == 0)
        throw Error(ErrorCode::InvalidArgument,
                    "slice step for dimension " + std::to_string(d) + " is zero", kSliceHint);
      dims.push_back(resolveRange(item, n));
    }
  }
  while (dims.size() < ndim) dims.push_back(fullRange(t.shape[dims.size()]));

  HostTensor out;
  out.dtype = t.dtype;
  uint64_t outNumel = 1;
  for (const auto& r : dims) {
    if (r.keep) out.shape.push_back(r.count);
    outNumel *= uint64_t(r.count);
  }
  const size_t size = formats::elementSize(t.dtype);
  out.bytes.resize(outNumel * size);
  if (outNumel == 0) return out;

  // Byte strides of the source, then an odometer over every dimension but the last; the
  // last one is a memcpy when it is contiguous.
  std::vector<int64_t> stride(ndim, int64_t(size));
  for (size_t d = ndim; d-- > 1;) stride[d - 1] = stride[d] * t.shape[d];
  int64_t base = 0;
  for (size_t d = 0; d < ndim; ++d) base += dims[d].start * stride[d];
  const uint8_t* src = t.bytes.data();
  uint8_t* dst = out.bytes.data();
  if (ndim == 0) {
    std::memcpy(dst, src, size);
    return out;
  }
  const Resolved& last = dims[ndim - 1];
  // With one element the step is never taken (and may be huge, e.g. ::INT64_MIN).
  const int64_t lastStride = last.count > 1 ? last.step * stride[ndim - 1] : 0;
  std::vector<int64_t> counter(ndim - 1, 0);
  int64_t offset = base;
  for (;;) {
    if (last.step == 1) {
      std::memcpy(dst, src + offset, size_t(last.count) * size);
      dst += size_t(last.count) * size;
    } else {
      int64_t o = offset;
      for (int64_t k = 0; k < last.count; ++k, o += lastStride, dst += size) std::memcpy(dst, src + o, size);
    }
    size_t d = ndim - 1;
    while (d > 0) {
      --d;
      if (++counter[d] < dims[d].count) {
        offset += dims[d].step * stride[d];
        break;
      }
      offset -= (dims[d].count - 1) * dims[d].step * stride[d];
      counter[d] = 0;
      if (d == 0) return out;
    }
    if (ndim == 1) return out;
  }
}

}  // namespace crashcap::inspect
