#include "crashcap/inspect/stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tensor_util.hpp"

namespace crashcap::inspect {
namespace {

using formats::DType;

// Running (count, mean, M2) over finite values. Values are gathered in blocks of 1024; each
// block gets a two-pass mean and M2 in double (long double when double overflows), and
// blocks are merged in long double with Chan et al.'s pairwise update. That keeps the mean
// and std accurate for billions of elements and free of overflow for any double input, at
// one pass over memory.
class Moments {
 public:
  void add(double x) {
    block_[fill_++] = x;
    if (fill_ == kBlock) flush();
  }

  void finish(TensorStats& s) {
    flush();
    if (n_ == 0) return;
    s.min = min_;
    s.max = max_;
    s.mean = double(mean_);
    s.std = double(std::sqrt(m2_ / n_));
  }

 private:
  static constexpr size_t kBlock = 1024;

  // Two-pass mean and M2 of the block in type T; the correction term removes the rounding
  // of the block mean, and four accumulators break the add-latency chain.
  template <typename T>
  void blockMoments(T& mean, T& m2) const {
    T sum[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= fill_; i += 4)
      for (int j = 0; j < 4; ++j) sum[j] += block_[i + j];
    for (; i < fill_; ++i) sum[0] += block_[i];
    mean = ((sum[0] + sum[1]) + (sum[2] + sum[3])) / T(fill_);
    T sq[4] = {0, 0, 0, 0}, res[4] = {0, 0, 0, 0};
    for (i = 0; i + 4 <= fill_; i += 4)
      for (int j = 0; j < 4; ++j) {
        T d = block_[i + j] - mean;
        sq[j] += d * d;
        res[j] += d;
      }
    for (; i < fill_; ++i) {
      T d = block_[i] - mean;
      sq[0] += d * d;
      res[0] += d;
    }
    T residual = (res[0] + res[1]) + (res[2] + res[3]);
    m2 = (sq[0] + sq[1]) + (sq[2] + sq[3]) - residual * residual / T(fill_);
    if (m2 < 0) m2 = 0;
  }

  void flush() {
    if (fill_ == 0) return;
    for (size_t i = 0; i < fill_; ++i) {
      min_ = std::min(min_, block_[i]);
      max_ = std::max(max_, block_[i]);
    }
    long double k = fill_, blockMean, m2;
    double fastMean, fastM2;
    blockMoments(fastMean, fastM2);
    if (std::isfinite(fastMean) && std::isfinite(fastM2)) {
      blockMean = fastMean;
      m2 = fastM2;
    } else {
      blockMoments(blockMean, m2);   // values near DBL_MAX overflow in double
    }
    long double total = n_ + k, delta = blockMean - mean_;
    mean_ += delta * (k / total);
    m2_ += m2 + delta * delta * (n_ * k / total);
    n_ = total;
    fill_ = 0;
  }

  double block_[kBlock];
  size_t fill_ = 0;
  long double n_ = 0, mean_ = 0, m2_ = 0;
  double min_ = INFINITY, max_ = -INFINITY;
};

struct Scan {
  TensorStats s;
  Moments moments;
  uint64_t firstNan = UINT64_MAX, firstInf = UINT64_MAX;

  // One element of a floating dtype (or a complex magnitude).
  void addFloat(uint64_t i, double x) {
    if (std::isfinite(x)) {
      if (x == 0) ++s.zeroCount;
      moments.add(x);
    } else if (std::isnan(x)) {
      if (s.nanCount++ == 0) firstNan = i;
    } else {
      if (x > 0) ++s.posInfCount; else ++s.negInfCount;
      if (firstInf == UINT64_MAX) firstInf = i;
    }
  }
};

template <typename Load>
void scanReal(Scan& scan, const uint8_t* p, uint64_t n, size_t size, Load load) {
  for (uint64_t i = 0; i < n; ++i, p += size) scan.addFloat(i, load(p));
}

template <typename T>
void scanInt(Scan& scan, const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i, p += sizeof(T)) {
    T v = detail::loadAs<T>(p);
    if (v == 0) ++scan.s.zeroCount;
    scan.moments.add(double(v));
  }
}

template <typename T>
void scanComplex(Scan& scan, const uint8_t* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i, p += 2 * sizeof(T)) {
    double re = detail::loadAs<T>(p), im = detail::loadAs<T>(p + sizeof(T));
    // numpy's isnan is true when either part is NaN; that wins over an infinite other part.
    if (std::isnan(re) || std::isnan(im)) scan.addFloat(i, NAN);
    else scan.addFloat(i, std::hypot(re, im));
  }
}

std::string number(double v) { return fmt::format("{:.6g}", v); }

std::string indexText(const std::vector<int64_t>& index) {
  return fmt::format("[{}]", fmt::join(index, ", "));
}

}  // namespace

TensorStats computeStats(const HostTensor& t) {
  uint64_t n = detail::requireConsistent(t, "stats input");
  Scan scan;
  scan.s.count = n;
  const uint8_t* p = t.bytes.data();
  switch (t.dtype) {
    case DType::Float64: scanReal(scan, p, n, 8, [](const uint8_t* q) { return detail::loadAs<double>(q); }); break;
    case DType::Float32: scanReal(scan, p, n, 4, [](const uint8_t* q) { return double(detail::loadAs<float>(q)); }); break;
    case DType::Float16:
      scanReal(scan, p, n, 2, [](const uint8_t* q) { return double(halfToFloat(detail::loadAs<uint16_t>(q))); });
      break;
    case DType::BFloat16:
      scanReal(scan, p, n, 2, [](const uint8_t* q) { return double(bfloat16ToFloat(detail::loadAs<uint16_t>(q))); });
      break;
    case DType::Int8: scanInt<int8_t>(scan, p, n); break;
    case DType::Int16: scanInt<int16_t>(scan, p, n); break;
    case DType::Int32: scanInt<int32_t>(scan, p, n); break;
    case DType::Int64: scanInt<int64_t>(scan, p, n); break;
    case DType::UInt8: scanInt<uint8_t>(scan, p, n); break;
    case DType::Bool:
      // Any non-zero byte is True, as in numpy.
      for (uint64_t i = 0; i < n; ++i) {
        bool v = p[i] != 0;
        if (!v) ++scan.s.zeroCount;
        scan.moments.add(v ? 1.0 : 0.0);
      }
      break;
    case DType::Complex64: scanComplex<float>(scan, p, n); break;
    case DType::Complex128: scanComplex<double>(scan, p, n); break;
  }
  scan.moments.finish(scan.s);
  if (scan.firstNan != UINT64_MAX) scan.s.firstNan = unravelIndex(scan.firstNan, t.shape);
  if (scan.firstInf != UINT64_MAX) scan.s.firstInf = unravelIndex(scan.firstInf, t.shape);
  return scan.s;
}

nlohmann::json statsToJson(const TensorStats& s) {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  auto index = [](const std::optional<std::vector<int64_t>>& v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return nlohmann::json{
      {"count", s.count},
      {"nan_count", s.nanCount},
      {"inf_count", s.posInfCount + s.negInfCount},
      {"pos_inf_count", s.posInfCount},
      {"neg_inf_count", s.negInfCount},
      {"zero_count", s.zeroCount},
      {"min", opt(s.min)},
      {"max", opt(s.max)},
      {"mean", opt(s.mean)},
      {"std", opt(s.std)},
      {"first_nan", index(s.firstNan)},
      {"first_inf", index(s.firstInf)},
  };
}

std::string formatStats(const TensorStats& s) {
  std::string out;
  if (s.min)
    out += fmt::format("min {}  max {}  mean {}  std {}\n", number(*s.min), number(*s.max), number(*s.mean),
                       number(*s.std));
  else
    out += "min -  max -  mean -  std -  (no finite elements)\n";
  out += fmt::format("count {}  zeros {}\n", s.count, s.zeroCount);
  out += fmt::format("NaN {}", s.nanCount);
  if (s.firstNan) out += fmt::format(" (first at {})", indexText(*s.firstNan));
  out += fmt::format("\nInf {}", s.posInfCount + s.negInfCount);
  if (s.posInfCount + s.negInfCount > 0) {
    out += fmt::format(" (+inf {}, -inf {}", s.posInfCount, s.negInfCount);
    if (s.firstInf) out += fmt::format(", first at {}", indexText(*s.firstInf));
    out += ")";
  }
  return out;
}

}  // namespace crashcap::inspect
