// The sample models, their data and their faults. See models.hpp.
#include "models.hpp"

#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <utility>

namespace crashcap::samples {
namespace {

using torch::jit::Module;

constexpr double kPi = 3.14159265358979323846;

// ---------------------------------------------------------------------------------------------
// Randomness

/// A local random source. std::mt19937_64's output sequence is fixed by the C++ standard and the
/// transforms below are ours, so models and batches depend neither on LibTorch's RNG internals
/// nor on the CPU (at::randn takes a vectorized path on AVX2 machines and a scalar one elsewhere).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [lo, hi].
  int64_t integer(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(uniform() * static_cast<double>(hi - lo + 1));
  }
  /// True with probability p.
  bool chance(double p) { return uniform() < p; }
  /// Standard normal (Box-Muller; one draw per call keeps the sequence simple to reason about).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
  }
  /// A float32 tensor of normal draws with standard deviation `stddev`.
  at::Tensor normal(at::IntArrayRef shape, double stddev) {
    auto t = at::empty(shape, at::kFloat);
    float* p = t.data_ptr<float>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<float>(stddev * normal());
    return t;
  }

 private:
  std::mt19937_64 engine_;
};

/// The seed of batch `step`: distinct streams per step, so any batch can be made alone.
uint64_t batchSeed(uint64_t seed, int64_t step) { return seed * 1000003u + static_cast<uint64_t>(step); }

// ---------------------------------------------------------------------------------------------
// Building TorchScript modules from C++

/// Creates modules in one compilation unit, as torch.jit.script does, and draws their initial
/// weights from one seeded Rng. Class names repeat ("Conv2d" for every convolution, each with
/// its own constants baked into its source), so the unit mangles them into distinct types.
/// Sources call children as `self.child.forward(x)`: from C++ a module is a plain class, and
/// calling `self.child(x)` would look for a `__call__` method that only Python provides.
class Builder {
 public:
  explicit Builder(uint64_t seed) : cu_(std::make_shared<torch::jit::CompilationUnit>()), rng_(seed) {}

  /// An empty module of class `kind`, in training mode. Module::train() requires every module
  /// to have a `training` attribute, and TorchScript reads it as self.training.
  Module module(const std::string& kind) {
    Module m(c10::QualifiedName("__torch__.crashcap.samples." + kind), cu_, /*shouldMangle=*/true);
    m.register_attribute("training", c10::BoolType::get(), true);
    return m;
  }

  /// kxk convolution with padding k/2: weight [cout, cin, k, k] ~ N(0, gain^2 / fan_in)
  /// (gain sqrt(2) is Kaiming init for a ReLU follower), bias zero if present.
  Module conv(int64_t cin, int64_t cout, int64_t k, int64_t stride, bool bias, double gain = std::sqrt(2.0)) {
    Module m = module("Conv2d");
    const double fanIn = static_cast<double>(cin * k * k);
    param(m, "weight", rng_.normal({cout, cin, k, k}, gain / std::sqrt(fanIn)));
    if (bias) param(m, "bias", at::zeros({cout}, at::kFloat));
    const std::string s = std::to_string(stride);
    const std::string p = std::to_string(k / 2);
    m.define("def forward(self, x: Tensor) -> Tensor:\n"
             "    return torch.conv2d(x, self.weight, " + std::string(bias ? "self.bias" : "None") +
             ", [" + s + ", " + s + "], [" + p + ", " + p + "], [1, 1], 1)\n");
    return m;
  }

  /// 2-d batch norm with running statistics as buffers, updated in place in training mode.
  Module batchNorm(int64_t channels) {
    Module m = module("BatchNorm2d");
    param(m, "weight", at::ones({channels}, at::kFloat));
    param(m, "bias", at::zeros({channels}, at::kFloat));
    m.register_buffer("running_mean", at::zeros({channels}, at::kFloat));
    m.register_buffer("running_var", at::ones({channels}, at::kFloat));
    m.define("def forward(self, x: Tensor) -> Tensor:\n"
             "    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,\n"
             "                            self.training, 0.1, 1e-5, False)\n");
    return m;
  }

  /// Linear layer: weight [out, in] ~ N(0, 1 / (3 in)) (the variance of PyTorch's default
  /// uniform init), bias zero.
  Module linear(int64_t in, int64_t out) {
    Module m = module("Linear");
    param(m, "weight", rng_.normal({out, in}, 1.0 / std::sqrt(3.0 * static_cast<double>(in))));
    param(m, "bias", at::zeros({out}, at::kFloat));
    m.define("def forward(self, x: Tensor) -> Tensor:\n"
             "    return torch.linear(x, self.weight, self.bias)\n");
    return m;
  }

  /// conv (no bias) followed by batch norm, as children "conv" and "bn", and optionally relu.
  Module convBn(const std::string& kind, int64_t cin, int64_t cout, int64_t k, int64_t stride, bool relu) {
    Module m = module(kind);
    m.register_module("conv", conv(cin, cout, k, stride, /*bias=*/false, relu ? std::sqrt(2.0) : 1.0));
    m.register_module("bn", batchNorm(cout));
    m.define(relu ? "def forward(self, x: Tensor) -> Tensor:\n"
                    "    return torch.relu(self.bn.forward(self.conv.forward(x)))\n"
                  : "def forward(self, x: Tensor) -> Tensor:\n"
                    "    return self.bn.forward(self.conv.forward(x))\n");
    return m;
  }

 private:
  static void param(Module& m, const std::string& name, at::Tensor value) {
    value.set_requires_grad(true);
    m.register_parameter(name, std::move(value), /*is_buffer=*/false);
  }

  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  Rng rng_;
};

// ---------------------------------------------------------------------------------------------
// Segmenter

constexpr int64_t kSegSize = 64;

/// ResNet basic block: conv1 (stride) bn1 relu conv2 bn2, plus the input (through a 1x1
/// "downsample" conv + bn when the shape changes), relu.
Module basicBlock(Builder& b, int64_t cin, int64_t cout, int64_t stride) {
  Module m = b.module("BasicBlock");
  m.register_module("conv1", b.conv(cin, cout, 3, stride, false));
  m.register_module("bn1", b.batchNorm(cout));
  m.register_module("conv2", b.conv(cout, cout, 3, 1, false));
  m.register_module("bn2", b.batchNorm(cout));
  const bool project = stride != 1 || cin != cout;
  if (project) m.register_module("downsample", b.convBn("ConvBn", cin, cout, 1, stride, /*relu=*/false));
  m.define(std::string("def forward(self, x: Tensor) -> Tensor:\n"
                       "    out = torch.relu(self.bn1.forward(self.conv1.forward(x)))\n"
                       "    out = self.bn2.forward(self.conv2.forward(out))\n") +
           (project ? "    return torch.relu(out + self.downsample.forward(x))\n" : "    return torch.relu(out + x)\n"));
  return m;
}

/// A stage of one basic block, named "0" as in torchvision's Sequential stages. "0" is not an
/// identifier, hence getattr (the saved code spells it the same way).
Module stage(Builder& b, int64_t cin, int64_t cout, int64_t stride) {
  Module m = b.module("Stage");
  m.register_module("0", basicBlock(b, cin, cout, stride));
  m.define("def forward(self, x: Tensor) -> Tensor:\n"
           "    return getattr(self, \"0\").forward(x)\n");
  return m;
}

/// FPN: 1x1 laterals to 32 channels, top-down nearest upsampling and addition, 3x3 smoothing to
/// 8 channels each, all upsampled to the finest level and concatenated (24 channels), as DB does.
Module fpnNeck(Builder& b, int64_t c1, int64_t c2, int64_t c3) {
  constexpr int64_t kInner = 32;
  constexpr int64_t kOut = 8;
  Module m = b.module("FPN");
  m.register_module("lateral1", b.conv(c1, kInner, 1, 1, false, 1.0));
  m.register_module("lateral2", b.conv(c2, kInner, 1, 1, false, 1.0));
  m.register_module("lateral3", b.conv(c3, kInner, 1, 1, false, 1.0));
  m.register_module("smooth1", b.conv(kInner, kOut, 3, 1, false, 1.0));
  m.register_module("smooth2", b.conv(kInner, kOut, 3, 1, false, 1.0));
  m.register_module("smooth3", b.conv(kInner, kOut, 3, 1, false, 1.0));
  m.define(R"(
def forward(self, c1: Tensor, c2: Tensor, c3: Tensor) -> Tensor:
    p3 = self.lateral3.forward(c3)
    p2 = self.lateral2.forward(c2) + torch.upsample_nearest2d(p3, [c2.size(2), c2.size(3)])
    p1 = self.lateral1.forward(c1) + torch.upsample_nearest2d(p2, [c1.size(2), c1.size(3)])
    size = [c1.size(2), c1.size(3)]
    return torch.cat([self.smooth1.forward(p1),
                      torch.upsample_nearest2d(self.smooth2.forward(p2), size),
                      torch.upsample_nearest2d(self.smooth3.forward(p3), size)], 1)
)");
  return m;
}

/// DB head branch: conv3x3 bn relu, 2x nearest upsampling, conv3x3 to one logit per pixel.
Module dbHead(Builder& b, int64_t cin) {
  Module m = b.module("DBHead");
  m.register_module("conv1", b.conv(cin, 8, 3, 1, false));
  m.register_module("bn1", b.batchNorm(8));
  m.register_module("conv2", b.conv(8, 1, 3, 1, true, 1.0));
  m.define(R"(
def forward(self, x: Tensor) -> Tensor:
    x = torch.relu(self.bn1.forward(self.conv1.forward(x)))
    x = torch.upsample_nearest2d(x, [x.size(2) * 2, x.size(3) * 2])
    return self.conv2.forward(x)
)");
  return m;
}

// The loss is DB's: Ls + alpha Lb + beta Lt with alpha = 1, beta = 10. BCE and L1 divide by
// their mask's sum clamped to 1, so only the Dice term can make 0/0 (the DiceEps0 fault).
constexpr const char* kSegForward = R"(
def forward(self, image: Tensor, prob_map: Tensor, prob_mask: Tensor, thresh_map: Tensor, thresh_mask: Tensor) -> Tensor:
    c1 = self.stage1.forward(self.stem.forward(image))
    c2 = self.stage2.forward(c1)
    c3 = self.stage3.forward(c2)
    features = self.neck.forward(c1, c2, c3)
    prob_logits = self.prob_head.forward(features)
    thresh = torch.sigmoid(self.thresh_head.forward(features))
    binary = torch.sigmoid((torch.sigmoid(prob_logits) - thresh) * 50.0)

    bce = torch.binary_cross_entropy_with_logits(prob_logits, prob_map, prob_mask, None, 2)
    bce = bce / torch.clamp_min(torch.sum(prob_mask), 1.0)

    inter = torch.sum(binary * prob_map * prob_mask, [1, 2, 3])
    union = torch.sum(binary * prob_mask, [1, 2, 3]) + torch.sum(prob_map * prob_mask, [1, 2, 3]) + self.dice_eps
    dice = torch.mean(1.0 - 2.0 * inter / union)

    l1 = torch.sum(torch.abs(thresh - thresh_map) * thresh_mask) / torch.clamp_min(torch.sum(thresh_mask), 1.0)
    return bce + dice + 10.0 * l1
)";

/// One text line: a rectangle of blobs from (x0, y0) to (x1, y1), in pixels.
struct TextLine {
  double x0, y0, x1, y1;
  bool ignore;  // drawn, but don't-care in the targets (DB's "###" lines)
};

/// Distance from point (px, py) to the border of a line's rectangle, inside or outside.
double borderDistance(const TextLine& l, double px, double py) {
  const bool inside = px >= l.x0 && px <= l.x1 && py >= l.y0 && py <= l.y1;
  if (inside) return std::min({px - l.x0, l.x1 - px, py - l.y0, l.y1 - py});
  const double dx = std::max({l.x0 - px, 0.0, px - l.x1});
  const double dy = std::max({l.y0 - py, 0.0, py - l.y1});
  return std::sqrt(dx * dx + dy * dy);
}

// ---------------------------------------------------------------------------------------------
// Classifier

constexpr int64_t kClsSize = 28;
constexpr int64_t kMaxClasses = 10;

constexpr const char* kClsForward = R"(
def forward(self, image: Tensor, label: Tensor) -> Tensor:
    x = torch.relu(self.bn1.forward(self.conv1.forward(image)))
    x = torch.max_pool2d(x, [2, 2], [2, 2])
    x = torch.relu(self.bn2.forward(self.conv2.forward(x)))
    x = torch.max_pool2d(x, [2, 2], [2, 2])
    x = torch.relu(self.bn3.forward(self.conv3.forward(x)))
    x = torch.flatten(torch.max_pool2d(x, [2, 2], [2, 2]), 1)
    x = torch.dropout(x, 0.25, self.training)
    return torch.cross_entropy_loss(self.fc.forward(x), label, None, 1, -100, 0.0)
)";

/// Throws std::invalid_argument unless there is a shape for each class.
void checkClasses(int64_t numClasses) {
  if (numClasses < 2 || numClasses > kMaxClasses)
    throw std::invalid_argument("numClasses must be in [2, " + std::to_string(kMaxClasses) + "], got " +
                                std::to_string(numClasses));
}

/// Signed distance from (u, v) to an axis-aligned box centred at 0 with half sizes (hu, hv).
double box(double u, double v, double hu, double hv) {
  const double qu = std::abs(u) - hu;
  const double qv = std::abs(v) - hv;
  const double outside = std::hypot(std::max(qu, 0.0), std::max(qv, 0.0));
  return outside + std::min(std::max(qu, qv), 0.0);
}

/// Signed distance (pixels, negative inside) from local coordinates (u, v) to shape `cls` of
/// radius s and stroke half-width t.
double shapeDistance(int64_t cls, double u, double v, double s, double t) {
  const double r = std::hypot(u, v);
  switch (cls) {
    case 0: return r - s;                                                // disk
    case 1: return std::abs(r - s) - t;                                  // ring
    case 2: return box(u, v, s * 0.85, s * 0.85);                        // square
    case 3: return std::abs(box(u, v, s * 0.85, s * 0.85)) - t;          // frame
    case 4: return box(u, v, s, t);                                      // horizontal bar
    case 5: return box(u, v, t, s);                                      // vertical bar
    case 6: return std::min(box(u, v, s, t), box(u, v, t, s));           // plus
    case 7: {                                                            // diagonal cross
      const double a = (u + v) / std::sqrt(2.0), b = (u - v) / std::sqrt(2.0);
      return std::min(box(a, b, s, t), box(a, b, t, s));
    }
    case 8: {                                                            // triangle, apex up
      // Intersection of three half-planes at distance s/2 from the centre.
      const double h = s * 0.5;
      const double d1 = v - h;                                           // bottom edge
      const double d2 = -0.866 * u - 0.5 * v - h;                        // upper left edge
      const double d3 = 0.866 * u - 0.5 * v - h;                         // upper right edge
      return std::max({d1, d2, d3});
    }
    default: {                                                           // two dots
      const double d = s * 0.55, rad = s * 0.4;
      return std::min(std::hypot(u - d, v) - rad, std::hypot(u + d, v) - rad);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Faults

/// Throws std::invalid_argument unless the plan's row is in the batch.
void checkRow(const FaultPlan& plan, int64_t batchSize) {
  if (plan.row < 0 || plan.row >= batchSize)
    throw std::invalid_argument(std::string("fault ") + faultName(plan.fault) + " targets row " +
                                std::to_string(plan.row) + ", but the batch has " + std::to_string(batchSize) +
                                " rows (0.." + std::to_string(batchSize - 1) + ")");
}

/// Fills a centred square patch of side `side` in image row `row` with NaN, as a decoding bug
/// or a corrupt file on disk would.
void poisonPatch(const at::Tensor& images, int64_t row, int64_t side) {
  const int64_t h = images.size(2), w = images.size(3);
  const int64_t y0 = (h - side) / 2, x0 = (w - side) / 2;
  images[row].narrow(1, y0, side).narrow(2, x0, side).fill_(std::numeric_limits<float>::quiet_NaN());
}

/// Whether `fault` is planned for this step.
bool firesAt(const FaultPlan& plan, Fault fault, int64_t step) { return plan.fault == fault && plan.step == step; }

}  // namespace

// ---------------------------------------------------------------------------------------------

Fault parseFault(const std::string& name) {
  for (Fault f : {Fault::None, Fault::NanSample, Fault::BadLabel, Fault::DiceEps0, Fault::LrBlowup})
    if (name == faultName(f)) return f;
  throw std::invalid_argument("unknown fault '" + name +
                              "': expected one of none, nan-sample, bad-label, dice-eps0, lr-blowup");
}

const char* faultName(Fault fault) {
  switch (fault) {
    case Fault::None: return "none";
    case Fault::NanSample: return "nan-sample";
    case Fault::BadLabel: return "bad-label";
    case Fault::DiceEps0: return "dice-eps0";
    case Fault::LrBlowup: return "lr-blowup";
  }
  return "unknown";
}

SampleModel makeSegModel(uint64_t seed, double diceEps) {
  Builder b(seed);
  Module m = b.module("SegNet");
  m.register_module("stem", b.convBn("Stem", 1, 16, 3, 2, /*relu=*/true));
  m.register_module("stage1", stage(b, 16, 16, 1));
  m.register_module("stage2", stage(b, 16, 32, 2));
  m.register_module("stage3", stage(b, 32, 64, 2));
  m.register_module("neck", fpnNeck(b, 16, 32, 64));
  m.register_module("prob_head", dbHead(b, 24));
  m.register_module("thresh_head", dbHead(b, 24));
  m.register_attribute("dice_eps", c10::FloatType::get(), diceEps);
  m.define(kSegForward);
  return {m, {"image", "prob_map", "prob_mask", "thresh_map", "thresh_mask"}};
}

std::vector<at::Tensor> makeSegBatch(uint64_t seed, int64_t step, int64_t batchSize, const FaultPlan& plan) {
  constexpr int64_t S = kSegSize;
  Rng rng(batchSeed(seed, step));
  auto image = rng.normal({batchSize, 1, S, S}, 1.0);  // scaled per image below
  auto probMap = at::zeros({batchSize, 1, S, S}, at::kFloat);
  auto probMask = at::ones({batchSize, 1, S, S}, at::kFloat);
  auto threshMap = at::full({batchSize, 1, S, S}, 0.3, at::kFloat);  // DB's thresh_min
  auto threshMask = at::zeros({batchSize, 1, S, S}, at::kFloat);
  auto img = image.accessor<float, 4>();
  auto pm = probMap.accessor<float, 4>();
  auto mk = probMask.accessor<float, 4>();
  auto tm = threshMap.accessor<float, 4>();
  auto tk = threshMask.accessor<float, 4>();

  for (int64_t n = 0; n < batchSize; ++n) {
    // Background: a level, a gentle gradient and sensor noise.
    const double level = rng.uniform(0.05, 0.3);
    const double gx = rng.uniform(-0.1, 0.1), gy = rng.uniform(-0.1, 0.1);
    const double noise = rng.uniform(0.02, 0.08);
    for (int64_t y = 0; y < S; ++y)
      for (int64_t x = 0; x < S; ++x)
        img[n][0][y][x] = static_cast<float>(level + gx * (x - S / 2) / S + gy * (y - S / 2) / S +
                                             noise * img[n][0][y][x]);

    std::vector<TextLine> lines;
    const int64_t count = rng.integer(1, 4);
    for (int64_t i = 0; i < count; ++i) {
      const double h = static_cast<double>(rng.integer(4, 9));
      const double w = static_cast<double>(rng.integer(14, 50));
      const double x0 = static_cast<double>(rng.integer(2, S - 2 - static_cast<int64_t>(w)));
      const double y0 = static_cast<double>(rng.integer(2, S - 2 - static_cast<int64_t>(h)));
      lines.push_back({x0, y0, x0 + w, y0 + h, rng.chance(0.15)});

      // Glyphs: blobs of random width separated by one-pixel gaps, slightly varying brightness.
      const double ink = rng.uniform(0.55, 1.0);
      double gx0 = x0;
      while (gx0 < x0 + w) {
        const double gw = std::min(static_cast<double>(rng.integer(2, 5)), x0 + w - gx0);
        const double shade = ink * rng.uniform(0.85, 1.0);
        for (int64_t y = static_cast<int64_t>(y0); y < static_cast<int64_t>(y0 + h); ++y)
          for (int64_t x = static_cast<int64_t>(gx0); x < static_cast<int64_t>(gx0 + gw); ++x)
            img[n][0][y][x] = static_cast<float>(shade + noise * 0.5 * rng.normal());
        gx0 += gw + 1.0;
      }
    }

    // DB targets. Shrink/dilate offset D = A (1 - r^2) / L with r = 0.4; the probability map is
    // the line shrunk by D, the threshold map ramps from 0.7 on the border to 0.3 at distance D,
    // inside the line dilated by D. Pixel centres are at +0.5.
    for (const TextLine& l : lines) {
      const double w = l.x1 - l.x0, h = l.y1 - l.y0;
      const double d = w * h * (1.0 - 0.4 * 0.4) / (2.0 * (w + h));
      for (int64_t y = 0; y < S; ++y) {
        for (int64_t x = 0; x < S; ++x) {
          const double px = x + 0.5, py = y + 0.5;
          const bool inLine = px >= l.x0 && px <= l.x1 && py >= l.y0 && py <= l.y1;
          if (l.ignore) {
            if (inLine) mk[n][0][y][x] = 0.0f;
            continue;
          }
          if (px >= l.x0 + d && px <= l.x1 - d && py >= l.y0 + d && py <= l.y1 - d) pm[n][0][y][x] = 1.0f;
          const double dist = borderDistance(l, px, py);
          const bool inDilated = px >= l.x0 - d && px <= l.x1 + d && py >= l.y0 - d && py <= l.y1 + d;
          if (inDilated) {
            tk[n][0][y][x] = 1.0f;
            const double t = 0.3 + 0.4 * (1.0 - std::min(dist / d, 1.0));
            tm[n][0][y][x] = std::max(tm[n][0][y][x], static_cast<float>(t));
          }
        }
      }
    }
  }

  if (firesAt(plan, Fault::NanSample, step)) {
    checkRow(plan, batchSize);
    poisonPatch(image, plan.row, 8);
  }
  if (firesAt(plan, Fault::DiceEps0, step)) {
    // An image whose every text line (and so, by the annotation tool's rule, the whole image)
    // is marked don't-care: nothing of it is supervised, and its Dice term is 0 / (0 + eps).
    checkRow(plan, batchSize);
    probMap[plan.row].zero_();
    probMask[plan.row].zero_();
    threshMask[plan.row].zero_();
  }
  return {image, probMap, probMask, threshMap, threshMask};
}

SampleModel makeClsModel(uint64_t seed, int64_t numClasses) {
  checkClasses(numClasses);
  Builder b(seed);
  Module m = b.module("ShapeNet");
  m.register_module("conv1", b.conv(1, 16, 3, 1, false));
  m.register_module("bn1", b.batchNorm(16));
  m.register_module("conv2", b.conv(16, 32, 3, 1, false));
  m.register_module("bn2", b.batchNorm(32));
  m.register_module("conv3", b.conv(32, 32, 3, 1, false));
  m.register_module("bn3", b.batchNorm(32));
  m.register_module("fc", b.linear(32 * 3 * 3, numClasses));
  m.define(kClsForward);
  return {m, {"image", "label"}};
}

std::vector<at::Tensor> makeClsBatch(uint64_t seed, int64_t step, int64_t batchSize, int64_t numClasses,
                                     const FaultPlan& plan) {
  checkClasses(numClasses);
  constexpr int64_t S = kClsSize;
  Rng rng(batchSeed(seed, step));
  auto image = rng.normal({batchSize, 1, S, S}, 1.0);  // scaled per image below
  auto label = at::empty({batchSize}, at::kLong);
  auto img = image.accessor<float, 4>();
  auto lab = label.accessor<int64_t, 1>();

  for (int64_t n = 0; n < batchSize; ++n) {
    const int64_t cls = rng.integer(0, numClasses - 1);
    lab[n] = cls;
    const double cx = rng.uniform(10.0, 18.0), cy = rng.uniform(10.0, 18.0);
    const double s = rng.uniform(5.0, 9.0);
    const double t = rng.uniform(0.9, 1.6);
    // Rotations stay within +-20 degrees so that bars, plus and cross remain different classes.
    const double angle = rng.uniform(-20.0, 20.0) * kPi / 180.0;
    const double c = std::cos(angle), sn = std::sin(angle);
    const double ink = rng.uniform(0.6, 1.0), level = rng.uniform(0.0, 0.2), noise = rng.uniform(0.03, 0.12);
    for (int64_t y = 0; y < S; ++y) {
      for (int64_t x = 0; x < S; ++x) {
        const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
        const double u = c * dx + sn * dy, v = -sn * dx + c * dy;
        // Half a pixel of anti-aliasing around the edge.
        const double cover = std::clamp(0.5 - shapeDistance(cls, u, v, s, t), 0.0, 1.0);
        img[n][0][y][x] = static_cast<float>(level + (ink - level) * cover + noise * img[n][0][y][x]);
      }
    }
  }

  if (firesAt(plan, Fault::NanSample, step)) {
    checkRow(plan, batchSize);
    poisonPatch(image, plan.row, 6);
  }
  if (firesAt(plan, Fault::BadLabel, step)) {
    // One past the last class, as an off-by-one in a label map produces.
    checkRow(plan, batchSize);
    label[plan.row] = numClasses;
  }
  return {image, label};
}

SampleModel makeWideModel(uint64_t seed, int64_t width, int64_t layers) {
  if (width < 1 || layers < 1)
    throw std::invalid_argument("a wide model needs width >= 1 and layers >= 1, not " + std::to_string(width) + " and " +
                                std::to_string(layers));
  Builder b(seed);
  Module m = b.module("WideMlp");
  std::string forward = "def forward(self, x: Tensor, y: Tensor) -> Tensor:\n    h = x\n";
  for (int64_t i = 0; i < layers; ++i) {
    const std::string name = "fc" + std::to_string(i);
    m.register_module(name, b.linear(width, width));
    forward += "    h = torch.tanh(self." + name + ".forward(h))\n";
  }
  forward += "    return torch.mse_loss(h, y)\n";
  m.define(forward);
  return {m, {"x", "y"}};
}

std::vector<at::Tensor> makeWideBatch(uint64_t seed, int64_t step, int64_t batchSize, int64_t width,
                                      const FaultPlan& plan) {
  Rng rng(batchSeed(seed, step));
  auto x = rng.normal({batchSize, width}, 1.0);
  // A target the model can learn: each feature is the next one's, squashed.
  auto y = (x.roll(-1, 1) * 0.8).tanh();
  if (firesAt(plan, Fault::NanSample, step)) {
    checkRow(plan, batchSize);
    x[plan.row].narrow(0, width / 2, std::min<int64_t>(4, width - width / 2)).fill_(std::numeric_limits<float>::quiet_NaN());
  }
  return {x, y};
}

double learningRate(double base, int64_t step, const FaultPlan& plan) {
  if (plan.fault != Fault::LrBlowup || step < plan.step) return base;
  return base * std::pow(kLrBlowupFactor, static_cast<double>(step - plan.step + 1));
}

}  // namespace crashcap::samples
