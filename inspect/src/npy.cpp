#include "crashcap/inspect/npy.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "crashcap/formats/error.hpp"
#include "tensor_util.hpp"

// The .npy format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//   "\x93NUMPY" major minor | header length (u16 LE for 1.0, u32 LE for 2.0/3.0) |
//   header: a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), }
//   padded with spaces and a '\n' so the data starts 64-byte aligned | raw data.
// The reader treats the file as untrusted: the header is parsed by a small strict parser
// for the literal subset numpy writes (never evaluated), every length is bounded before
// anything is allocated, and the data must fill the rest of the file exactly.

namespace crashcap::inspect {
namespace {

using formats::DType;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
/// numpy itself refuses headers over 10000 bytes unless told otherwise; a real header of
/// even a 64-dimensional array is far below this bound.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
/// Nesting depth of the header literal (structured dtypes nest lists of tuples).
constexpr int kMaxLiteralDepth = 16;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "crashcap assumes a little-endian host");

struct DescrRow {
  std::string_view code;   // descr without the byte-order character
  DType dtype;
};
constexpr DescrRow kDescrs[] = {
    {"b1", DType::Bool},      {"i1", DType::Int8},     {"u1", DType::UInt8},      {"i2", DType::Int16},
    {"i4", DType::Int32},     {"i8", DType::Int64},    {"f2", DType::Float16},    {"f4", DType::Float32},
    {"f8", DType::Float64},   {"c8", DType::Complex64}, {"c16", DType::Complex128},
};

const char* const kSupportedList = "b1, i1, u1, i2, i4, i8, f2, f4, f8, c8, c16";

std::string quoted(std::string_view s, size_t max = 80) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max) out += "...";
  return out + "\"";
}

// ---- the header literal ------------------------------------------------------------------

struct Literal {
  enum class Kind { String, Int, Bool, None, Tuple, List, Dict } kind = Kind::None;
  std::string text;               // String: the characters; every kind: its source text
  uint64_t magnitude = 0;         // Int
  bool negative = false;          // Int
  bool flag = false;              // Bool
  std::vector<Literal> items;     // Tuple, List; Dict: key, value, key, value, ...
};

// Parses the subset of Python literals that numpy writes into .npy headers: strings
// without escapes, decimal integers (with Python 2's 'L' suffix), True/False/None,
// tuples, lists and dicts. Anything else is an error naming the offset.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Literal parseHeader() {
    Literal dict = parseValue(0);
    if (dict.kind != Literal::Kind::Dict) fail("expected the header to be a dict literal '{...}'");
    skipSpace();
    if (pos_ != s_.size()) fail("expected only padding after the header dict");
    return dict;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    std::string found = pos_ < s_.size() ? quoted(s_.substr(pos_, 20)) : "the end of the header";
    throw Error(ErrorCode::Corrupt,
                "npy file '" + path_ + "': malformed header at header byte " + std::to_string(pos_) + ": " + what +
                    ", found " + found + " (header: " + quoted(s_, 200) + ")");
  }

  void skipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  bool consume(char c) {
    skipSpace();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Literal parseValue(int depth) {
    if (depth > kMaxLiteralDepth) fail("expected at most " + std::to_string(kMaxLiteralDepth) + " levels of nesting");
    skipSpace();
    if (pos_ >= s_.size()) fail("expected a value");
    size_t begin = pos_;
    Literal v;
    char c = s_[pos_];
    if (c == '\'' || c == '"') {
      v = parseString();
    } else if (c == '(' || c == '[' || c == '{') {
      v = parseSequence(depth);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v = parseInt();
    } else if (s_.substr(pos_, 4) == "True" || s_.substr(pos_, 4) == "None") {
      v.kind = s_[pos_] == 'T' ? Literal::Kind::Bool : Literal::Kind::None;
      v.flag = s_[pos_] == 'T';
      pos_ += 4;
    } else if (s_.substr(pos_, 5) == "False") {
      v.kind = Literal::Kind::Bool;
      pos_ += 5;
    } else {
      fail("expected a string, integer, True, False, None, tuple, list or dict");
    }
    if (v.kind != Literal::Kind::String) v.text = std::string(s_.substr(begin, pos_ - begin));
    return v;
  }

  Literal parseString() {
    char quote = s_[pos_++];
    size_t begin = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      auto ch = static_cast<unsigned char>(s_[pos_]);
      // Bytes >= 0x80 may be UTF-8 field names of a version 3.0 structured dtype, refused later.
      if (ch == '\\' || ch < 0x20 || ch == 0x7f) fail("expected a plain string without escapes");
      ++pos_;
    }
    if (pos_ >= s_.size()) fail("expected a closing quote");
    Literal v;
    v.kind = Literal::Kind::String;
    v.text = std::string(s_.substr(begin, pos_ - begin));
    ++pos_;
    return v;
  }

  Literal parseInt() {
    Literal v;
    v.kind = Literal::Kind::Int;
    if (s_[pos_] == '-') {
      v.negative = true;
      ++pos_;
    }
    size_t digits = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      unsigned d = unsigned(s_[pos_] - '0');
      if (v.magnitude > (std::numeric_limits<uint64_t>::max() - d) / 10) fail("expected an integer below 2^64");
      v.magnitude = v.magnitude * 10 + d;
      ++pos_;
      ++digits;
    }
    if (digits == 0) fail("expected digits");
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;   // Python 2 long, as old numpy wrote shapes
    return v;
  }

  Literal parseSequence(int depth) {
    char open = s_[pos_++];
    char close = open == '(' ? ')' : open == '[' ? ']' : '}';
    Literal v;
    v.kind = open == '(' ? Literal::Kind::Tuple : open == '[' ? Literal::Kind::List : Literal::Kind::Dict;
    bool sawComma = false;
    for (;;) {
      if (consume(close)) break;
      if (!v.items.empty() && !sawComma) fail(std::string("expected ',' or '") + close + "'");
      v.items.push_back(parseValue(depth + 1));
      if (v.kind == Literal::Kind::Dict) {
        if (!consume(':')) fail("expected ':' after a dict key");
        v.items.push_back(parseValue(depth + 1));
      }
      sawComma = consume(',');
    }
    // "(3)" is the integer 3 in Python, not a tuple; numpy always writes "(3,)".
    if (v.kind == Literal::Kind::Tuple && v.items.size() == 1 && !sawComma) {
      --pos_;
      fail("expected a ',' in a one-element tuple");
    }
    return v;
  }

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
};

// ---- file access -------------------------------------------------------------------------

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void ioError(const std::string& what, const std::string& path, int err) {
  throw Error(err == ENOENT ? ErrorCode::NotFound : ErrorCode::Io,
              "cannot " + what + " '" + path + "': " + std::strerror(err));
}

void readExact(std::FILE* f, void* buf, size_t n, const std::string& path) {
  if (n != 0 && std::fread(buf, 1, n, f) != n) {
    if (std::ferror(f)) ioError("read", path, errno);
    // The size was checked against fstat, so the file shrank while we read it.
    throw Error(ErrorCode::Corrupt, "npy file '" + path + "' ended early: it changed while being read");
  }
}

void byteSwap(uint8_t* p, uint64_t count, size_t width) {
  for (uint64_t i = 0; i < count; ++i, p += width) std::reverse(p, p + width);
}

// Fortran (column-major) bytes to C (row-major) order.
std::vector<uint8_t> fortranToC(const std::vector<uint8_t>& src, const std::vector<int64_t>& shape, size_t size) {
  std::vector<uint8_t> dst(src.size());
  const size_t ndim = shape.size();
  std::vector<uint64_t> cStride(ndim, size);
  for (size_t d = ndim; d-- > 1;) cStride[d - 1] = cStride[d] * uint64_t(shape[d]);
  std::vector<int64_t> counter(ndim, 0);
  uint64_t out = 0;
  // Walk the source in its own order (first index fastest) and scatter.
  for (size_t in = 0; in < src.size(); in += size) {
    std::memcpy(dst.data() + out, src.data() + in, size);
    for (size_t d = 0; d < ndim; ++d) {
      if (++counter[d] < shape[d]) {
        out += cStride[d];
        break;
      }
      out -= uint64_t(shape[d] - 1) * cStride[d];
      counter[d] = 0;
    }
  }
  return dst;
}

std::string shapeRepr(const std::vector<int64_t>& shape) {
  // Python's tuple repr, as numpy writes it.
  if (shape.empty()) return "()";
  if (shape.size() == 1) return "(" + std::to_string(shape[0]) + ",)";
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

bool writeNpy(const HostTensor& t, const std::string& path) {
  uint64_t n = detail::requireConsistent(t, "tensor to write as .npy");
  bool widened = t.dtype == DType::BFloat16;
  DType fileType = widened ? DType::Float32 : t.dtype;
  std::string descr;
  for (const auto& row : kDescrs)
    if (row.dtype == fileType) descr = std::string(formats::elementSize(fileType) == 1 ? "|" : "<") + std::string(row.code);
  CRASHCAP_ASSERT(!descr.empty(), "no npy descr for dtype " + std::string(formats::dtypeName(fileType)));

  // The same header numpy's np.save writes, including the spare room it leaves for growing
  // the first axis in place.
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shapeRepr(t.shape) + ", }";
  if (!t.shape.empty()) dict += std::string(21 - std::min<size_t>(21, std::to_string(t.shape[0]).size()), ' ');
  auto pad = [&](size_t lengthField) { return 64 - (kMagicLen + 2 + lengthField + dict.size() + 1) % 64; };
  size_t headerLen = dict.size() + pad(2) + 1;
  int major = 1;
  if (headerLen > 65535) {
    major = 2;
    headerLen = dict.size() + pad(4) + 1;
  }
  std::string prefix(kMagic, kMagicLen);
  prefix += char(major);
  prefix += char(0);
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) prefix += char((headerLen >> (8 * i)) & 0xff);
  std::string header = prefix + dict + std::string(headerLen - dict.size() - 1, ' ') + "\n";

  File f(std::fopen(path.c_str(), "wb"));
  if (!f) ioError("create", path, errno);
  bool ok = std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  if (ok && !widened) {
    ok = t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f.get()) == t.bytes.size();
  } else if (ok) {
    std::vector<float> chunk;
    for (uint64_t i = 0; ok && i < n; i += 65536) {
      uint64_t m = std::min<uint64_t>(65536, n - i);
      chunk.resize(m);
      for (uint64_t k = 0; k < m; ++k) chunk[k] = bfloat16ToFloat(detail::loadAs<uint16_t>(t.bytes.data() + 2 * (i + k)));
      ok = std::fwrite(chunk.data(), sizeof(float), m, f.get()) == m;
    }
  }
  if (!ok) ioError("write", path, errno);
  if (std::fclose(f.release()) != 0) ioError("write", path, errno);
  return widened;
}

HostTensor readNpy(const std::string& path, uint64_t maxBytes) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) ioError("open", path, errno);
  struct stat st;
  if (fstat(fileno(f.get()), &st) != 0) ioError("stat", path, errno);
  if (!S_ISREG(st.st_mode))
    throw Error(ErrorCode::InvalidArgument, "'" + path + "' is not a regular file; expected a .npy file");
  const uint64_t fileSize = uint64_t(st.st_size);
  auto corrupt = [&](const std::string& what) {
    return Error(ErrorCode::Corrupt, "npy file '" + path + "': " + what);
  };

  // Magic, version, header length.
  uint8_t prefix[12] = {};
  size_t got = std::fread(prefix, 1, std::min<uint64_t>(fileSize, sizeof prefix), f.get());
  if (got < std::min<uint64_t>(fileSize, sizeof prefix)) ioError("read", path, errno);
  if (got >= 1 && prefix[0] == 0x80)
    throw Error(ErrorCode::Unsupported,
                "'" + path + "' is a Python pickle, not a .npy file; crashcap never unpickles",
                "in numpy, load it yourself and save the arrays with np.save(path, array)");
  if (got >= 4 && std::memcmp(prefix, "PK\x03\x04", 4) == 0)
    throw Error(ErrorCode::Unsupported, "'" + path + "' is a zip archive (.npz?), not a .npy file",
                "extract the .npy members (unzip) and read them one by one");
  if (got < kMagicLen || std::memcmp(prefix, kMagic, kMagicLen) != 0)
    throw corrupt("expected the magic \\x93NUMPY at byte 0, found " +
                  quoted(std::string_view(reinterpret_cast<const char*>(prefix), std::min<size_t>(got, kMagicLen))));
  if (got < 8) throw corrupt("file is " + std::to_string(fileSize) + " bytes, too short for a .npy version");
  unsigned major = prefix[6], minor = prefix[7];
  if (major < 1 || major > 3 || minor != 0)
    throw Error(ErrorCode::Unsupported,
                "npy file '" + path + "' has format version " + std::to_string(major) + "." + std::to_string(minor) +
                    "; expected 1.0, 2.0 or 3.0");
  const size_t prefixLen = major == 1 ? 10 : 12;
  if (got < prefixLen)
    throw corrupt("file is " + std::to_string(fileSize) + " bytes, too short for a version " + std::to_string(major) +
                  ".0 header (at least " + std::to_string(prefixLen) + ")");
  uint64_t headerLen = 0;
  for (size_t i = 0; i < prefixLen - 8; ++i) headerLen |= uint64_t(prefix[8 + i]) << (8 * i);
  if (headerLen > kMaxHeaderBytes)
    throw Error(ErrorCode::LimitExceeded,
                "npy file '" + path + "' declares a " + std::to_string(headerLen) + "-byte header; the limit is " +
                    std::to_string(kMaxHeaderBytes) + " bytes");
  if (headerLen > fileSize - prefixLen)
    throw corrupt("header of " + std::to_string(headerLen) + " bytes at byte " + std::to_string(prefixLen) +
                  " runs past the end of the " + std::to_string(fileSize) + "-byte file");

  std::string headerText(headerLen, '\0');
  if (std::fseek(f.get(), long(prefixLen), SEEK_SET) != 0) ioError("seek in", path, errno);
  readExact(f.get(), headerText.data(), headerLen, path);
  Literal dict = HeaderParser(headerText, path).parseHeader();

  // Exactly the three keys numpy writes, each once.
  const Literal *descr = nullptr, *fortran = nullptr, *shapeLit = nullptr;
  for (size_t i = 0; i < dict.items.size(); i += 2) {
    const Literal& key = dict.items[i];
    const Literal* value = &dict.items[i + 1];
    if (key.kind != Literal::Kind::String) throw corrupt("header key " + key.text + " is not a string");
    const Literal** slot = key.text == "descr"           ? &descr
                           : key.text == "fortran_order" ? &fortran
                           : key.text == "shape"         ? &shapeLit
                                                         : nullptr;
    if (!slot)
      throw corrupt("unexpected header key " + quoted(key.text) + "; expected only descr, fortran_order and shape");
    if (*slot) throw corrupt("header key " + quoted(key.text) + " appears twice");
    *slot = value;
  }
  if (!descr || !fortran || !shapeLit)
    throw corrupt(std::string("header lacks the key ") + (!descr ? "descr" : !fortran ? "fortran_order" : "shape") +
                  " (header: " + quoted(headerText, 200) + ")");

  // descr: a byte-order character and one of the supported type codes.
  if (descr->kind != Literal::Kind::String)
    throw Error(ErrorCode::Unsupported,
                "npy file '" + path + "' holds a structured dtype (descr " + quoted(descr->text, 120) +
                    "); crashcap reads plain numeric arrays only",
                "save each field as its own array, e.g. np.save(path, a['field'])");
  const std::string& d = descr->text;
  std::optional<DType> dtype;
  if (!d.empty()) {
    std::string_view code = std::string_view(d).substr(1);
    for (const auto& row : kDescrs)
      if (row.code == code) dtype = row.dtype;
  }
  if (!d.empty() && d.find('O') != std::string::npos)
    throw Error(ErrorCode::Unsupported,
                "npy file '" + path + "' holds an object array (descr " + quoted(d) +
                    "), which is a pickle; crashcap never unpickles",
                "convert it to a numeric array in numpy first, e.g. a.astype(np.float32)");
  char order = d.empty() ? '?' : d[0];
  bool bigEndian = order == '>';
  // '|' (byte order not applicable) is only valid for one-byte types.
  bool orderOk = order == '<' || order == '>' || order == '=' ||
                 (order == '|' && dtype && formats::elementSize(*dtype) == 1);
  if (!orderOk) dtype.reset();
  if (!dtype)
    throw Error(ErrorCode::Unsupported,
                "npy file '" + path + "' has dtype descr " + quoted(d) + "; supported are " + kSupportedList +
                    " with byte order '<', '>' (or '|' for one-byte types)",
                "convert it in numpy first, e.g. np.save(path, a.astype(np.float32))");

  if (fortran->kind != Literal::Kind::Bool)
    throw corrupt("fortran_order is " + quoted(fortran->text) + "; expected True or False");
  if (shapeLit->kind != Literal::Kind::Tuple)
    throw corrupt("shape is " + quoted(shapeLit->text) + "; expected a tuple of integers");
  HostTensor t;
  t.dtype = *dtype;
  for (const auto& dim : shapeLit->items) {
    if (dim.kind != Literal::Kind::Int || dim.negative ||
        dim.magnitude > uint64_t(std::numeric_limits<int64_t>::max()))
      throw corrupt("shape " + quoted(shapeLit->text) + " has the dimension " + quoted(dim.text) +
                    "; expected a non-negative integer");
    t.shape.push_back(int64_t(dim.magnitude));
  }

  // Sizes, checked before anything is allocated.
  const size_t size = formats::elementSize(t.dtype);
  uint64_t numel = 1;
  bool overflow = false, zero = false;
  for (int64_t dim : t.shape) {
    if (dim == 0) zero = true;
    else if (numel > std::numeric_limits<uint64_t>::max() / uint64_t(dim)) overflow = true;
    numel *= uint64_t(dim);
  }
  if (zero) numel = 0;   // an overflowing product of the other dimensions is harmless then
  if ((overflow && !zero) || numel > std::numeric_limits<uint64_t>::max() / size)
    throw corrupt("shape " + shapeLit->text + " of " + quoted(d) + " needs more than 2^64 bytes");
  const uint64_t dataBytes = numel * size;
  if (dataBytes > maxBytes)
    throw Error(ErrorCode::LimitExceeded,
                "npy file '" + path + "' holds " + std::to_string(dataBytes) + " bytes of data (shape " +
                    shapeLit->text + " of " + quoted(d) + "); the limit is " + std::to_string(maxBytes) + " bytes",
                "raise the limit (--max-tensor-bytes) if the file is trusted");
  const uint64_t dataOffset = prefixLen + headerLen;
  const uint64_t found = fileSize - dataOffset;
  if (found != dataBytes)
    throw corrupt("shape " + shapeLit->text + " of " + quoted(d) + " needs " + std::to_string(dataBytes) +
                  " bytes of data after the " + std::to_string(dataOffset) + "-byte header, found " +
                  std::to_string(found) + (found < dataBytes ? " (truncated?)" : " (trailing bytes)"));

  t.bytes.resize(dataBytes);
  readExact(f.get(), t.bytes.data(), dataBytes, path);

  if (bigEndian && size > 1) {
    size_t width = formats::isComplex(t.dtype) ? size / 2 : size;   // swap each part of a complex
    byteSwap(t.bytes.data(), dataBytes / width, width);
  }
  if (t.dtype == DType::Bool)
    for (auto& b : t.bytes) b = b != 0;   // numpy reads any non-zero byte as True
  if (fortran->flag && t.shape.size() > 1 && numel > 1) t.bytes = fortranToC(t.bytes, t.shape, size);
  return t;
}

}  // namespace crashcap::inspect
