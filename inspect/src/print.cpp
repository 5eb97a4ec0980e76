#include "crashcap/inspect/print.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tensor_util.hpp"

// A port of numpy's array2string (numpy/core/arrayprint.py, numpy >= 1.14 behaviour) for
// separator ", " and floatmode "fixed": the output is what
//   np.array2string(a, separator=", ", floatmode="fixed", precision=..., threshold=...,
//                   edgeitems=..., max_line_width=...)
// prints. Formats are chosen from the printed elements only, as numpy does, so a
// summarized tensor of any size costs O(printed elements).

namespace crashcap::inspect {
namespace {

using formats::DType;

// numpy's FloatingFormat in "fixed" mode: every finite value gets exactly `precision`
// fractional digits; scientific notation when the magnitudes span too much.
class FloatFormat {
 public:
  /// `width` is the element's storage width in bytes (2, 4 or 8): numpy divides the largest
  /// by the smallest magnitude in that precision when choosing scientific notation.
  FloatFormat(const std::vector<double>& values, int precision, bool plusSign, int width)
      : precision_(precision), plusSign_(plusSign) {
    double maxAbs = 0, minAbs = INFINITY;
    bool anyFinite = false, anyNonFinite = false, negInf = false;
    for (double v : values) {
      if (!std::isfinite(v)) {
        anyNonFinite = true;
        if (std::isinf(v) && v < 0) negInf = true;
        continue;
      }
      anyFinite = true;
      if (v != 0) {
        maxAbs = std::max(maxAbs, std::fabs(v));
        minAbs = std::min(minAbs, std::fabs(v));
      }
    }
    if (minAbs != INFINITY) {
      bool wideRange;
      if (width == 8) {
        wideRange = maxAbs / minAbs > 1000.0;
      } else {
        float ratio = float(maxAbs) / float(minAbs);
        // A float16 quotient rounds to a multiple of 0.5 near 1000; 1000.25 ties to 1000.
        wideRange = width == 2 ? ratio > 1000.25f : ratio > 1000.0f;
      }
      exp_ = maxAbs >= 1e8 || minAbs < 1e-4 || wideRange;
    }

    if (!anyFinite) {
      padLeft_ = padRight_ = 0;
    } else if (exp_) {
      for (double v : values) {
        if (!std::isfinite(v)) continue;
        Parts p = split(v);
        padLeft_ = std::max(padLeft_, int(p.intPart.size()));
        expDigits_ = std::max(expDigits_, int(p.exponent.size()) - 1);
      }
      padRight_ = expDigits_ + 2 + precision_;
    } else {
      for (double v : values) {
        if (!std::isfinite(v)) continue;
        padLeft_ = std::max(padLeft_, int(split(v).intPart.size()));
      }
      padRight_ = precision_;
    }
    if (anyNonFinite) {
      int offset = padRight_ + 1;
      int infLen = 3 + ((plusSign_ || negInf) ? 1 : 0);
      padLeft_ = std::max({padLeft_, 3 - offset, infLen - offset});
    }
  }

  std::string operator()(double v) const {
    if (!std::isfinite(v)) {
      std::string word = std::isnan(v) ? (plusSign_ ? "+nan" : "nan")
                                       : (v < 0 ? "-inf" : plusSign_ ? "+inf" : "inf");
      int width = padLeft_ + padRight_ + 1;
      return std::string(size_t(std::max(0, width - int(word.size()))), ' ') + word;
    }
    Parts p = split(v);
    std::string out(size_t(std::max(0, padLeft_ - int(p.intPart.size()))), ' ');
    out += p.intPart;
    out += '.';
    out += p.fraction;
    if (exp_) {
      // p.exponent is "+05": keep the sign, zero-pad the digits to the common width.
      out += 'e';
      out += p.exponent[0];
      std::string digits = p.exponent.substr(1);
      if (int(digits.size()) < expDigits_) out += std::string(size_t(expDigits_) - digits.size(), '0');
      out += digits;
    }
    return out;
  }

 private:
  struct Parts {
    std::string intPart, fraction, exponent;
  };

  // printf's %f / %e round the exact binary value half-to-even, as numpy's Dragon4 does
  // with unique=False, so the digits agree with numpy's.
  Parts split(double v) const {
    char buf[512];
    std::snprintf(buf, sizeof buf, exp_ ? (plusSign_ ? "%+.*e" : "%.*e") : (plusSign_ ? "%+.*f" : "%.*f"),
                  precision_, v);
    std::string s = buf;
    Parts p;
    std::string mantissa = s;
    if (exp_) {
      size_t e = s.find('e');
      mantissa = s.substr(0, e);
      p.exponent = s.substr(e + 1);
    }
    size_t dot = mantissa.find('.');
    if (dot == std::string::npos) {
      p.intPart = mantissa;   // precision 0: numpy still prints the point ("2.")
    } else {
      p.intPart = mantissa.substr(0, dot);
      p.fraction = mantissa.substr(dot + 1);
    }
    return p;
  }

  int precision_;
  bool plusSign_;
  bool exp_ = false;
  int padLeft_ = 0, padRight_ = 0, expDigits_ = 0;
};

// Per dimension, which indices are printed: all, or the first and last edgeItems.
struct Plan {
  std::vector<int64_t> shape;
  std::vector<bool> summarized;   // dimension d shows "..." between its edges
  int64_t edge = 3;

  int64_t printedCount(size_t d) const { return summarized[d] ? 2 * edge : shape[d]; }
  int64_t printedIndex(size_t d, int64_t k) const {
    return summarized[d] && k >= edge ? shape[d] - 2 * edge + k : k;
  }
};

// Flat indices of the printed elements, in row-major order.
void collectPrinted(const Plan& plan, size_t d, uint64_t base, std::vector<uint64_t>& out) {
  if (d == plan.shape.size()) {
    out.push_back(base);
    return;
  }
  for (int64_t k = 0; k < plan.printedCount(d); ++k)
    collectPrinted(plan, d + 1, base * uint64_t(plan.shape[d]) + uint64_t(plan.printedIndex(d, k)), out);
}

std::vector<std::string> formatWords(const HostTensor& t, const std::vector<uint64_t>& flat, int precision) {
  size_t size = formats::elementSize(t.dtype);
  const uint8_t* p = t.bytes.data();
  std::vector<std::string> words;
  words.reserve(flat.size());
  bool scalar = t.shape.empty();
  switch (t.dtype) {
    case DType::Bool:
      // numpy pads True to the width of False, except in a 0-d array.
      for (uint64_t i : flat) words.push_back(p[i] ? (scalar ? "True" : " True") : "False");
      break;
    case DType::Int8: case DType::Int16: case DType::Int32: case DType::Int64: case DType::UInt8: {
      size_t width = 0;
      for (uint64_t i : flat) {
        words.push_back(std::to_string(detail::loadInt(t.dtype, p + i * size)));
        width = std::max(width, words.back().size());
      }
      for (auto& w : words) w.insert(0, width - w.size(), ' ');
      break;
    }
    case DType::Complex64: case DType::Complex128: {
      std::vector<double> re, im;
      re.reserve(flat.size());
      im.reserve(flat.size());
      for (uint64_t i : flat) {
        re.push_back(detail::loadReal(t.dtype, p + i * size));
        im.push_back(detail::loadImag(t.dtype, p + i * size));
      }
      int width = int(size / 2);
      FloatFormat realFormat(re, precision, false, width), imagFormat(im, precision, true, width);
      for (size_t k = 0; k < flat.size(); ++k) {
        std::string i = imagFormat(im[k]);
        // 'j' goes before any padding on the right, as numpy does.
        size_t end = i.find_last_not_of(' ') + 1;
        i.insert(end, "j");
        words.push_back(realFormat(re[k]) + i);
      }
      break;
    }
    default: {
      std::vector<double> values;
      values.reserve(flat.size());
      for (uint64_t i : flat) values.push_back(detail::loadReal(t.dtype, p + i * size));
      // bfloat16 has no numpy type; it prints like its exact float32 widening.
      int width = t.dtype == DType::Float16 ? 2 : t.dtype == DType::Float64 ? 8 : 4;
      FloatFormat format(values, precision, false, width);
      for (double v : values) words.push_back(format(v));
      break;
    }
  }
  return words;
}

// numpy's _extendLine: wrap before `word` when the line would get too long, unless
// wrapping would not help (the line holds nothing but the indent).
void extendLine(std::string& s, std::string& line, const std::string& word, int width, const std::string& indent) {
  bool wrap = int(line.size() + word.size()) > width && line.size() > indent.size();
  if (wrap) {
    size_t end = line.find_last_not_of(' ');
    s.append(line, 0, end == std::string::npos ? 0 : end + 1);
    s += '\n';
    line = indent;
  }
  line += word;
}

class Layout {
 public:
  Layout(const Plan& plan, const std::vector<std::string>& words) : plan_(plan), words_(words) {}

  // numpy's _formatArray recurser, consuming the words in row-major order.
  std::string recurse(size_t axis, const std::string& indent, int width) {
    size_t axesLeft = plan_.shape.size() - axis;
    if (axesLeft == 0) return words_[next_++];
    std::string nextIndent = indent + ' ';
    int nextWidth = width - 1;
    bool summary = plan_.summarized[axis];
    int64_t leading = summary ? plan_.edge : 0;
    int64_t trailing = summary ? plan_.edge : plan_.shape[axis];
    const std::string sep = ", ";
    std::string s;
    if (axesLeft == 1) {
      int elemWidth = width - 1;   // room for "," or "]"
      std::string line = indent;
      for (int64_t i = 0; i < leading; ++i) {
        extendLine(s, line, recurse(axis + 1, nextIndent, nextWidth), elemWidth, indent);
        line += sep;
      }
      if (summary) {
        extendLine(s, line, "...", elemWidth, indent);
        line += sep;
      }
      for (int64_t i = trailing; i > 1; --i) {
        extendLine(s, line, recurse(axis + 1, nextIndent, nextWidth), elemWidth, indent);
        line += sep;
      }
      extendLine(s, line, recurse(axis + 1, nextIndent, nextWidth), elemWidth, indent);
      s += line;
    } else {
      std::string lineSep = "," + std::string(axesLeft - 1, '\n');
      for (int64_t i = 0; i < leading; ++i) s += indent + recurse(axis + 1, nextIndent, nextWidth) + lineSep;
      if (summary) s += indent + "..." + lineSep;
      for (int64_t i = trailing; i > 1; --i) s += indent + recurse(axis + 1, nextIndent, nextWidth) + lineSep;
      s += indent + recurse(axis + 1, nextIndent, nextWidth);
    }
    return "[" + s.substr(indent.size()) + "]";
  }

 private:
  const Plan& plan_;
  const std::vector<std::string>& words_;
  size_t next_ = 0;
};

}  // namespace

std::string formatTensor(const HostTensor& t, const PrintOptions& options) {
  uint64_t n = detail::requireConsistent(t, "tensor to print");
  if (n == 0) return "[]";
  Plan plan;
  plan.shape = t.shape;
  // numpy prints "[..., x]" for edgeitems=0, which shows nothing useful; keep one edge item.
  plan.edge = std::max(1, options.edgeItems);
  bool summarize = n > options.threshold;
  for (int64_t d : t.shape) plan.summarized.push_back(summarize && d > 2 * plan.edge);
  int precision = std::clamp(options.precision, 0, 100);

  std::vector<uint64_t> flat;
  collectPrinted(plan, 0, 0, flat);
  std::vector<std::string> words = formatWords(t, flat, precision);
  if (t.shape.empty()) return words[0];
  Layout layout(plan, words);
  return layout.recurse(0, " ", options.lineWidth);
}

}  // namespace crashcap::inspect
