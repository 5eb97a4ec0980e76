// Each triage rule on fixed, typed facts: what confirms it, what refutes it, and what leaves it
// inconclusive. No replay runs here; tests/investigate/triage_test.cpp runs the whole plan on
// real crash bundles.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "test_support.hpp"

#include "crashcap/investigate/triage.hpp"

using namespace crashcap;
using namespace crashcap::investigate;
using replayer::Verdict;
using V = HypothesisVerdict;

namespace {

const std::string kBundle = "crash.ccap";

replayer::ValueStats stats(int64_t nan, int64_t inf, std::optional<double> min, std::optional<double> max) {
  replayer::ValueStats v;
  v.dtype = "float32";
  v.shape = {8, 3, 16, 16};
  v.nanCount = nan;
  v.infCount = inf;
  v.min = min;
  v.max = max;
  return v;
}

replayer::ProbedOp nonFiniteOp(const std::string& name, std::vector<replayer::ValueStats> inputs) {
  replayer::ProbedOp op;
  op.name = name;
  op.phase = "forward";
  op.inputs = std::move(inputs);
  op.outputs = {stats(1, 0, 0.0, 1.0)};
  return op;
}

replayer::ReplayResult replayOf(Verdict verdict, int64_t step = 6) {
  replayer::ReplayResult r;
  r.verdict = verdict;
  r.step = step;
  // A replay that reproduces a failure has the failure's error (replayer::showsFailure).
  if (replayer::reproduces(verdict)) r.error = "non-finite loss at step " + std::to_string(step) + ": nan";
  r.keyframe = 4;
  r.batchSize = 8;
  r.device = "cpu";
  r.recordedDevice = "cpu";
  for (int64_t s = r.keyframe; s <= step; ++s) {
    replayer::StepReplay sr;
    sr.step = s;
    r.steps.push_back(sr);
  }
  return r;
}

/// Facts of a crash that reproduces bit for bit at step 6.
TriageFacts reproducedAt6() {
  TriageFacts f;
  f.bundle = kBundle;
  f.replay = replayOf(Verdict::ReproducedBitwise);
  return f;
}

SampleBisection samplesFound(std::vector<int64_t> rows, int replays = 6) {
  SampleBisection s;
  s.step = 6;
  s.batchSize = 8;
  s.reproduced = true;
  s.rows = std::move(rows);
  s.replays = replays;
  return s;
}

ConfigTrial flip(const std::string& setting, const std::string& recorded, const std::string& value, bool fails) {
  ConfigTrial t;
  t.setting = setting;
  t.recorded = recorded;
  t.value = value;
  t.fails = fails;
  t.outcome = "ok";
  return t;
}

ConfigTrial onDevice(const std::string& device, bool fails) {
  ConfigTrial t;
  t.device = device;
  t.fails = fails;
  t.outcome = "ok";
  return t;
}

ConfigBisection configOf(bool baseFails, std::vector<ConfigTrial> flips, std::vector<ConfigTrial> devices = {}) {
  ConfigBisection c;
  c.step = 6;
  c.baseline.device = "cpu";
  c.baseline.fails = baseFails;
  c.flips = std::move(flips);
  c.devices = std::move(devices);
  return c;
}

/// Steps 2..6 with these weight norms after steps 2..5 (the target has none) and learning rates.
StepBisection stepsWith(const std::vector<std::optional<double>>& weightNorms, const std::vector<double>& lrs) {
  StepBisection b;
  b.fromKeyframe = 2;
  b.target = 6;
  for (int64_t s = 2; s <= 6; ++s) {
    replayer::StepReplay r;
    r.step = s;
    r.learningRate = lrs[static_cast<size_t>(s - 2)];
    if (s < 6) r.weightNorm = weightNorms[static_cast<size_t>(s - 2)];
    b.steps.push_back(r);
  }
  return b;
}

/// Row `row` of `tensor` holds `nans` NaN values.
RowFinding nanRow(int64_t row, const std::string& tensor, uint64_t nans) {
  RowFinding r;
  r.row = row;
  r.tensor = tensor;
  r.kind = RowFinding::Kind::NonFinite;
  r.nanCount = nans;
  return r;
}

bool has(const Hypothesis& h, const std::string& text) {
  for (const auto& e : h.evidence)
    if (e.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("invalid-data is confirmed when the failure needs the rows and goes away without them, naming what is odd",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({3});
  f.samples->datasetIndices = std::vector<int64_t>{51};
  f.withoutRows = replayOf(Verdict::NotReproduced);
  RowFinding nan = nanRow(3, "steps/6/batch/image", 64);
  f.rowFindings = {nan};
  auto h = judgeInvalidData(f);
  INFO(h.evidence.size());
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "step 6 fails with batch row [3] alone and passes without it (7 replays)");
  CHECK(has(h, "dataset index 51 (the batch's index tensor)"));
  CHECK(has(h, "row 3 of steps/6/batch/image holds 64 NaN and 0 Inf values"));
  CHECK(h.rerun == "crashcap bisect samples crash.ccap");

  // A collate function of the program's: the index follows the rows it matched, or is said to be
  // in the sampler's order, unchecked, and why.
  f.samples->rowOrder = replayer::RowOrder{"reordered", {9, 51, 4, 2}, ""};
  h = judgeInvalidData(f);
  CHECK(has(h, "dataset index 51 (the batch's index tensor, matched to the rows after the collate function reordered "
               "the samples the sampler drew)"));
  f.samples->rowOrder = replayer::RowOrder{"unchecked", {}, "rows 1, 3 each match several of the samples loaded again"};
  h = judgeInvalidData(f);
  CHECK(has(h, "dataset index 51 (the batch's index tensor; unchecked: the collate function is the program's, and it "
               "may have put the samples in another order than the sampler drew them, since rows 1, 3 each match "
               "several of the samples loaded again)"));
  CHECK(h.verdict == V::Confirmed);  // the rows' values convict them, whichever sample they are
  // The culprit row is one the match left open: no index, rather than the one drawn at its place.
  f.samples->datasetIndices.reset();
  f.samples->rowOrder = replayer::RowOrder{"partial", {9, -1, -1, 2}, "rows 1, 2 match several of the samples"};
  h = judgeInvalidData(f);
  CHECK(has(h, "no dataset index: the collate function reordered the samples the sampler drew, and rows 1, 2 match "
               "several of the samples, so the rows are named by their place in the batch"));
}

RowFinding outOfDomain(int64_t row, const std::string& tensor, double value, IndexDomain domain, bool oneElement) {
  RowFinding r;
  r.row = row;
  r.tensor = tensor;
  r.kind = RowFinding::Kind::OutOfDomain;
  r.value = value;
  r.domain = std::move(domain);
  r.oneElement = oneElement;
  return r;
}

TEST_CASE("invalid-data names a value outside the failing op's domain, and the domain", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({5});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.rowFindings = {outOfDomain(5, "steps/6/batch/label", 10, IndexDomain{"aten::nll_loss", 10, {32}, {32, 10}, -100}, true)};
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "row 5 of steps/6/batch/label is 10, outside 0..9: the loss (aten::nll_loss) sees 10 classes (logits [32,10])"));

  auto g = reproducedAt6();
  g.samples = samplesFound({4});
  g.withoutRows = replayOf(Verdict::NotReproduced);
  g.rowFindings = {outOfDomain(4, "steps/6/batch/tokens", 40, IndexDomain{"aten::embedding", 32, {8, 12}, {32, 8}, std::nullopt}, false)};
  auto k = judgeInvalidData(g);
  CHECK(k.verdict == V::Confirmed);
  CHECK(has(k, "row 4 of steps/6/batch/tokens holds 40, outside 0..31: the embedding (aten::embedding) has 32 rows (table [32,8])"));
}

TEST_CASE("rows that trigger the failure with values in range are not invalid data, and loss-numerics says the loss "
          "cannot handle them",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({2});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  RowFinding zeros;
  zeros.row = 2;
  zeros.tensor = "steps/6/batch/valid";
  zeros.kind = RowFinding::Kind::AllZeros;
  f.rowFindings = {zeros};
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::div", {stats(0, 0, 0.0, 3.5), stats(0, 0, 0.0, 9.0)});
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(h.evidence.at(0) == "step 6 fails with batch row [2] alone and passes without it (7 replays)");
  CHECK(has(h, "but nothing in it was found invalid"));
  CHECK(has(h, "row 2 of steps/6/batch/valid is all zeros, unlike the batch's other rows"));
  auto n = judgeLossNumerics(f);
  CHECK(n.verdict == V::Confirmed);
  CHECK(has(n, "batch row [2] triggers it with values in range: the loss cannot handle a legitimate edge case"));
  // The rows are still where the failure is.
  CHECK(findCulprit(f).rows == std::vector<int64_t>{2});

  // An invalid value among the findings makes it invalid data after all; the trait is then left out.
  RowFinding nan = nanRow(2, "steps/6/batch/x", 1);
  f.rowFindings.push_back(nan);
  auto c = judgeInvalidData(f);
  CHECK(c.verdict == V::Confirmed);
  CHECK_FALSE(has(c, "all zeros"));
  CHECK_FALSE(has(judgeLossNumerics(f), "legitimate edge case"));
}

TEST_CASE("an error raised about a NaN it was given names the op that made the NaN as the culprit's op",
          "[investigate][triage]") {
  // torch.multinomial of a softmax gone NaN: it raises "probability tensor contains either inf,
  // nan or element < 0"; the NaN was made at the first non-finite op, which is the one to look at.
  auto f = reproducedAt6();
  f.replay->error = "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0";
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::addmm", {stats(1, 0, -2.0, 3.0), stats(0, 0, -0.5, 0.5)});
  f.replay->firstNonFiniteOp->index = 4;
  replayer::ProbedOp raising;
  raising.name = "aten::multinomial";
  raising.phase = "forward";
  raising.index = 20;
  raising.began = 12;  // 12 ops had ended when it began: addmm (4) ran before it
  raising.inputs = {stats(16, 0, std::nullopt, std::nullopt)};
  f.replay->raisingOp = raising;
  CHECK(findCulprit(f).op == "aten::addmm");
  // A NaN first seen inside the raising op (its own max() of NaN probabilities fed in from the
  // batch) is that op's: the culprit stays the op the program called.
  auto inside = f;
  inside.replay->firstNonFiniteOp->name = "aten::max";
  inside.replay->firstNonFiniteOp->index = 14;
  CHECK(findCulprit(inside).op == "aten::multinomial");
  // A result from before the start was kept (began 0) says nothing about the order: no switch.
  auto unknown = f;
  unknown.replay->raisingOp->began = 0;
  CHECK(findCulprit(unknown).op == "aten::multinomial");
  // An error about finite inputs (a class index out of range) names the op it came out of.
  auto finite = f;
  finite.replay->raisingOp->inputs = {stats(0, 0, -1.0, 1.0)};
  CHECK(findCulprit(finite).op == "aten::multinomial");
  // Infinities a mask wrote on purpose are no finding to move the culprit to.
  auto masked = f;
  masked.replay->raisingOp->inputs = {stats(0, 3, -1.0, 1.0)};
  masked.replay->firstNonFiniteOp->afterGivenInfinity = true;
  CHECK(findCulprit(masked).op == "aten::multinomial");
  masked.replay->firstNonFiniteOp->afterGivenInfinity = false;  // an infinity an op made is one
  CHECK(findCulprit(masked).op == "aten::addmm");
  // Without a non-finite op before it, the raising op is all there is.
  f.replay->firstNonFiniteOp.reset();
  CHECK(findCulprit(f).op == "aten::multinomial");
}

TEST_CASE("a length of 0 among positive ones is a trait shown after the verdict, not invalid data", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({7});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  RowFinding zero;
  zero.row = 7;
  zero.tensor = "steps/6/batch/1";
  zero.kind = RowFinding::Kind::LoneZero;
  zero.othersMin = 3;
  zero.othersMax = 11;
  zero.oneElement = true;
  CHECK_FALSE(zero.invalid());
  f.rowFindings = {zero};
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "but nothing in it was found invalid"));
  CHECK(has(h, "row 7 of steps/6/batch/1 is 0, while the batch's other rows are 3..11: a length or count of nothing?"));
  CHECK(findCulprit(f).rows == std::vector<int64_t>{7});
}

TEST_CASE("invalid-data of a job's rank names the rank whose batch holds the rows, and the culprit carries it",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.job = JobTriage{};
  f.job->jobId = "run-1-2-1";
  f.job->worldSize = 4;
  f.job->rank = f.job->askedRank = f.job->firstFailed = 2;
  f.samples = samplesFound({3});
  f.samples->datasetIndices = std::vector<int64_t>{51};
  f.withoutRows = replayOf(Verdict::NotReproduced);
  RowFinding nan = nanRow(3, "steps/6/batch/0", 1);
  f.rowFindings = {nan};
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "step 6 fails with rank 2's batch row [3] alone, every other rank feeding its whole batch, "
                            "and passes without it (7 replays of all 4 ranks)");
  CHECK(has(h, "dataset index 51 (rank 2's batch's index tensor)"));
  auto c = findCulprit(f);
  CHECK(c.rank == 2);
  CHECK(c.rows == std::vector<int64_t>{3});
  CHECK(c.datasetIndices == std::vector<int64_t>{51});

  f.withoutRows = replayOf(Verdict::Reproduced);  // another rank's batch fails it too
  auto g = judgeInvalidData(f);
  CHECK(g.verdict == V::Refuted);
  CHECK(has(g, "step 6 still fails without rank 2's rows [3]"));
  CHECK(findCulprit(TriageFacts{}).rank == std::nullopt);
}

TEST_CASE("a replay that reproduces a step the recording saw pass shows no failure to triage", "[investigate][triage]") {
  // A SIGKILL before the writer had the failing step: the replay ends at the last step held, which
  // passes as recorded. Its verdict reproduces the recording; nothing failed.
  TriageFacts f;
  f.bundle = kBundle;
  f.replay = replayOf(Verdict::ReproducedBitwise);
  f.replay->error.clear();
  CHECK_FALSE(f.reproduced());
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "does not reproduce on replay"));
  CHECK_FALSE(judgeLossNumerics(f).verdict == V::Confirmed);
  CHECK_FALSE(findCulprit(f).step);  // it passed in the recording and again: no culprit step
  f.replay->recordedError = "RuntimeError: boom";  // a recorded failure that did not come back is still its step
  CHECK(findCulprit(f).step == 6);
}

TEST_CASE("invalid-data is refuted when the step still fails without the rows", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({0});
  f.withoutRows = replayOf(Verdict::Reproduced);
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(has(h, "step 6 still fails without rows [0]: no particular sample is needed"));

  // Unless the batch is padded to one row's size: leaving that row out of the recorded batch
  // keeps its size, so the test cannot tell.
  f.paddingRow = PaddingRow{"steps/6/batch/tokens", 1, 4, 5, 3, std::nullopt};
  auto padded = judgeInvalidData(f);
  CHECK(padded.verdict == V::Inconclusive);
  CHECK(has(padded, "but the batch looks padded to one row: row 4 of steps/6/batch/tokens reaches index 4 along "
                    "dimension 1, while every other row is zero beyond index 2"));
}

TEST_CASE("the row a batch is padded to is the one that alone reaches further, among dense rows", "[investigate][triage]") {
  test::TempDir dir;
  // Token ids of 6 sequences padded with 0 to the longest, row 4 (5 tokens; the others 1..3); a
  // one-hot label tensor in which row 2 alone has the last class; features of fixed width.
  // Variants: padded to a fixed length of 8 instead; after an earlier step whose tokens were as long.
  const std::vector<int64_t> lengths = {3, 2, 3, 1, 5, 3};
  auto tokensOf = [&](int64_t width) {
    std::vector<int64_t> tokens(6 * width, 0);
    for (int64_t r = 0; r < 6; ++r)
      for (int64_t i = 0; i < lengths[r]; ++i) tokens[r * width + i] = 7 + r + i;
    return tokens;
  };
  std::vector<float> onehot(6 * 4, 0.0f), features(6 * 3, 1.5f);
  for (int64_t r = 0; r < 6; ++r) onehot[r * 4 + (r == 2 ? 3 : r % 2)] = 1.0f;
  auto write = [&](const std::string& path, int64_t width, int64_t earlierWidth) {
    auto w = formats::BundleWriter::create(path);
    auto writeTokens = [&](int64_t step, int64_t width, formats::StepBeginData& begin) {
      const auto tokens = tokensOf(width);
      w->writeTensor(formats::batchTensorName(step, "tokens"), formats::DType::Int64, {6, width}, tokens.data(),
                     tokens.size() * sizeof(int64_t));
      begin.batch.push_back(formats::batchTensorName(step, "tokens"));
      begin.rowDims.push_back(0);
    };
    if (earlierWidth > 0) {
      formats::StepBeginData earlier;
      earlier.step = 5;
      writeTokens(5, earlierWidth, earlier);
      formats::writeMetaRecord(*w, earlier);
    }
    formats::StepBeginData begin;
    begin.step = 6;
    w->writeTensor(formats::batchTensorName(6, "labels"), formats::DType::Float32, {6, 4}, onehot.data(),
                   onehot.size() * sizeof(float));
    w->writeTensor(formats::batchTensorName(6, "features"), formats::DType::Float32, {6, 3}, features.data(),
                   features.size() * sizeof(float));
    begin.batch = {formats::batchTensorName(6, "labels"), formats::batchTensorName(6, "features")};
    begin.rowDims = {0, 0};
    if (width > 0) writeTokens(6, width, begin);
    formats::writeMetaRecord(*w, begin);
    w->seal();
  };
  const std::string padded = dir.file("padded.ccap"), unpadded = dir.file("unpadded.ccap"),
                    fixed = dir.file("fixed.ccap"), seenBefore = dir.file("seen-before.ccap"),
                    shorterBefore = dir.file("shorter-before.ccap");
  write(padded, 5, 0);
  write(unpadded, 0, 0);
  write(fixed, 8, 0);
  write(seenBefore, 5, 5);
  write(shorterBefore, 5, 4);
  auto p = findPaddingRow(padded, 6);
  REQUIRE(p);
  CHECK(p->tensor == "steps/6/batch/tokens");
  CHECK(p->row == 4);
  CHECK(p->dim == 1);
  CHECK(p->extent == 5);
  CHECK(p->othersExtent == 3);
  CHECK_FALSE(p->datasetIndex);  // the batch has no index tensor
  // The one-hot row that alone reaches the last class is sparse data, not padding; fixed-width
  // features reach equally far in every row.
  CHECK_FALSE(findPaddingRow(unpadded, 6));
  // Padded to a fixed length, the size is no row's; a size an earlier, passing step had is not new.
  CHECK_FALSE(findPaddingRow(fixed, 6));
  CHECK_FALSE(findPaddingRow(seenBefore, 6));
  auto longer = findPaddingRow(shorterBefore, 6);
  REQUIRE(longer);
  CHECK(longer->row == 4);
}

TEST_CASE("invalid-data is inconclusive when the crash does not reproduce or no rows were isolated",
          "[investigate][triage]") {
  TriageFacts f;
  f.bundle = kBundle;
  f.replay = replayOf(Verdict::NotReproduced);
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "does not reproduce on replay"));

  auto g = reproducedAt6();  // sample bisection did not finish
  auto k = judgeInvalidData(g);
  CHECK(k.verdict == V::Inconclusive);
  CHECK(has(k, "sample bisection did not isolate rows"));

  // Rows were named, but the replay without them gave no result, or there is no batch left
  // without them: said as such, not as rows never isolated.
  g.samples = samplesFound({0});
  g.withoutRowsOutcome = "timed out after 600 s";
  k = judgeInvalidData(g);
  CHECK(k.verdict == V::Inconclusive);
  CHECK(has(k, "sample bisection named rows [0], but the replay of step 6 without them gave no result (timed out after "
               "600 s)"));
  CHECK_FALSE(has(k, "did not isolate rows"));
  g.withoutRowsOutcome.clear();
  k = judgeInvalidData(g);
  CHECK(k.verdict == V::Inconclusive);
  CHECK(has(k, "sample bisection named rows [0], the whole batch"));
}

TEST_CASE("a step whose batch has fewer rows than most earlier steps' is a short batch, said beside the whole batch "
          "sample bisection named",
          "[investigate][triage]") {
  // 401 samples in batches of 16: the epoch's last batch has 1 row, which BatchNorm cannot train on.
  test::TempDir dir;
  auto write = [](const std::string& path, std::vector<int64_t> rowsPerStep) {
    auto w = formats::BundleWriter::create(path);
    for (size_t step = 0; step < rowsPerStep.size(); ++step) {
      const auto s = static_cast<int64_t>(step);
      std::vector<float> x(static_cast<size_t>(rowsPerStep[step]) * 4, 0.5f);
      std::vector<int64_t> y(static_cast<size_t>(rowsPerStep[step]), 1);
      w->writeTensor(formats::batchTensorName(s, "0"), formats::DType::Float32, {rowsPerStep[step], 4}, x.data(),
                     x.size() * 4);
      w->writeTensor(formats::batchTensorName(s, "1"), formats::DType::Int64, {rowsPerStep[step]}, y.data(), y.size() * 8);
      formats::StepBeginData begin;
      begin.step = s;
      begin.batch = {formats::batchTensorName(s, "0"), formats::batchTensorName(s, "1")};
      begin.rowDims = {0, 0};
      formats::writeMetaRecord(*w, begin);
    }
    w->seal();
  };
  const std::string last = dir.file("last.ccap"), full = dir.file("full.ccap"), few = dir.file("few.ccap"),
                    ragged = dir.file("ragged.ccap");
  write(last, {16, 16, 16, 16, 16, 16, 1});
  write(full, {16, 16, 16, 16, 16, 16, 16});
  write(few, {16, 16, 1});                   // two earlier steps cannot tell what is usual
  write(ragged, {16, 12, 9, 16, 12, 9, 16, 12, 9, 1});  // sizes vary (a bucketing sampler): none is usual
  const auto s = findShortBatch(last, 6);
  REQUIRE(s);
  CHECK(s->rows == 1);
  CHECK(s->usualRows == 16);
  CHECK(s->stepsUsual == 6);
  CHECK_FALSE(findShortBatch(full, 6));
  CHECK_FALSE(findShortBatch(few, 2));
  CHECK_FALSE(findShortBatch(ragged, 9));  // 16 for 3 steps of 9: not more than half
  CHECK_FALSE(findShortBatch(last, 9));  // no such step

  auto f = reproducedAt6();
  f.samples = samplesFound({0});
  f.shortBatch = s;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "sample bisection named rows [0], the whole batch"));
  CHECK(has(h, "step 6's batch has 1 row, where 6 earlier recorded steps had 16: a short batch, the last of an epoch "
               "whose dataset the batch size does not divide? (the DataLoader's drop_last=True leaves it out); a single "
               "row is what BatchNorm in training, or any statistic over the batch, cannot take"));
  // Named in the culprit while invalid-data is open, not once refuted.
  CHECK(findCulprit(f).shortBatch.has_value());
  CHECK(findCulprit(f).shortBatch->usualRows == 16);
  f.withoutRows = replayOf(Verdict::Reproduced);
  f.samples = samplesFound({0, 1});
  REQUIRE(judgeInvalidData(f).verdict == V::Refuted);
  CHECK_FALSE(findCulprit(f).shortBatch);
}

TEST_CASE("invalid-data is inconclusive when no part of the batch can run, and names what its rows hold untested",
          "[investigate][triage]") {
  // A hidden state carried from the previous batch: every cut fails another way, so the search
  // ended on the whole batch without testing a row.
  auto f = reproducedAt6();
  f.samples = samplesFound({0, 1, 2, 3, 4, 5, 6, 7}, 7);
  f.samples->cutsFail = "RuntimeError: Expected hidden size (1, 4, 16), got [1, 8, 16]";
  CHECK(f.culpritRows().empty());  // no row singled out
  RowFinding nan = nanRow(3, "steps/6/batch/0", 1);
  f.untestedRowFindings = {nan};
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(h.evidence.at(0) ==
        "every part of step 6's batch that sample bisection tried fails another way (RuntimeError: Expected hidden size "
        "(1, 4, 16), got [1, 8, 16]): the step cannot run on part of its batch (a tensor of the program's sized for the "
        "whole batch does this: a recurrent hidden state carried from step to step, a target made as "
        "torch.ones(batch_size, 1)), so no row can be tested by leaving it out");
  CHECK(has(h, "in the batch as recorded, row 3 of steps/6/batch/0 holds 1 NaN and 0 Inf values (not tested)"));
  CHECK_FALSE(has(h, ", the whole batch: no replay"));  // not the search's end taken for a finding
}

TEST_CASE("invalid-data names what a row holds, untested, when sample bisection could not cut the batch at all",
          "[investigate][triage]") {
  // A PackedSequence: its data holds the samples concatenated with no offsets per row, so the
  // search could not run; the labels, one per row, still show the index the error names.
  auto f = reproducedAt6();
  f.samplesOutcome = "failed: step 6's batch cannot be cut to some of its 8 rows";
  REQUIRE_FALSE(f.samples);
  RowFinding label = nanRow(5, "steps/6/batch/1", 1);
  RowFinding indexed = nanRow(2, "steps/6/batch/1", 1);
  indexed.datasetIndex = 233;  // the batch carried its dataset indices
  f.untestedRowFindings = {label, indexed};
  f.untestedFindingsLeftOut = 2;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);  // nothing was tested by leaving the row out
  CHECK(h.evidence.at(0) == "sample bisection did not finish (failed: step 6's batch cannot be cut to some of its 8 rows)");
  CHECK(h.evidence.at(1) == "in the batch as recorded, row 5 of steps/6/batch/1 holds 1 NaN and 0 Inf values (not tested)");
  CHECK(h.evidence.at(2) ==
        "in the batch as recorded, row 2 of steps/6/batch/1 holds 1 NaN and 0 Inf values (not tested; dataset index 233)");
  CHECK(h.evidence.at(3) == "and 2 more such rows");
  CHECK(f.culpritRows().empty());
}

TEST_CASE("invalid-data is confirmed from rows tested in batches of the whole size, and says why they were",
          "[investigate][triage]") {
  // Cut to fewer rows the step failed another way; searched again with the rows left out replaced
  // by copies of those kept, it fails with row 3 copied and passes with the others in its place.
  auto f = reproducedAt6();
  f.samples = samplesFound({3}, 15);
  f.samples->filledBecause = "RuntimeError: Expected hidden size (1, 4, 16), got [1, 8, 16]";
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.rowFindings = {nanRow(3, "steps/6/batch/0", 1)};
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "step 6 fails with batch row [3] alone and passes without it (16 replays)");
  CHECK(h.evidence.at(1) ==
        "cut to fewer rows the step fails another way (RuntimeError: Expected hidden size (1, 4, 16), got [1, 8, 16]), "
        "so every experiment fed a batch of the whole 8 rows, those it left out replaced by copies of those it kept");
  CHECK(f.culpritRows() == std::vector<int64_t>{3});
  f.samples->filledBecause.clear();  // rows cut as usual: nothing to explain
  CHECK_FALSE(has(judgeInvalidData(f), "replaced by copies"));
}

/// Step 6 raised in aten::embedding_bag (a table of 50 rows, 79 tokens), and element 64 of its
/// concatenated token tensor is 53, in `row`'s span by the offsets in steps/6/batch/2.
static TriageFacts embeddingBagRaisedOn53(int64_t row) {
  auto f = reproducedAt6();
  replayer::ProbedOp raising;
  raising.name = "aten::embedding_bag";
  raising.phase = "forward";
  raising.inputs = {stats(0, 0, -1.0, 1.0), stats(0, 0, 1.0, 53.0)};
  raising.inputs[0].shape = {50, 16};
  raising.inputs[1].shape = {79};
  f.replay->raisingOp = raising;
  ConcatenatedValue v;
  v.tensor = "steps/6/batch/1";
  v.element = 64;
  v.position = 64;
  v.value = 53;
  v.domain.op = "aten::embedding_bag";
  v.domain.size = 50;
  v.domain.indexShape = {79};
  v.domain.sourceShape = {50, 16};
  v.spansBy = "steps/6/batch/2";
  v.byOffsets = true;
  v.row = row;
  f.concatenatedValues = {v};
  return f;
}

TEST_CASE("a value outside the raising op's domain in a batch of concatenated samples is invalid data, placed by "
          "its offsets",
          "[investigate][triage]") {
  auto f = embeddingBagRaisedOn53(10);
  f.concatenatedValues[0].datasetIndex = 150;
  f.samplesOutcome = "failed: step 6's batch cannot be cut to some of its 12 rows";
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "element 64 of steps/6/batch/1 is 53, outside 0..49: the embedding (aten::embedding_bag) has "
                            "50 rows (table [50,16]), the op that raised; by the offsets in steps/6/batch/2 it is in "
                            "row 10's span (dataset index 150)");
  CHECK(has(h, "the batch holds its samples concatenated, so no row could be cut and tested (sample bisection: failed: "
               "step 6's batch cannot be cut"));
  auto c = findCulprit(f);
  REQUIRE(c.value);
  CHECK(c.value->datasetIndex == 150);
  CHECK_FALSE(c.rows);

  // Outside the domain of another op than the one that raised: named, not confirmed, not the culprit.
  f.replay->raisingOp->name = "aten::index_select";
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "element 64 of steps/6/batch/1 is 53"));
  CHECK_FALSE(has(h, "the op that raised"));
  CHECK_FALSE(findCulprit(f).value);

  // The same op raised, but on another table's input (two bags, the other's tokens [64]).
  f.replay->raisingOp->name = "aten::embedding_bag";
  f.replay->raisingOp->inputs[1].shape = {64};
  CHECK(judgeInvalidData(f).verdict == V::Inconclusive);
  f.replay->raisingOp->inputs[1].shape = {79};

  // No offsets place it: said so.
  f.concatenatedValues[0].row.reset();
  f.concatenatedValues[0].spansBy.clear();
  f.concatenatedValues[0].datasetIndex.reset();
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "the op that raised; no tensor of lengths or offsets in the batch places it in a row"));
}

TEST_CASE("a value outside an op's domain in a culprit row's span is an invalid value of the rows, and only there",
          "[investigate][triage]") {
  // The ragged batch was cut by its offsets: row 5 alone fails, and the step passes without it.
  auto f = embeddingBagRaisedOn53(5);
  f.samples = samplesFound({5});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  CHECK(f.rowsInvalid());
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "element 64 of steps/6/batch/1 is 53, outside 0..49: the embedding (aten::embedding_bag) has 50 rows "
               "(table [50,16]), the op that raised; by the offsets in steps/6/batch/2 it is in row 5's span"));
  CHECK_FALSE(has(h, "nothing in it was found invalid"));

  // In another row's span: not the culprit rows' value, so they hold nothing invalid.
  f.concatenatedValues[0].row = 3;
  CHECK_FALSE(f.rowsInvalid());
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "nothing in it was found invalid"));
  CHECK_FALSE(has(h, "element 64"));

  // Bisection ran and cut the batch but named no rows: the value is not taken for a batch that
  // could not be cut.
  f.samples = samplesFound({});
  f.withoutRows.reset();
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK_FALSE(has(h, "so no row could be cut"));
}

TEST_CASE("a CTC target longer than its input can align is invalid data of its row, and its infinite loss no "
          "arithmetic failure",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({4});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::_ctc_loss", {stats(0, 0, -9.0, -0.1), stats(0, 0, 1.0, 11.0)});
  f.replay->firstNonFiniteOp->outputs = {stats(0, 1, 0.5, 9.0)};  // the loss of each element: one infinite
  f.replay->firstNonFiniteOp->unalignable = {{4, 33, 35, 23}};
  CHECK(f.rowsInvalid());
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "row 4: its CTC target of 33 labels needs 35 input frames (a blank between repeated labels) and has 23: "
               "no alignment exists"));
  CHECK_FALSE(has(h, "nothing in it was found invalid"));
  auto loss = judgeLossNumerics(f);
  CHECK(loss.verdict == V::Refuted);
  CHECK(has(loss, "aten::_ctc_loss (forward, step 6) is infinite for element [4] of its batch, whose target needs more "
                  "input frames than it has"));
  // A NaN in the loss is not the value of a target no path emits.
  f.replay->firstNonFiniteOp->outputs = {stats(1, 1, 0.5, 9.0)};
  CHECK(judgeLossNumerics(f).verdict == V::Confirmed);
  f.replay->firstNonFiniteOp->outputs = {stats(0, 1, 0.5, 9.0)};

  // The row bisection named is not the one that cannot be aligned: nothing invalid in the culprit row.
  f.replay->firstNonFiniteOp->unalignable = {{2, 33, 35, 23}};
  CHECK_FALSE(f.rowsInvalid());
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "nothing in it was found invalid"));
  CHECK(has(h, "element 2 of aten::_ctc_loss's batch: its CTC target of 33 labels"));

  // No rows tested: the element is named, and the data is not convicted by its place in the loss alone.
  f.samples.reset();
  f.withoutRows.reset();
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "element 2 of aten::_ctc_loss's batch: its CTC target"));
  // Targets that all align: the loss's arithmetic is the suspect, as for any op.
  f.replay->firstNonFiniteOp->unalignable.clear();
  CHECK(judgeLossNumerics(f).verdict == V::Confirmed);
}

TEST_CASE("a loss's mean of nothing (every target ignore_index, or an empty tensor) is an edge case of the step, "
          "said of the batch as a whole, not a sample refuted",
          "[investigate][triage]") {
  // 16 rows all labelled -100: cross_entropy's nll_loss averages over a total weight of 0.
  auto f = reproducedAt6();
  f.samples = samplesFound({0, 1, 2, 3});
  f.withoutRows = replayOf(Verdict::Reproduced);  // the rows left are unlabelled too
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::nll_loss_forward", {stats(0, 0, -4.0, -0.1), stats(0, 0, -100, -100)});
  f.replay->firstNonFiniteOp->outputs = {stats(1, 0, 0, 0), stats(0, 0, 0, 0)};
  f.batchDatasetIndices = std::vector<int64_t>{96, 97, 98};
  replayer::EmptyMean m;
  m.targets = 16;
  m.ignored = 16;
  m.ignoreIndex = -100;
  f.replay->firstNonFiniteOp->emptyMean = m;
  f.withoutRows->firstNonFiniteOp = f.replay->firstNonFiniteOp;  // the rows left make the same mean of nothing
  auto loss = judgeLossNumerics(f);
  CHECK(loss.verdict == V::Confirmed);
  CHECK(has(loss, "aten::nll_loss_forward (forward, step 6) makes NaN as a mean of nothing: none of its 16 targets "
                  "counts (all are ignore_index -100), so its mean divides a sum of nothing by a total weight of 0"));
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);  // not refuted by the rows left failing too
  CHECK(has(h, "step 6's batch as a whole gives aten::nll_loss_forward nothing to average: none of its 16 targets "
               "counts (all are ignore_index -100), so its mean divides a sum of nothing by a total weight of 0 "
               "(dataset indices 96,97,98)"));
  CHECK(has(h, "step 6 still fails without rows [0,1,2,3], the rows left giving it nothing to count either"));
  CHECK(has(h, "whether that is bad data is the program's call: unlabelled samples that one batch drew together"));
  auto c = findCulprit(f);
  REQUIRE(c.emptyMean);
  CHECK(c.emptyMean->ignored == 16);
  CHECK_FALSE(c.rows);
  CHECK(c.datasetIndices == std::vector<int64_t>{96, 97, 98});  // the whole batch's
  CHECK(c.op == "aten::nll_loss_forward");
  CHECK(culpritBatchText(c) == "the whole batch, which gives the loss no target to count (all 16 are ignore_index -100)");
  // The rows left, replayed, fail otherwise: no claim that they give the loss nothing either.
  f.withoutRows->firstNonFiniteOp = nonFiniteOp("aten::addmm", {stats(0, 0, -1.0, 1.0)});
  CHECK_FALSE(has(judgeInvalidData(f), "the rows left giving it nothing"));
  CHECK(has(judgeInvalidData(f), "step 6 still fails without rows [0,1,2,3]: no particular sample is needed"));
  f.withoutRows->firstNonFiniteOp = f.replay->firstNonFiniteOp;
  f.withoutRows->firstNonFiniteOp->name = "aten::mean";  // a mean of nothing, but at another op
  CHECK_FALSE(has(judgeInvalidData(f), "the rows left giving it nothing"));
  f.withoutRows->firstNonFiniteOp = f.replay->firstNonFiniteOp;

  // A batch of 100: its first 24 indices, and how many.
  std::vector<int64_t> hundred(100);
  for (int64_t i = 0; i < 100; ++i) hundred[static_cast<size_t>(i)] = 1000 + i;
  CHECK(leadingIndicesText(hundred).find(",1023,... (100 in all)") != std::string::npos);
  CHECK(leadingIndicesText({96, 97}) == "96,97");

  // Some ignored, the rest of classes weighted 0.
  m.ignored = 10;
  CHECK(emptyMeanText(m) == "none of its 16 targets counts (10 are ignore_index -100, the other 6 of classes whose "
                            "weight is 0), so its mean divides a sum of nothing by a total weight of 0");
  f.replay->firstNonFiniteOp->emptyMean = m;
  CHECK(has(judgeInvalidData(f), "the program's call: samples unlabelled or of classes the loss weighs 0 that one"));
  m.ignored = 0;
  CHECK(emptyMeanText(m).find("(all are of classes whose weight is 0)") != std::string::npos);
  f.replay->firstNonFiniteOp->emptyMean = m;
  CHECK(has(judgeInvalidData(f), "the program's call: samples only of classes the loss weighs 0 that one batch drew"));
  Culprit one;
  one.emptyMean = replayer::EmptyMean{false, 1, 1, -100, ""};
  CHECK(culpritBatchText(one) == "the whole batch, which gives the loss no target to count (its one target is ignore_index -100)");
  // An empty tensor: a mask that selected nothing.
  replayer::EmptyMean empty;
  empty.empty = true;
  f.replay->firstNonFiniteOp->name = "aten::mse_loss";
  f.replay->firstNonFiniteOp->emptyMean = empty;
  CHECK(has(judgeLossNumerics(f), "aten::mse_loss (forward, step 6) makes NaN as a mean of nothing: it averages an "
                                  "empty tensor"));
  // The NaN of a division inside the op the step called with the empty tensor.
  empty.of = "aten::mse_loss";
  CHECK(emptyMeanText(empty).rfind("it is the mean aten::mse_loss takes of an empty tensor", 0) == 0);
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK_FALSE(has(h, "whether that is bad data"));  // said of unlabelled targets only

  // Not reproduced: nothing is said of the batch.
  f.replay->verdict = Verdict::NotReproduced;
  f.replay->error.clear();
  CHECK_FALSE(f.emptyMean());
  CHECK_FALSE(findCulprit(f).emptyMean);
}

TEST_CASE("loss-numerics: NaN made of the infinities a mask wrote on purpose is an edge case of the step, unless the "
          "culprit rows hold invalid values",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({3});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::_softmax", {stats(0, 96, -2.0, 3.0)});
  f.replay->firstNonFiniteOp->afterGivenInfinity = true;
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "aten::_softmax (forward, step 6) makes NaN of infinities the step wrote on purpose"));
  CHECK(has(h, "batch row [3] triggers it with values in range: the step cannot handle a legitimate edge case"));

  // Infinities with no op given one before: they came from somewhere else.
  f.replay->firstNonFiniteOp->afterGivenInfinity = false;
  CHECK(judgeLossNumerics(f).verdict == V::Refuted);
  // Given one, but the rows carry Inf of their own: the data's, not the mask's (whether or not the
  // rows were shown to trigger it).
  f.replay->firstNonFiniteOp->afterGivenInfinity = true;
  RowFinding inf;
  inf.row = 3;
  inf.tensor = "steps/6/batch/x";
  inf.kind = RowFinding::Kind::NonFinite;
  inf.infCount = 2;
  f.rowFindings = {inf};
  h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(has(h, "comes from inputs that already hold 96 NaN/Inf"));
  f.withoutRows.reset();
  CHECK(judgeLossNumerics(f).verdict == V::Refuted);
  f.withoutRows = replayOf(Verdict::NotReproduced);
  // A NaN among the inputs is never the mask's.
  f.rowFindings.clear();
  f.replay->firstNonFiniteOp->inputs = {stats(1, 96, -2.0, 3.0)};
  CHECK(judgeLossNumerics(f).verdict == V::Refuted);
}

TEST_CASE("loss-numerics is confirmed when an op makes NaN from finite inputs, and says when an input reaches 0",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::div", {stats(0, 0, 0.0, 3.5), stats(0, 0, 0.0, 0.0)});
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "aten::div (forward, step 6) turns finite inputs into NaN/Inf");
  CHECK(has(h, "an input of aten::div reaches 0 (a division or log of zero?)"));
  CHECK(h.rerun == "crashcap bisect ops crash.ccap");
  // A job's rank has no float64 comparison (bisect ops refuses it): its replay names the op.
  f.job = JobTriage{};
  f.job->worldSize = 2;
  f.job->rank = f.job->askedRank = f.job->firstFailed = 1;
  CHECK(judgeLossNumerics(f).rerun == "crashcap replay crash.ccap");
}

TEST_CASE("loss-numerics is refuted when the first non-finite op was fed NaN, or overflows runaway values, or none is "
          "found",
          "[investigate][triage]") {
  auto fed = reproducedAt6();
  fed.replay->firstNonFiniteOp = nonFiniteOp("aten::mkldnn_convolution", {stats(64, 0, -1.0, 1.0)});
  auto a = judgeLossNumerics(fed);
  CHECK(a.verdict == V::Refuted);
  CHECK(has(a, "comes from inputs that already hold 64 NaN/Inf"));

  auto runaway = reproducedAt6();
  runaway.replay->firstNonFiniteOp = nonFiniteOp("aten::mm", {stats(0, 0, -3e20, 2e20)});
  auto b = judgeLossNumerics(runaway);
  CHECK(b.verdict == V::Refuted);
  CHECK(has(b, "overflows on inputs as large as 3e+20: the values were already diverging"));

  auto none = reproducedAt6();
  auto c = judgeLossNumerics(none);
  CHECK(c.verdict == V::Refuted);
  CHECK(has(c, "no op output went non-finite in the replayed step"));
}

TEST_CASE("loss-numerics is inconclusive when a setting or device change makes the NaN go away, or nothing replayed",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::conv2d", {stats(0, 0, -1.0, 1.0)});
  f.config = configOf(true, {flip("cudnn.benchmark", "true", "false", false)});
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "but it goes away with a change of setting (the step fails as recorded and runs clean with "
               "cudnn.benchmark=false (recorded true))"));

  auto g = f;
  g.config = configOf(true, {flip("cudnn.benchmark", "true", "false", true)}, {onDevice("cuda:0", false)});
  auto k = judgeLossNumerics(g);
  CHECK(k.verdict == V::Inconclusive);
  CHECK(has(k, "a change of device (the step fails on cpu and runs clean on cuda:0)"));

  TriageFacts nothing;
  nothing.bundle = kBundle;
  auto n = judgeLossNumerics(nothing);
  CHECK(n.verdict == V::Inconclusive);
  CHECK(n.evidence == std::vector<std::string>{"replay did not run"});
}

TEST_CASE("loss-numerics is inconclusive when the program died of its signal again and gave no step back",
          "[investigate][triage]") {
  TriageFacts f;
  f.bundle = kBundle;
  f.replay = replayOf(Verdict::Reproduced);
  f.replay->steps.clear();  // nothing in the process could answer
  f.replay->error = "killed by SIGSEGV again, as in the recording";
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "the replay gave no step back (killed by SIGSEGV again, as in the recording)"));
  CHECK_FALSE(has(h, "no op output went non-finite"));
}

TEST_CASE("a NaN made in backward names its autograd node, and why a root's or an arccosine's gradient is infinite "
          "where the op is finite",
          "[investigate][triage]") {
  CHECK(nodeText("SqrtBackward0") == ", in SqrtBackward0, the gradient of sqrt");
  CHECK(nodeText("LinalgVectorNormBackward0") == ", in LinalgVectorNormBackward0, the gradient of linalg_vector_norm");
  CHECK(nodeText("Log1PBackward0") == ", in Log1PBackward0, the gradient of log1p");  // title-cased by torch
  CHECK(nodeText("MaxPool2DWithIndicesBackward0") == ", in MaxPool2DWithIndicesBackward0, the gradient of "
                                                     "max_pool2d_with_indices");
  CHECK(nodeText("MyDistanceBackward") == ", in MyDistanceBackward");  // a Python autograd.Function's: no native op
  CHECK(nodeText("torch::autograd::AccumulateGrad") == ", in torch::autograd::AccumulateGrad");
  CHECK(nodeText("") == "");

  auto f = reproducedAt6();
  f.samples = samplesFound({16});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::div", {stats(0, 0, -0.2, 0.3), stats(0, 0, 0.0, 4.1)});
  f.replay->firstNonFiniteOp->phase = "backward";
  f.replay->firstNonFiniteOp->node = "SqrtBackward0";
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "aten::div (backward, step 6, in SqrtBackward0, the gradient of sqrt) turns finite inputs into NaN/Inf"));
  CHECK(has(h, "the derivative of sqrt is infinite at 0, where its value is finite: a distance or norm taken by hand"));
  CHECK_FALSE(has(h, "a division or log of zero"));  // the node says why
  auto c = findCulprit(f);
  CHECK(c.node == "SqrtBackward0");
  CHECK(c.phase == "backward");

  f.replay->firstNonFiniteOp->node = "PowBackward0";
  CHECK(has(judgeLossNumerics(f), "the derivative of a fractional power (x ** 0.5) is infinite at 0"));
  f.replay->firstNonFiniteOp->node = "PowBackward1";  // a tensor exponent: its gradient takes log(base)
  CHECK_FALSE(has(judgeLossNumerics(f), "the derivative of"));
  f.replay->firstNonFiniteOp->node = "AcosBackward0";
  CHECK(has(judgeLossNumerics(f), "the derivative of acos is infinite at -1 and 1"));
  f.replay->firstNonFiniteOp->node = "AtanhBackward0";  // atanh(1) is itself infinite: the forward's finding
  CHECK_FALSE(has(judgeLossNumerics(f), "the derivative of"));
  // A root's gradient given no 0 (a subnormal value overflowing the division): no claim about 0.
  f.replay->firstNonFiniteOp->node = "SqrtBackward0";
  f.replay->firstNonFiniteOp->inputs = {stats(0, 0, -0.2, 0.3), stats(0, 0, 1e-40, 4.1)};
  CHECK_FALSE(has(judgeLossNumerics(f), "the derivative of sqrt"));
  f.replay->firstNonFiniteOp->inputs = {stats(0, 0, -0.2, 0.3), stats(0, 0, 0.0, 4.1)};
  // A node whose gradient has no such point: only named, and the zero input still said.
  f.replay->firstNonFiniteOp->node = "DivBackward0";
  h = judgeLossNumerics(f);
  CHECK(has(h, "aten::div (backward, step 6, in DivBackward0, the gradient of div)"));
  CHECK_FALSE(has(h, "the derivative of"));
  CHECK(has(h, "an input of aten::div reaches 0 (a division or log of zero?)"));
  // A forward op: no node, the text as before.
  f.replay->firstNonFiniteOp->phase = "forward";
  f.replay->firstNonFiniteOp->node.clear();
  CHECK(has(judgeLossNumerics(f), "aten::div (forward, step 6) turns finite inputs into NaN/Inf"));
  CHECK_FALSE(findCulprit(f).node);
}

TEST_CASE("loss-numerics carries the float64 reference's evidence", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::div", {stats(0, 0, 0.0, 1.0)});
  OpBisection ops;
  ops.step = 6;
  ops.replay.error = "non-finite loss at step 6: nan";
  ops.reference.error = "non-finite loss at step 6: nan";
  ops.reference.firstNonFiniteOp = nonFiniteOp("aten::div", {});
  ops.reference.firstNonFiniteOp->outputs[0].dtype = "Double";  // the reference ran it widened
  replayer::DepartingOp d;
  d.name = "aten::log";
  d.phase = "forward";
  d.error = 0.5;
  d.elements = 3;
  ops.firstDeparting = d;
  f.ops = ops;
  auto h = judgeLossNumerics(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "the float64 CPU replay goes non-finite at aten::div too"));
  CHECK(has(h, "first op departing from float64: aten::log (forward), error 0.5 over 3 elements"));

  // The step narrowed the widened values itself before the op (a .float() after an autocast
  // forward): the reference's non-finite op ran in float32 and proves nothing about its range.
  auto narrowed = f;
  narrowed.ops->reference.firstNonFiniteOp->outputs[0].dtype = "Float";
  auto n = judgeLossNumerics(narrowed);
  CHECK(has(n, "the float64 CPU replay goes non-finite at aten::div too, but that op ran in Float there"));
  CHECK(has(n, "it says nothing about float32 rounding or range"));
  CHECK_FALSE(has(n, "not float32 rounding or range"));
  CHECK(narrowed.ops->referenceFailsTheSameWay());
  CHECK_FALSE(narrowed.ops->failsInFloat64());  // it went non-finite in Float, not in float64
  CHECK(narrowed.ops->referenceNarrowedTo() == "Float");
  CHECK_FALSE(narrowed.ops->referenceNarrowsPastRange());  // its inputs were not finite float64 values
  CHECK_FALSE(narrowed.ops->referenceFailedOtherwise());
  // The op is the narrowing itself, of finite float64 values past float32's range.
  auto cast = narrowed;
  cast.ops->reference.firstNonFiniteOp->name = "aten::_to_copy";
  cast.ops->reference.firstNonFiniteOp->inputs = {stats(0, 0, -1e300, 1e300)};
  cast.ops->reference.firstNonFiniteOp->inputs[0].dtype = "Double";
  CHECK(has(judgeLossNumerics(cast), "the float64 CPU replay's values pass Float's range where the step narrows "
                                     "them itself (aten::_to_copy): the range of the narrower dtype is involved"));
  CHECK(cast.ops->referenceNarrowsPastRange());
  CHECK(f.ops->failsInFloat64());
  CHECK_FALSE(f.ops->referenceNarrowedTo());

  f.ops->reference.error.clear();
  f.ops->reference.firstNonFiniteOp.reset();
  CHECK(has(judgeLossNumerics(f), "the float64 CPU replay of the step runs clean: float32 rounding or range is involved"));
  // The first op departing is infinite in float32 and, in float64, finite past float32's largest
  // value: an overflow (of values a diverging training grew), the range and not the rounding.
  auto overflow = f;
  auto& od = *overflow.ops->firstDeparting;
  od.name = "aten::mse_loss";
  od.replayed = stats(0, 1, std::nullopt, std::nullopt);
  od.replayed.dtype = "Float";
  od.reference = stats(0, 0, 5.16e42, 5.16e42);
  od.reference.dtype = "Double";
  auto past = judgeLossNumerics(overflow);
  CHECK(has(past, "the float64 CPU replay of the step runs clean, where aten::mse_loss (forward) reaches 5.16e+42, "
                  "past float32's largest 3.4e+38: float32's range is involved, not its rounding"));
  CHECK_FALSE(has(past, "float32 rounding or range"));
  od.reference = stats(0, 0, -3e39, 10.0);  // a negative magnitude past the range counts the same
  od.reference.dtype = "Double";
  CHECK(has(judgeLossNumerics(overflow), "reaches 3e+39, past float32's largest"));
  od.replayed.dtype = "Half";  // float16's range is far smaller
  od.reference = stats(0, 0, 1.0, 7e4);
  CHECK(has(judgeLossNumerics(overflow), "reaches 7e+04, past float16's largest 6.55e+04: float16's range"));
  // Within float32's range in float64: rounding alone may have made it (a denominator rounded to 0).
  od.replayed.dtype = "Float";
  CHECK(has(judgeLossNumerics(overflow), "float32 rounding or range is involved"));
  od.reference = stats(0, 0, 1e40, 1e40);
  od.replayed = stats(0, 0, 1.0, 2.0);  // finite in the replay: a departure, not an overflow
  od.replayed.dtype = "Float";
  CHECK(has(judgeLossNumerics(overflow), "float32 rounding or range is involved"));
  od.replayed = stats(0, 1, std::nullopt, std::nullopt);
  od.replayed.dtype = "Float";
  od.reference = stats(1, 0, 1e40, 1e40);  // the reference holds a NaN of its own: no claim of range
  od.reference.dtype = "Double";
  CHECK(has(judgeLossNumerics(overflow), "float32 rounding or range is involved"));
  // An error that is no NaN (a dtype mismatch under autocast) and is gone in float64: the dtype.
  auto raised = f;
  raised.replay->firstNonFiniteOp.reset();
  raised.replay->error = "RuntimeError: expected scalar type BFloat16 but found Float";
  auto dtype = judgeLossNumerics(raised);
  CHECK(dtype.verdict == V::Refuted);
  CHECK(has(dtype, "the float64 CPU replay of the step runs clean: the error depends on the dtype the step runs in"));
  CHECK_FALSE(has(dtype, "float32 rounding or range is involved"));
  raised.replay->error = "non-finite loss at step 6: nan";  // a NaN no op output showed: still the values
  CHECK(has(judgeLossNumerics(raised), "float32 rounding or range is involved"));

  // A reference that failed its own way (a float32 tensor the step makes) is not "fails in float64".
  f.ops->reference.error = "RuntimeError: expected scalar type Double but found Float";
  auto other = judgeLossNumerics(f);
  CHECK_FALSE(has(other, "the float64 CPU replay fails with the same error"));
  CHECK(has(other, "the float64 CPU replay could not run the step (RuntimeError: expected scalar type Double but found "
                   "Float): it says nothing about precision"));
}

TEST_CASE("optimizer-divergence is confirmed when the weight norm runs away, with the learning-rate jump",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.steps = stepsWith({1.0, 2.0, 40.0, 500.0}, {0.01, 0.01, 10, 10, 10});
  f.steps->firstFailure = replayer::FirstFailure{6, "loss"};
  auto h = judgeOptimizerDivergence(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "the weight norm grows from 1 to 500 over steps 2..5 before step 6 fails");
  CHECK(has(h, "the learning rate jumps from 0.01 to 10 at step 4, before the weights run away"));
  CHECK(has(h, "first step whose loss, gradients or weights go non-finite: 6 (loss)"));
  CHECK(h.rerun == "crashcap bisect steps crash.ccap");

  auto inf = reproducedAt6();
  inf.steps = stepsWith({1.0, 1.0, INFINITY, std::nullopt}, {0.1, 0.1, 0.1, 0.1, 0.1});
  CHECK(judgeOptimizerDivergence(inf).verdict == V::Confirmed);
}

TEST_CASE("optimizer-divergence names the learning-rate jump before the weights run away, not a warm-up's first "
          "increase",
          "[investigate][triage]") {
  // A warm-up 0.002 -> 0.004 -> 0.006, then a schedule bug: 100 from step 5; the weights run
  // away after step 5's update.
  auto f = reproducedAt6();
  f.steps = stepsWith({1.0, 1.1, 1.2, 300.0}, {0.002, 0.004, 0.006, 100, 100});
  auto h = judgeOptimizerDivergence(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "the learning rate jumps from 0.006 to 100 at step 5"));
  CHECK_FALSE(has(h, "from 0.002"));

  // A jump after the weights already ran away is not named as their cause.
  auto late = reproducedAt6();
  late.steps = stepsWith({1.0, 50.0, 400.0, 900.0}, {0.1, 0.1, 0.1, 0.1, 5});
  CHECK_FALSE(has(judgeOptimizerDivergence(late), "learning rate jumps"));
}

TEST_CASE("optimizer-divergence is refuted when the weight norm stays within twice its start", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.steps = stepsWith({1.0, 1.1, 1.3, 1.2}, {0.1, 0.1, 0.1, 0.1, 0.1});
  auto h = judgeOptimizerDivergence(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(has(h, "the weight norm stays within 1..1.3 up to the failing step"));

  // Weights that shrink (weight decay, an accumulation's few updates) are named by their range,
  // not from their first value to a maximum that is that first value.
  f.steps = stepsWith({3.611, 3.609, 3.606, 3.604}, {0.1, 0.1, 0.1, 0.1, 0.1});
  CHECK(has(judgeOptimizerDivergence(f), "the weight norm stays within 3.604..3.611 up to the failing step"));
}

TEST_CASE("optimizer-divergence is refuted when one update makes level weights non-finite from a step like the ones "
          "before",
          "[investigate][triage]") {
  // A step that ran a second backward() with an Inf loss: its fingerprint (the first backward's
  // loss and gradients) is like every step's before, and its update makes the weights NaN.
  auto f = reproducedAt6();
  f.steps = stepsWith({2.59, 2.6, 2.6, NAN}, {1e-3, 1e-3, 1e-3, 1e-3, 1e-3});
  for (auto& s : f.steps->steps) {
    s.hasLoss = s.hasGradNorm = true;
    s.loss = 0.7;
    s.gradNorm = s.step == 4 ? 0.8 : 0.5;
  }
  f.steps->steps.back().loss = NAN;  // the target, on the weights the update broke
  auto h = judgeOptimizerDivergence(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(h.evidence.at(0) == "the weight norm stays within 2.59..2.6 up to step 4, then step 5's update alone makes the "
                            "weights non-finite: no growth");
  CHECK(has(h, "step 5's loss (0.7) and gradient norm (0.5) are finite and like the steps' before, at learning rate "
               "0.001: the update used values"));
  CHECK(has(h, "the step to look at is 5"));

  // Gradients far larger than before explode the update: that is a divergence.
  auto exploding = f;
  exploding.steps->steps[3].gradNorm = 1e30;
  CHECK(judgeOptimizerDivergence(exploding).verdict == V::Confirmed);
  // So is a learning rate that jumped.
  auto lr = f;
  lr.steps->steps[3].learningRate = 1e5;
  CHECK(judgeOptimizerDivergence(lr).verdict == V::Confirmed);
  // And weights that grew before they went non-finite.
  auto grew = f;
  grew.steps->steps[2].weightNorm = 40.0;
  CHECK(judgeOptimizerDivergence(grew).verdict == V::Confirmed);
  // A non-finite loss or gradient norm in that step is the step's own failure, not one the
  // fingerprint missed: the weights running away is then what it led to.
  auto lossNan = f;
  lossNan.steps->steps[3].gradNorm = NAN;
  CHECK(judgeOptimizerDivergence(lossNan).verdict == V::Confirmed);
}

TEST_CASE("optimizer-divergence is inconclusive on moderate growth, on no weight norm, and without the step history",
          "[investigate][triage]") {
  auto grows = reproducedAt6();
  grows.steps = stepsWith({1.0, 3.0, 6.0, 10.0}, {0.1, 0.1, 0.1, 0.1, 0.1});
  auto a = judgeOptimizerDivergence(grows);
  CHECK(a.verdict == V::Inconclusive);
  CHECK(has(a, "the weight norm grows 10.0x: not conclusive"));

  // Unknown is not infinite: a crash in the first replayed step has no weight norm at all.
  auto unknown = reproducedAt6();
  unknown.steps = stepsWith({std::nullopt, std::nullopt, std::nullopt, std::nullopt}, {0.1, 0.1, 0.1, 0.1, 0.1});
  auto b = judgeOptimizerDivergence(unknown);
  CHECK(b.verdict == V::Inconclusive);
  CHECK(has(b, "no weight norm to compare"));
  CHECK_FALSE(has(b, "inf"));

  auto none = reproducedAt6();
  CHECK(judgeOptimizerDivergence(none).verdict == V::Inconclusive);
}

TEST_CASE("device-specific is confirmed when another device changes the outcome, refuted when it fails there too",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.config = configOf(true, {}, {onDevice("cuda:0", false)});
  auto h = judgeDeviceSpecific(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "the step fails on cpu and runs clean on cuda:0");
  CHECK(h.rerun == "crashcap bisect config crash.ccap");

  f.config = configOf(true, {}, {onDevice("cuda:0", true)});
  auto g = judgeDeviceSpecific(f);
  CHECK(g.verdict == V::Refuted);
  CHECK(g.evidence.at(0) == "the step fails on cpu and on cuda:0");
}

TEST_CASE("device-specific is inconclusive with one device here, pointing at the recorded device when it is elsewhere",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.config = configOf(true, {});
  auto h = judgeDeviceSpecific(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(h.evidence.at(0) == "only cpu is here to replay on; another device would tell");

  auto elsewhere = reproducedAt6();
  elsewhere.replay->recordedDevice = "cuda:0";
  elsewhere.config = configOf(false, {});
  auto g = judgeDeviceSpecific(elsewhere);
  CHECK(g.verdict == V::Inconclusive);
  CHECK(has(g, "recorded on cuda:0, which is not here; on cpu the step runs clean, which points at the device or its "
               "driver: replay it on a machine with cuda:0"));

  auto unfinished = reproducedAt6();
  CHECK(judgeDeviceSpecific(unfinished).evidence.at(0) == "config bisection did not finish");
}

TEST_CASE("config-dependent is confirmed by a single setting flip that changes the outcome, refuted when none does",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.config = configOf(true, {flip("cudnn.benchmark", "true", "false", false), flip("torch.threads", "2", "1", true)});
  auto h = judgeConfigDependent(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(h.evidence.at(0) == "the step fails as recorded and runs clean with cudnn.benchmark=false (recorded true)");

  f.config = configOf(true, {flip("cudnn.benchmark", "true", "false", true), flip("torch.threads", "2", "1", true)});
  auto g = judgeConfigDependent(f);
  CHECK(g.verdict == V::Refuted);
  CHECK(g.evidence.at(0) == "the step fails under each of 2 single-setting changes");
}

TEST_CASE("a setting flip that breaks the replay another way does not confirm config-dependent, and is named as such",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  auto breaks = flip("torch.autocast", "false", "true", false);
  breaks.otherFailure = "step 4 throws: expected scalar type BFloat16 but found Float";
  f.config = configOf(true, {breaks, flip("torch.threads", "1", "2", true)});
  auto h = judgeConfigDependent(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(h.evidence.at(0) == "the step fails under each of 1 single-setting changes");
  CHECK(h.evidence.at(1) ==
        "torch.autocast=true (step 4 throws: expected scalar type BFloat16 but found Float) breaks the replay another "
        "way, which says nothing about this failure");

  f.config = configOf(true, {breaks});
  auto g = judgeConfigDependent(f);
  CHECK(g.verdict == V::Inconclusive);
  CHECK(g.evidence.at(0).rfind("torch.autocast=true (step 4 throws", 0) == 0);
}

TEST_CASE("config-dependent is inconclusive when the step passes and no flip makes it fail, and notes CPU replays of "
          "GPU recordings",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.replay->recordedDevice = "cuda:0";
  f.config = configOf(false, {flip("cudnn.benchmark", "true", "false", false)});
  auto h = judgeConfigDependent(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(h.evidence.at(0) == "no single setting change makes the step fail");
  CHECK(has(h, "cudnn.* and TF32 settings do not change CPU kernels: replay on cuda:0 for them to count"));

  // The settings config bisection left untried on the CPU are named, and where they would count.
  f.config->notTried = {"cudnn.enabled", "cuda.matmul.allow_tf32"};
  auto g = judgeConfigDependent(f);
  CHECK(has(g, "cudnn.enabled, cuda.matmul.allow_tf32 not tried: they change only CUDA kernels, and the replay runs on "
               "the CPU: replay on cuda:0 for them to count"));
  CHECK_FALSE(has(g, "cudnn.* and TF32 settings do not change CPU kernels"));
  // Of a training recorded on the CPU they say nothing: not named.
  f.replay->recordedDevice = "cpu";
  CHECK_FALSE(has(judgeConfigDependent(f), "not tried"));
}

TEST_CASE("config-dependent is refuted by a failure under every flip tried only when no setting that could count was "
          "left untried",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.replay->recordedDevice = "cpu";
  f.config = configOf(true, {flip("torch.threads", "1", "2", true), flip("torch.autocast", "false", "true", true)});
  f.config->notTried = {"cudnn.enabled", "cudnn.benchmark"};
  auto h = judgeConfigDependent(f);
  CHECK(h.verdict == V::Refuted);  // recorded on the CPU: the CUDA-only settings never acted
  CHECK(h.evidence.at(0) == "the step fails under each of 2 single-setting changes");
  // Recorded on a GPU and replayed on the CPU: cudnn.benchmark may be the one, and was not tried.
  f.replay->recordedDevice = "cuda:0";
  auto g = judgeConfigDependent(f);
  CHECK(g.verdict == V::Inconclusive);
  CHECK(g.evidence.at(0) == "the step fails under each of 2 single-setting changes");
  CHECK(has(g, "cudnn.enabled, cudnn.benchmark not tried: they change only CUDA kernels, and the replay runs on the "
               "CPU: replay on cuda:0 for them to count"));
  // Replayed on the recorded GPU, every setting tried: refuted again.
  f.config->baseline.device = "cuda:0";
  f.config->notTried.clear();
  CHECK(judgeConfigDependent(f).verdict == V::Refuted);
}

TEST_CASE("nondeterminism is refuted by a bitwise replay or bitwise steps before a reproduced failure, confirmed by a "
          "divergence, inconclusive otherwise",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  auto h = judgeNondeterminism(f);
  CHECK(h.verdict == V::Refuted);
  CHECK(h.evidence.at(0) == "replay matched the recording bit for bit over 3 steps");
  CHECK(h.rerun == "crashcap replay crash.ccap");

  f.replay->verdict = Verdict::Diverged;
  f.replay->divergedAt = 5;
  auto g = judgeNondeterminism(f);
  CHECK(g.verdict == V::Confirmed);
  CHECK(g.evidence.at(0) == "replay departs from the recording at step 5");

  // The step bisection, from an earlier keyframe, matched every step through 5: the departure
  // comes from where the replay started (state the newer keyframe does not hold).
  f.replay->keyframe = 4;
  StepBisection fromStart;
  fromStart.fromKeyframe = 0;
  fromStart.target = 6;
  for (int64_t s = 0; s <= 6; ++s) {
    replayer::StepReplay step;
    step.step = s;
    step.recorded = step.bitwise = s < 6;
    fromStart.steps.push_back(step);
  }
  f.steps = fromStart;
  auto e = judgeNondeterminism(f);
  CHECK(e.verdict == V::Refuted);
  CHECK(e.evidence.at(0) == "the replay from keyframe 4 departs from the recording at step 5, but from keyframe 0 (bisect "
                            "steps) every step through 5 matches it bit for bit: the computation is deterministic, and "
                            "the program keeps state between steps that keyframe 4 does not hold (an attribute of an "
                            "object of its own, a tensor it keeps)");
  f.steps->steps[3].bitwise = false;  // it departed too, earlier: nondeterminism stays confirmed
  CHECK(judgeNondeterminism(f).verdict == V::Confirmed);
  f.steps->steps[3].bitwise = true;
  f.steps->divergedAt = 5;
  CHECK(judgeNondeterminism(f).verdict == V::Confirmed);
  f.steps->divergedAt.reset();
  f.steps->fromKeyframe = 4;  // from the same keyframe: no other start to compare with
  CHECK(judgeNondeterminism(f).verdict == V::Confirmed);
  f.steps.reset();

  f.replay->verdict = Verdict::Reproduced;
  f.replay->divergedAt.reset();
  auto k = judgeNondeterminism(f);
  CHECK(k.verdict == V::Inconclusive);
  CHECK(k.evidence.at(0) == "replay verdict reproduced");

  // The steps before the target matched their recorded fingerprints bit for bit: the replay is
  // deterministic where it can be checked. Reproduced with another error text refutes it; a
  // failing step that ran clean (a SIGKILL from outside) leaves it open, saying why.
  for (auto& s : f.replay->steps)
    if (s.step < 6) s.recorded = s.bitwise = true;
  auto m = judgeNondeterminism(f);
  CHECK(m.verdict == V::Refuted);
  CHECK(m.evidence.at(0) == "the 2 replayed steps with a recorded fingerprint matched it bit for bit, and the failure "
                            "came back (verdict reproduced: its error's text differs)");
  f.replay->verdict = Verdict::NotReproduced;
  f.replay->error.clear();
  auto n = judgeNondeterminism(f);
  CHECK(n.verdict == V::Inconclusive);
  CHECK(n.evidence.at(0) == "the 2 replayed steps with a recorded fingerprint matched it bit for bit, but the failing "
                            "step ran clean here (verdict not-reproduced): a cause outside the step's computation, or a "
                            "race within it");
  // The recorded error came after the step's update (a validation pass): no step holds it.
  f.crashPhase = "between-steps";
  REQUIRE(f.failedOutsideReplay());
  auto b = judgeNondeterminism(f);
  CHECK(b.verdict == V::Inconclusive);  // what runs between steps is not replayed, so not tested either way
  CHECK(b.evidence.at(0) == "the 2 replayed steps with a recorded fingerprint matched it bit for bit; the recorded error "
                            "came after step 6's update, between steps (in what the loop runs after optimizer.step(): a "
                            "scheduler, a validation pass, a checkpoint, logging), and step 6 replays clean, which a "
                            "replay does not run: a cause there (or a device's asynchronous error surfacing at its first "
                            "sync) is not tested");
  CHECK(judgeInvalidData(f).verdict == V::Inconclusive);
  CHECK(has(judgeInvalidData(f), "the batches the steps consumed are not where it failed"));
  // After the step's backward() (phase optimizer): a replay ends the failing step there.
  f.crashPhase = "optimizer";
  REQUIRE(f.failedOutsideReplay());
  CHECK(judgeNondeterminism(f).evidence.at(0) ==
        "the 2 replayed steps with a recorded fingerprint matched it bit for bit; the recorded error came in step 6 "
        "after its backward() (in the optimizer's update, or in what the loop runs before it: gradient clipping, "
        "logging, a file it writes), and step 6 replays clean up to its backward(), which a replay does not run: a cause "
        "there (or a device's asynchronous error surfacing at its first sync) is not tested");
  f.crashPhase = "forward";
  CHECK_FALSE(f.failedOutsideReplay());
  f.replay->steps[0].bitwise = false;
  CHECK(judgeNondeterminism(f).evidence.at(0) == "replay verdict not-reproduced");
}

TEST_CASE("no rule reads a replay that could not reach the failing step as a finding", "[investigate][triage]") {
  // The recording lost step 5 between keyframe 4 and the failing step 6: replay stopped at 4.
  auto f = reproducedAt6();
  f.replay->verdict = Verdict::RecordingIncomplete;
  f.replay->lostSteps = {5};
  f.replay->steps.resize(1);
  f.steps = StepBisection{};
  f.steps->fromKeyframe = 4;
  f.steps->target = 6;
  f.steps->lostSteps = {5};
  f.steps->steps = f.replay->steps;
  const std::string why =
      "the recording lost step 5 of the replay window (keyframe 4 to step 6): replay cannot test the failing step, "
      "which says nothing about the training";
  REQUIRE(f.replayBlocked() == why);
  for (const auto& h : judge(f)) {
    INFO(h.id);
    CHECK(h.verdict == V::Inconclusive);
    REQUIRE(!h.evidence.empty());
    CHECK(h.evidence.front() == why);
  }
  CHECK_FALSE(findCulprit(f).rows);

  // A replay that did not run at all says why, rather than "does not reproduce".
  TriageFacts none;
  none.bundle = kBundle;
  none.replayOutcome = "failed: step 6 is not in crash.ccap";
  for (const auto& h : judge(none)) {
    INFO(h.id);
    CHECK(h.verdict == V::Inconclusive);
    REQUIRE(!h.evidence.empty());
    CHECK(h.evidence.front() == "replay could not run (failed: step 6 is not in crash.ccap), so nothing was tested");
  }
}

TEST_CASE("the rule table judges every hypothesis once, in the order the table prints", "[investigate][triage]") {
  auto hypotheses = judge(reproducedAt6());
  std::vector<std::string> ids;
  for (const auto& h : hypotheses) ids.push_back(h.id);
  CHECK(ids == std::vector<std::string>{"invalid-data", "loss-numerics", "optimizer-divergence", "device-specific",
                                        "config-dependent", "nondeterminism"});
  for (size_t i = 0; i < ids.size(); ++i) CHECK(triageRules()[i].id == ids[i]);
}

TEST_CASE("the culprit names rows only when they trigger the failure", "[investigate][triage]") {
  auto f = reproducedAt6();
  f.samples = samplesFound({3});
  f.samples->datasetIndices = std::vector<int64_t>{51};
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::conv2d", {stats(64, 0, 0.0, 1.0)});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  auto c = findCulprit(f);
  CHECK(c.step == 6);
  CHECK(c.rows == std::vector<int64_t>{3});
  CHECK(c.datasetIndices == std::vector<int64_t>{51});
  CHECK(c.op == "aten::conv2d");
  CHECK(c.phase == "forward");

  f.withoutRows = replayOf(Verdict::Reproduced);  // any row fails: not the data
  auto d = findCulprit(f);
  CHECK_FALSE(d.rows);
  CHECK_FALSE(d.datasetIndices);
}

TEST_CASE("the culprit of an error is the op it came out of, not an earlier op's non-finite output", "[investigate][triage]") {
  // An attention's -inf mask before a loss that raises on a label out of range.
  auto f = reproducedAt6();
  f.replay->error = "IndexError: Target 99 is out of bounds.";
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::softmax", {stats(0, 4, -3.0, 2.0)});
  f.replay->raisingOp = nonFiniteOp("aten::cross_entropy_loss", {stats(0, 0, -2.0, 2.0)});
  auto c = findCulprit(f);
  CHECK(c.op == "aten::cross_entropy_loss");
  CHECK(c.phase == "forward");
}

namespace {

void writeInts(formats::BundleWriter& w, const std::string& name, const std::vector<int64_t>& values) {
  w.writeTensor(formats::batchTensorName(6, name), formats::DType::Int64, {static_cast<int64_t>(values.size())},
                values.data(), values.size() * sizeof(int64_t));
}

/// Step 6's StepBegin record over `names` (each with rows in its first dimension), and the seal.
void sealStep6(formats::BundleWriter& w, std::initializer_list<const char*> names) {
  formats::StepBeginData begin;
  begin.step = 6;
  for (const char* name : names) begin.batch.push_back(formats::batchTensorName(6, name));
  begin.rowDims.assign(names.size(), 0);
  formats::writeMetaRecord(w, begin);
  w.seal();
}

}  // namespace

TEST_CASE("row findings judge an index against the domain its tensor's other rows fit, and a loss's ignore_index is "
          "inside",
          "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    writeInts(*w, "user", {1, 4, 9, 5, 0, 2, 7, 3});           // row 3 ordinary
    writeInts(*w, "item", {10, 99, 42, 150, 7, 88, 61, 0});   // row 3 outside the item table
    writeInts(*w, "label", {2, -100, 0, -1, 1, -100, 2, 0});  // -100 ignored, row 3's -1 is not
    sealStep6(*w, {"user", "item", "label"});
  }
  // Two embedding tables indexed by same-shaped tensors, and a loss.
  const std::vector<IndexDomain> domains = {
      {"aten::embedding", 10, {8}, {10, 4}, std::nullopt},
      {"aten::embedding", 120, {8}, {120, 4}, std::nullopt},
      {"aten::nll_loss", 3, {8}, {8, 3}, -100},
  };
  auto findings = findRowOddities(bundle, 6, {3}, domains);
  REQUIRE(findings.size() == 2);
  CHECK(findings[0].tensor == "steps/6/batch/item");
  CHECK(findings[0].kind == RowFinding::Kind::OutOfDomain);
  CHECK(findings[0].value == 150);
  CHECK(findings[0].domain->size == 120);  // not the user table, which item's other rows do not fit
  CHECK(findings[0].otherDomains.empty());  // item's other rows fit neither the user table nor the loss
  CHECK(findings[1].tensor == "steps/6/batch/label");
  CHECK(findings[1].value == -1);
  CHECK(findings[1].domain->op == "aten::nll_loss");

  // A row whose values are all ordinary gives nothing.
  CHECK(findRowOddities(bundle, 6, {0}, domains).empty());
}

TEST_CASE("a row outside a domain matched by shape alone says which other ops take a tensor of that shape",
          "[investigate][triage]") {
  // A language model's batch: tokens and the next tokens, of one shape; a token past the vocabulary
  // in row 3 is in both. The embedding takes [8,3], the loss its flattened 24 targets.
  test::TempDir dir;
  const std::string bundle = dir.file("lm.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    std::vector<int64_t> x(24), y(24);
    for (int64_t i = 0; i < 24; ++i) x[i] = (i * 7) % 40, y[i] = (i * 7 + 7) % 40;
    x[10] = 41;  // row 3, second token
    y[9] = 41;   // the same token, one place earlier among the targets
    w->writeTensor(formats::batchTensorName(6, "0"), formats::DType::Int64, {8, 3}, x.data(), x.size() * 8);
    w->writeTensor(formats::batchTensorName(6, "1"), formats::DType::Int64, {8, 3}, y.data(), y.size() * 8);
    sealStep6(*w, {"0", "1"});
  }
  const IndexDomain embedding{"aten::embedding", 40, {8, 3}, {40, 24}, std::nullopt};
  // The loss as traced: cross_entropy_loss on [8,3,40] logits, nll_loss2d on them reshaped: one domain.
  auto findings = findRowOddities(bundle, 6, {3},
                                  {embedding, {"aten::cross_entropy_loss", 40, {8, 3}, {8, 40, 3}, -100},
                                   {"aten::nll_loss2d", 40, {8, 3, 1}, {8, 40, 3, 1}, -100}});
  REQUIRE(findings.size() == 2);
  for (const auto& f : findings) {
    CHECK(f.value == 41);
    CHECK(f.domain->op == "aten::embedding");  // the newest domain first, as the trace gives them
    REQUIRE(f.otherDomains.size() == 1);
    CHECK(f.otherDomains[0].first.op == "aten::cross_entropy_loss");
    CHECK(f.otherDomains[0].second == 41.0);
  }
  auto facts = reproducedAt6();
  facts.samples = samplesFound({3});
  facts.withoutRows = replayOf(Verdict::NotReproduced);
  facts.rowFindings = {findings[1]};
  CHECK(has(judgeInvalidData(facts),
            "row 3 of steps/6/batch/1 holds 41, outside 0..39: the embedding (aten::embedding) has 40 rows (table "
            "[40,24]); its shape fits another op's input as well: the loss (aten::cross_entropy_loss) sees 40 classes "
            "(logits [8,40,3]), and 41 is outside 0..39 there too"));

  // A loss with more classes than the table has rows: the targets' 41 would fit it.
  findings = findRowOddities(bundle, 6, {3}, {embedding, {"aten::nll_loss", 50, {24}, {24, 50}, -100}});
  REQUIRE(findings.size() == 2);
  REQUIRE(findings[1].otherDomains.size() == 1);
  CHECK_FALSE(findings[1].otherDomains[0].second);
  facts.rowFindings = {findings[1]};
  // Still outside the embedding's rows, which no other row of the tensor is: invalid by that domain.
  CHECK(judgeInvalidData(facts).verdict == V::Confirmed);
  CHECK(has(judgeInvalidData(facts), "; its shape fits another op's input as well: the loss (aten::nll_loss) sees 50 "
                                     "classes (logits [24,50]), and its values are within 0..49 there"));

  // A domain the step's error names is the check that failed: no rivals are listed.
  auto raised = domainOfError("IndexError: index 41 is out of bounds for dimension 0 with size 40");
  REQUIRE(raised);
  findings = findRowOddities(bundle, 6, {3}, {*raised, embedding});
  REQUIRE_FALSE(findings.empty());
  CHECK(findings[0].domain->raisedValue);
  CHECK(findings[0].otherDomains.empty());
}

TEST_CASE("a domain applies to a batch tensor its op's index input is a slice or a column of, by shape, and the "
          "finding says so",
          "[investigate][triage]") {
  // A language model's batch of [8,4] tokens, which the program feeds as tokens[:, :-1] ([8,3]) to
  // its embedding; row 3's second token is past the vocabulary. And [8,2] labels of which the loss
  // takes column 0.
  test::TempDir dir;
  const std::string bundle = dir.file("sliced.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    std::vector<int64_t> x(32), labels(16);
    for (int64_t i = 0; i < 32; ++i) x[i] = (i * 7) % 40;
    x[13] = 41;  // row 3, second token
    for (int64_t r = 0; r < 8; ++r) labels[2 * r] = r % 5, labels[2 * r + 1] = 1;
    labels[2 * 5] = 7;  // row 5's label, beyond 5 classes
    w->writeTensor(formats::batchTensorName(6, "tokens"), formats::DType::Int64, {8, 4}, x.data(), x.size() * 8);
    w->writeTensor(formats::batchTensorName(6, "labels"), formats::DType::Int64, {8, 2}, labels.data(), labels.size() * 8);
    sealStep6(*w, {"tokens", "labels"});
  }
  const IndexDomain embedding{"aten::embedding", 40, {8, 3}, {40, 16}, std::nullopt};
  auto findings = findRowOddities(bundle, 6, {3}, {embedding});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/tokens");
  CHECK(findings[0].value == 41);
  CHECK(findings[0].domain->wholeShape == std::vector<int64_t>{8, 4});
  CHECK(findRowOddities(bundle, 6, {2}, {embedding}).empty());  // row 2's tokens fit
  auto facts = reproducedAt6();
  facts.samples = samplesFound({3});
  facts.withoutRows = replayOf(Verdict::NotReproduced);
  facts.rowFindings = findings;
  CHECK(judgeInvalidData(facts).verdict == V::Confirmed);
  CHECK(has(judgeInvalidData(facts),
            "row 3 of steps/6/batch/tokens holds 41, outside 0..39: the embedding (aten::embedding) has 40 rows (table "
            "[40,16]); the op's index input [8,3] is shaped like a part of this [8,4] tensor (a slice or a column of "
            "it), which may not hold the 41"));
  // The loss's [8] targets: a column of the [8,2] labels (the tokens' other rows hold 7..39: not 5 classes).
  const IndexDomain loss{"aten::nll_loss", 5, {8}, {8, 5}, -100};
  findings = findRowOddities(bundle, 6, {5}, {loss});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/labels");
  CHECK(findings[0].value == 7);
  CHECK(findings[0].domain->wholeShape == std::vector<int64_t>{8, 2});
  // A domain of the tensor's whole shape comes first, whatever the trace's order: a label column's
  // loss ([8]) and a loss over both columns ([8,2], flattened by the program) of 8 classes.
  const IndexDomain whole{"aten::nll_loss", 8, {8, 2}, {16, 8}, -100};
  findings = findRowOddities(bundle, 6, {5}, {loss, whole});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].domain->size == 5);  // 7 fits the 8 classes; outside the column's 5 only
  findings = findRowOddities(bundle, 6, {5}, {{"aten::nll_loss", 7, {8}, {8, 7}, -100}, {"aten::nll_loss", 6, {8, 2}, {16, 6}, -100}});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].domain->size == 6);  // both say 7 is outside: the whole shape's is named
  CHECK(findings[0].domain->wholeShape.empty());
  // An input that does not keep the rows whole ([4,3]: half the batch) is no part of a batch tensor.
  const IndexDomain halfRows{"aten::embedding", 40, {4, 3}, {40, 16}, std::nullopt};
  CHECK(findRowOddities(bundle, 6, {3}, {halfRows}).empty());
  // Nor is one larger than the tensor in a dimension ([8,5]).
  const IndexDomain wider{"aten::embedding", 40, {8, 5}, {40, 16}, std::nullopt};
  CHECK(findRowOddities(bundle, 6, {3}, {wider}).empty());
}

namespace {

/// A bundle whose training steps (step 6's batch of 20 rows: "x" [20,8], "tokens" [20,12]) ran a
/// loss over 4 classes and an embedding of 40 rows, and whose crash between steps, with `error`,
/// kept another loader's batch of 16 rows: "0" [16,8] floats, "1" [16] labels, "tokens" [16,12]
/// and the dataset indices 232..247, changed by `edit` first.
std::string otherBatchBundle(test::TempDir& dir, const std::string& file, const std::string& error,
                             const std::function<void(std::vector<float>&, std::vector<int64_t>&, std::vector<int64_t>&)>& edit) {
  const std::string bundle = dir.file(file);
  auto w = formats::BundleWriter::create(bundle);
  std::vector<float> x(20 * 8, 0.5f);
  std::vector<int64_t> steps(20 * 12, 1);
  w->writeTensor(formats::batchTensorName(6, "x"), formats::DType::Float32, {20, 8}, x.data(), x.size() * 4);
  w->writeTensor(formats::batchTensorName(6, "tokens"), formats::DType::Int64, {20, 12}, steps.data(), steps.size() * 8);
  formats::StepBeginData begin;
  begin.step = 6;
  begin.batch = {formats::batchTensorName(6, "x"), formats::batchTensorName(6, "tokens")};
  begin.rowDims = {0, 0};
  formats::writeMetaRecord(*w, begin);
  formats::OpTraceData trace;
  trace.capacity = 16;
  for (auto [name, inputs] : std::vector<std::pair<std::string, std::vector<formats::OpInputData>>>{
           {"aten::embedding", {{"float32", {40, 16}}, {"int64", {20, 12}}}},
           {"aten::nll_loss_nd", {{"float32", {20, 4}}, {"int64", {20}}}}}) {
    formats::OpData o;
    o.index = trace.ops.size();
    o.name = name;
    o.phase = "forward";
    o.step = 6;
    o.inputs = inputs;
    trace.ops.push_back(std::move(o));
  }
  trace.totalOps = trace.ops.size();
  formats::writeMetaRecord(*w, trace);
  std::vector<float> features(16 * 8);
  std::vector<int64_t> labels(16), tokens(16 * 12), index(16);
  for (size_t i = 0; i < features.size(); ++i) features[i] = 0.01f * static_cast<float>(i % 13);
  for (int64_t r = 0; r < 16; ++r) labels[r] = r % 4, index[r] = 232 + r;
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7) % 40);
  edit(features, labels, tokens);
  auto name = [](const char* n) { return formats::batchTensorName(formats::kCrashBatchStep, n); };
  w->writeTensor(name("0"), formats::DType::Float32, {16, 8}, features.data(), features.size() * 4);
  w->writeTensor(name("1"), formats::DType::Int64, {16}, labels.data(), labels.size() * 8);
  w->writeTensor(name("tokens"), formats::DType::Int64, {16, 12}, tokens.data(), tokens.size() * 8);
  w->writeTensor(name("index"), formats::DType::Int64, {16}, index.data(), index.size() * 8);
  formats::CrashData crash;
  crash.kind = "exception";
  crash.step = 6;
  crash.phase = "between-steps";
  crash.error = error;
  crash.otherLoader = 1;
  crash.otherBatch = {name("0"), name("1"), name("tokens"), name("index")};
  crash.otherRowDims = {0, 0, 0, 0};
  formats::writeMetaRecord(*w, crash);
  w->seal();
  return bundle;
}

/// Facts of a crash between steps after step 6, which replays clean, holding `findings` of
/// DataLoader #1's batch.
TriageFacts betweenStepsAfter6(const std::string& error, std::vector<RowFinding> findings) {
  auto f = reproducedAt6();
  f.replay = replayOf(Verdict::NotReproduced);
  f.replay->recordedError = error;
  f.crashStep = 6;
  f.crashPhase = "between-steps";
  f.crashError = error;
  f.otherLoader = 1;
  f.otherBatchJudged = true;
  f.otherBatchFindings = std::move(findings);
  return f;
}

}  // namespace

TEST_CASE("another loader's batch kept at a crash between steps is judged row by row against its other rows, and "
          "confirms invalid-data where a row holds the index the error is about",
          "[investigate][triage]") {
  test::TempDir dir;
  // A validation pass's label 9 of 4 classes, in row 5 (dataset index 237); the error names it.
  const std::string target = "Traceback (most recent call last):\n  ...\nIndexError: Target 9 is out of bounds.";
  auto bundle = otherBatchBundle(dir, "label.ccap", target, [](auto&, auto& labels, auto&) { labels[5] = 9; });
  auto findings = findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value();
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].row == 5);
  CHECK(findings[0].tensor == "crash/batch/1");
  CHECK(findings[0].value == 9);
  CHECK(findings[0].datasetIndex == 237);
  auto f = betweenStepsAfter6(target, findings);
  REQUIRE(f.failedOutsideReplay());
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "in the batch the program took last from DataLoader #1, not a step's (kept at the crash), row 5 of "
               "crash/batch/1 is 9, outside 0..3: the error says target 9 is out of bounds, and the loss "
               "(aten::nll_loss_nd) sees 4 classes (logits [20,4]); dataset index 237"));
  CHECK(has(h, "the ops named are the training steps'"));
  CHECK(h.rerun == "crashcap show " + f.bundle + " crash/batch/1");
  auto c = findCulprit(f);
  CHECK(c.loader == 1);
  CHECK(c.rows == std::vector<int64_t>{5});
  CHECK(c.datasetIndices == std::vector<int64_t>{237});
  CHECK(c.step == 6);
  CHECK_FALSE(c.op);

  // A token past the embedding's 40 rows, which the error does not name: the steps' embedding took
  // [20,12] tokens; this batch's [16,12] are judged against it, and the error is an index's.
  const std::string range = "IndexError: index out of range in self";
  bundle = otherBatchBundle(dir, "token.ccap", range, [](auto&, auto&, auto& tokens) { tokens[3 * 12 + 2] = 50; });
  findings = findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value();
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].row == 3);
  CHECK(findings[0].tensor == "crash/batch/tokens");
  CHECK(findings[0].value == 50);
  CHECK(findings[0].domain->indexShape == std::vector<int64_t>{16, 12});
  CHECK(findings[0].datasetIndex == 235);
  const RowFinding tokenFinding = findings[0];
  CHECK(judgeInvalidData(betweenStepsAfter6(range, findings)).verdict == V::Confirmed);
  // An error that is no index's: what the row holds is said, not confirmed.
  h = judgeInvalidData(betweenStepsAfter6("OSError: disk full", findings));
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "row 3 of crash/batch/tokens holds 50, outside 0..39: the embedding (aten::embedding) has 40 rows"));
  CHECK(has(h, "not tested: the code that takes that loader's batches is not replayed, and the error's own words do not "
               "tie it to what the rows hold"));
  CHECK_FALSE(findCulprit(betweenStepsAfter6("OSError: disk full", findings)).loader);
  // Words like an index error's that are not one: a shape's "Dimension out of range", and the hint
  // every CUDA error of torch 2 ends with.
  CHECK(judgeInvalidData(betweenStepsAfter6("IndexError: Dimension out of range (expected to be in range of [-1, 0], "
                                            "but got 1)",
                                            findings))
            .verdict == V::Inconclusive);
  CHECK(judgeInvalidData(betweenStepsAfter6("RuntimeError: CUDA error: an illegal memory access was encountered\n"
                                            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
                                            findings))
            .verdict == V::Inconclusive);
  CHECK(judgeInvalidData(betweenStepsAfter6("RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors "
                                            "might be asynchronously reported",
                                            findings))
            .verdict == V::Confirmed);

  // Tokens of another vocabulary in every row: no row is odd against the others, and no value is
  // the error's.
  bundle = otherBatchBundle(dir, "vocabulary.ccap", range, [](auto&, auto&, auto& tokens) {
    for (size_t r = 0; r < 16; ++r) tokens[r * 12] = 40 + static_cast<int64_t>(r);
  });
  CHECK(findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value().empty());

  // A NaN feature in row 2: confirmed where the error is about a NaN, said where it is not.
  bundle = otherBatchBundle(dir, "nan.ccap", "ValueError: validation loss is nan",
                            [](auto& features, auto&, auto&) { features[2 * 8 + 1] = std::nanf(""); });
  findings = findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value();
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == RowFinding::Kind::NonFinite);
  CHECK(findings[0].datasetIndex == 234);
  CHECK(judgeInvalidData(betweenStepsAfter6("ValueError: validation loss is nan", findings)).verdict == V::Confirmed);
  CHECK(judgeInvalidData(betweenStepsAfter6("ValueError: non-finite logits", findings)).verdict == V::Confirmed);
  CHECK(findCulprit(betweenStepsAfter6("ValueError: non-finite logits", findings)).rows == std::vector<int64_t>{2});
  h = judgeInvalidData(betweenStepsAfter6("KeyError: 'financial'", findings));  // "nan" inside a word is no NaN
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "row 2 of crash/batch/0 holds 1 NaN and 0 Inf values; dataset index 234"));
  // Under an index error, the NaN row is said, and the culprit is the row the error ties.
  auto both = findings;
  both.push_back(tokenFinding);
  CHECK(findCulprit(betweenStepsAfter6(range, both)).rows == std::vector<int64_t>{3});
  CHECK(judgeInvalidData(betweenStepsAfter6(range, both)).rerun == "crashcap show " + kBundle + " crash/batch/tokens");

  // Padding is no index outside (-100 after each of most rows' tokens), and a value several rows
  // hold alike outside the domain is a marker (a void 255), not three bad rows; row 3's 50 stays.
  bundle = otherBatchBundle(dir, "padded.ccap", range, [](auto&, auto&, auto& tokens) {
    for (size_t r = 0; r < 13; ++r)
      for (size_t c = 8; c < 12; ++c) tokens[r * 12 + c] = -100;
    tokens[3 * 12 + 2] = 50;
  });
  findings = findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value();
  REQUIRE(findings.size() == 1);
  CHECK((findings[0].row == 3 && findings[0].value == 50));
  bundle = otherBatchBundle(dir, "marker.ccap", range, [](auto&, auto&, auto& tokens) {
    for (size_t r : {1, 4, 9}) tokens[r * 12 + 5] = 255;
  });
  CHECK(findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value().empty());
  // An infinity in every row (an additive mask) says nothing of one row.
  bundle = otherBatchBundle(dir, "mask.ccap", "ValueError: the loss is inf", [](auto& features, auto&, auto&) {
    for (size_t r = 0; r < 16; ++r) features[r * 8] = -INFINITY;
  });
  CHECK(findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value().empty());

  // A batch with nothing odd in it: said so, and the crash's error is judged without it.
  bundle = otherBatchBundle(dir, "clean.ccap", target, [](auto&, auto&, auto&) {});
  CHECK(findOtherBatchOddities(bundle, findIndexDomains(bundle, true)).value().empty());
  CHECK(has(judgeInvalidData(betweenStepsAfter6(target, {})), "the batch the program took last from DataLoader #1 "
                                                              "(crash/batch/ in the bundle) holds no NaN/Inf"));
  // A crash that kept no other batch: nothing said of one.
  f = betweenStepsAfter6(target, {});
  f.otherLoader = -1;
  CHECK_FALSE(has(judgeInvalidData(f), "DataLoader"));
}

TEST_CASE("a negative value in a small batch is invalid data when the step's first NaN is a log given a negative "
          "value, and the log's arithmetic is not blamed",
          "[investigate][triage]") {
  // A log-space regression: log(target), one target of 8 negative. 7 other values cannot show by
  // themselves that the target is never negative; the log that went NaN on a negative input can.
  test::TempDir dir;
  const std::string bundle = dir.file("log.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    std::vector<float> x(8 * 3), y = {3.1f, 2.2f, 4.0f, 1.5f, 2.9f, 3.3f, -3.76f, 2.5f};
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i % 7);
    w->writeTensor(formats::batchTensorName(6, "0"), formats::DType::Float32, {8, 3}, x.data(), x.size() * 4);
    w->writeTensor(formats::batchTensorName(6, "1"), formats::DType::Float32, {8}, y.data(), y.size() * 4);
    sealStep6(*w, {"0", "1"});
  }
  CHECK(findRowOddities(bundle, 6, {6}, {}).empty());  // the batch alone cannot tell

  // The replay's statistics of the log's input: the float32 target's own value.
  const auto log = nonFiniteOp("aten::log", {stats(0, 0, static_cast<double>(-3.76f), 4.0)});
  const auto floor = valueFloorOf(log);
  REQUIRE(floor);
  CHECK(floor->op == "aten::log");
  CHECK_FALSE(valueFloorOf(nonFiniteOp("aten::log", {stats(0, 0, 0.5, 4.0)})));  // given nothing negative
  CHECK_FALSE(valueFloorOf(nonFiniteOp("aten::exp", {stats(0, 0, -3.76, 4.0)})));
  CHECK(valueFloorOf(nonFiniteOp("aten::sqrt_", {stats(0, 0, -1.0, 4.0)})));

  auto findings = findRowOddities(bundle, 6, {6}, {}, floor);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/1");
  CHECK(findings[0].kind == RowFinding::Kind::Negative);
  CHECK(findings[0].value == Approx(-3.76));
  CHECK(findRowOddities(bundle, 6, {2}, {}, floor).empty());  // an ordinary row
  // A log given another negative value (the model's own output, not this target): no tie to the row.
  const auto otherLog = valueFloorOf(nonFiniteOp("aten::log", {stats(0, 0, -0.5, 4.0)}));
  REQUIRE(otherLog);
  CHECK(findRowOddities(bundle, 6, {6}, {}, otherLog).empty());

  auto f = reproducedAt6();
  f.samples = samplesFound({6});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = log;
  f.rowFindings = findings;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "row 6 of steps/6/batch/1 is -3.76, while every value of the batch's other rows is >= 0, and the "
               "step's first NaN is aten::log's, which has no finite result below 0"));
  auto n = judgeLossNumerics(f);
  CHECK(n.verdict == V::Refuted);
  CHECK(has(n, "aten::log (forward, step 6) is given values down to -3.76, for which it has no finite result: the "
               "culprit rows' negative values carry them there"));

  // A log given the model's own negative output, with no culprit row holding one: its arithmetic.
  f.rowFindings.clear();
  CHECK(judgeLossNumerics(f).verdict == V::Confirmed);
  // Nor does a negative found by the batch's own evidence, untied to the op, acquit the arithmetic.
  RowFinding untied = findings[0];
  untied.floor.reset();
  f.rowFindings = {untied};
  CHECK(judgeLossNumerics(f).verdict == V::Confirmed);
}

TEST_CASE("an exact 0 no other row holds is named when the step's first NaN/Inf is a division given a 0, as a trait "
          "of the data, not invalid",
          "[investigate][triage]") {
  // A custom backward that divides by its input: features in 0.1..1.1, one of row 5 exactly 0.
  auto write = [](const std::string& path, bool secondZero) {
    auto w = formats::BundleWriter::create(path);
    std::vector<float> x(16 * 6), y(16, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f + 0.01f * static_cast<float>(i % 97);
    x[5 * 6 + 2] = 0.0f;
    if (secondZero) x[9 * 6 + 4] = 0.0f;  // another row holds a 0 too: an ordinary value here
    w->writeTensor(formats::batchTensorName(6, "0"), formats::DType::Float32, {16, 6}, x.data(), x.size() * 4);
    w->writeTensor(formats::batchTensorName(6, "1"), formats::DType::Float32, {16}, y.data(), y.size() * 4);
    sealStep6(*w, {"0", "1"});
  };
  test::TempDir dir;
  const std::string bundle = dir.file("zero.ccap"), shared = dir.file("shared.ccap");
  write(bundle, false);
  write(shared, true);

  auto div = nonFiniteOp("aten::div", {stats(0, 0, -0.4, 2.0), stats(0, 0, 0.0, 1.1)});
  div.phase = "backward";
  const auto zero = zeroGivenOf(div);
  REQUIRE(zero);
  CHECK(zero->op == "aten::div");
  CHECK(zero->phase == "backward");
  CHECK_FALSE(zeroGivenOf(nonFiniteOp("aten::div", {stats(0, 0, -0.4, 2.0), stats(0, 0, 0.1, 1.1)})));  // no 0
  CHECK_FALSE(zeroGivenOf(nonFiniteOp("aten::div", {stats(0, 0, 0.0, 2.0), stats(0, 0, 0.1, 1.1)})));  // 0 divided
  CHECK_FALSE(zeroGivenOf(nonFiniteOp("aten::exp", {stats(0, 0, 0.0, 90.0)})));  // finite at 0
  CHECK(zeroGivenOf(nonFiniteOp("aten::log_", {stats(0, 0, -2.0, 0.0)})));         // reaches 0 from below

  auto findings = findRowOddities(bundle, 6, {5}, {}, std::nullopt, zero);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == RowFinding::Kind::ZeroGiven);
  CHECK(findings[0].tensor == "steps/6/batch/0");
  CHECK(findings[0].column == 2);
  CHECK_FALSE(findings[0].invalid());
  CHECK(findRowOddities(bundle, 6, {5}, {}).empty());                        // no op was given a 0
  CHECK(findRowOddities(bundle, 6, {3}, {}, std::nullopt, zero).empty());    // an ordinary row
  CHECK(findRowOddities(shared, 6, {5}, {}, std::nullopt, zero).empty());    // another row has a 0

  auto f = reproducedAt6();
  f.samples = samplesFound({5});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = div;
  f.rowFindings = findings;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "row 5 of steps/6/batch/0 holds an exact 0 (feature 2), while no value of the batch's other rows is 0, "
               "and the step's first NaN/Inf is aten::div's (backward), which was given a 0: what it divided by, or "
               "took the log of?"));
  CHECK(judgeLossNumerics(f).verdict == V::Confirmed);  // an edge case the arithmetic meets
}

TEST_CASE("a gather's or a scatter's index domain is read from the op trace, and an out-of-bounds error names its own",
          "[investigate][triage]") {
  // PyTorch's wording, alone and after an op's name; other errors name none.
  auto raised = domainOfError("IndexError: index 7 is out of bounds for dimension 0 with size 5");
  REQUIRE(raised);
  CHECK(raised->raisedValue == 7);
  CHECK(raised->raisedDim == 0);
  CHECK(raised->size == 5);
  CHECK(raised->indexShape.empty());
  auto negative = domainOfError("RuntimeError: gather(): index -3 is out of bounds for dimension 1 with size 4");
  REQUIRE(negative);
  CHECK(negative->raisedValue == -3);
  CHECK(negative->size == 4);
  CHECK_FALSE(domainOfError("IndexError: index out of range in self"));
  CHECK_FALSE(domainOfError("index 99999999999999999999 is out of bounds for dimension 0 with size 5"));

  test::TempDir dir;
  const std::string bundle = dir.file("trace.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    formats::OpTraceData trace;
    trace.capacity = 16;
    auto op = [&](const std::string& name, std::vector<formats::OpInputData> inputs) {
      formats::OpData o;
      o.index = trace.ops.size();
      o.name = name;
      o.phase = "forward";
      o.step = 6;
      o.inputs = std::move(inputs);
      trace.ops.push_back(std::move(o));
    };
    // gather(log_probs [32,4], 1, labels [32,1]): dimension 1, 4 positions.
    op("aten::gather", {{"float32", {32, 4}}, {"scalar", {}}, {"int64", {32, 1}}, {"scalar", {}}});
    // scatter(zeros [8,6,3], ?, index [8,2,1], 1.0): two dimensions differ, so no one domain.
    op("aten::scatter", {{"float32", {8, 6, 3}}, {"scalar", {}}, {"int64", {8, 2, 1}}, {"scalar", {}}});
    // scatter_add_(acc [5,5], ?, index [5,5], src): every size alike, so either dimension has 5.
    op("aten::scatter_add_", {{"float32", {5, 5}}, {"scalar", {}}, {"int64", {5, 5}}, {"float32", {5, 5}}});
    // The backward of a gather indexes nothing of the program's.
    op("aten::gather_backward", {{"float32", {32, 1}}, {"float32", {32, 4}}, {"scalar", {}}, {"int64", {32, 1}}});
    trace.totalOps = trace.ops.size();
    formats::writeMetaRecord(*w, trace);
    formats::CrashData crash;
    crash.kind = "exception";
    crash.step = 6;
    crash.error = "IndexError: index 7 is out of bounds for dimension 0 with size 5";
    formats::writeMetaRecord(*w, crash);
    w->seal();
  }
  const auto domains = findIndexDomains(bundle);
  REQUIRE(domains.size() == 3);
  // The error's domain first: the check that failed.
  CHECK(domains[0].raisedValue == 7);
  CHECK(domains[0].size == 5);
  CHECK(domains[0].describe() == "the error says index 7 is out of bounds for dimension 0 with size 5");
  // Then the trace's, newest first.
  CHECK(domains[1].op == "aten::scatter_add_");
  CHECK(domains[1].size == 5);
  CHECK(domains[2].op == "aten::gather");
  CHECK(domains[2].size == 4);
  CHECK(domains[2].indexShape == std::vector<int64_t>{32, 1});
  CHECK(domains[2].describe() == "aten::gather indexes 4 positions along a dimension of its input [32,4] (index [32,1])");
}

TEST_CASE("an error's index domain judges only a tensor whose culprit row holds the value it names",
          "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    writeInts(*w, "label", {0, 4, 2, 7, 1, 3, 2, 0});      // row 3 holds 7, the rest fit 0..4
    writeInts(*w, "token", {11, 40, 3, 2, 9, 27, 5, 33});   // row 3 holds 2: not the value named
    writeInts(*w, "other", {70, 7, 12, 7, 9, 27, 5, 33});   // row 3 holds 7, but rows that work reach 70
    sealStep6(*w, {"label", "token", "other"});
  }
  const auto domain = domainOfError("IndexError: index 7 is out of bounds for dimension 0 with size 5");
  REQUIRE(domain);
  auto findings = findRowOddities(bundle, 6, {3}, {*domain});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/label");
  CHECK(findings[0].kind == RowFinding::Kind::OutOfDomain);
  CHECK(findings[0].value == 7);
  CHECK(findings[0].domain->raisedValue == 7);
  // A row that does not hold the value gives nothing.
  CHECK(findRowOddities(bundle, 6, {1}, {*domain}).empty());
  // Every row at once (a batch no part of which can run): no other rows to fit, so a tensor counts
  // only when nothing but the named value lies outside; "other" reaches 70.
  auto all = findRowOddities(bundle, 6, {0, 1, 2, 3, 4, 5, 6, 7}, {*domain});
  REQUIRE(all.size() == 1);
  CHECK(all[0].tensor == "steps/6/batch/label");
  CHECK(all[0].row == 3);
}

TEST_CASE("a PackedSequence's rows are gathered from its data and judged as rows", "[investigate][triage]") {
  // Step 6's batch: (PackedSequence of token ids, labels). Rows of lengths 2, 3, 1 packed longest
  // first (rows 1, 0, 2): batch_sizes 3, 2, 1; data t0: row1 4, row0 7, row2 9; t1: row1 5,
  // row0 60; t2: row1 6. Row 0's second token, 60, is past a 50-row embedding. And the same with
  // float features [6, 2], a NaN in row 2's only step.
  test::TempDir dir;
  const std::string structure = R"({"tuple": [{"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}, {"tensor": "0/2"},
      {"tensor": "0/3"}], "type": "torch.nn.utils.rnn:PackedSequence"}, {"tensor": "1"}]})";
  auto write = [&](const std::string& path, bool features) {
    auto w = formats::BundleWriter::create(path);
    if (features) {
      const std::vector<float> data = {1, 1, 2, 2, NAN, 3, 4, 4, 5, 5, 6, 6};
      w->writeTensor(formats::batchTensorName(6, "0/0"), formats::DType::Float32, {6, 2}, data.data(),
                     data.size() * sizeof(float));
    } else {
      writeInts(*w, "0/0", {4, 7, 9, 5, 60, 6});
    }
    writeInts(*w, "0/1", {3, 2, 1});
    writeInts(*w, "0/2", {1, 0, 2});
    writeInts(*w, "0/3", {1, 0, 2});
    writeInts(*w, "1", {0, 1, 1});
    formats::StepBeginData begin;
    begin.step = 6;
    for (const char* name : {"0/0", "0/1", "0/2", "0/3", "1"}) begin.batch.push_back(formats::batchTensorName(6, name));
    begin.rowDims = {-1, 0, 0, 0, 0};  // batch_sizes has as many entries as rows here
    begin.structure = structure;
    formats::writeMetaRecord(*w, begin);
    w->seal();
  };
  const std::string tokens = dir.file("tokens.ccap");
  write(tokens, false);
  const std::vector<IndexDomain> embedding = {{"aten::embedding", 50, {6}, {50, 8}, std::nullopt}};
  auto found = findRowOddities(tokens, 6, {0}, embedding);
  REQUIRE(found.size() == 1);
  CHECK(found[0].tensor == "steps/6/batch/0/0");
  CHECK(found[0].row == 0);
  CHECK(found[0].kind == RowFinding::Kind::OutOfDomain);
  CHECK(found[0].value == 60);
  CHECK(findRowOddities(tokens, 6, {1}, embedding).empty());  // row 1's tokens 4, 5, 6 fit
  const std::string features = dir.file("features.ccap");
  write(features, true);
  found = findRowOddities(features, 6, {2}, {});
  REQUIRE(found.size() == 1);
  CHECK(found[0].tensor == "steps/6/batch/0/0");
  CHECK(found[0].row == 2);
  CHECK(found[0].kind == RowFinding::Kind::NonFinite);
  CHECK(found[0].nanCount == 1);
  CHECK(findRowOddities(features, 6, {0}, {}).empty());
  // Data that does not fit its batch_sizes (a PackedSequence built by hand, damage) is not gathered.
  const std::string shorter = dir.file("shorter.ccap");
  {
    auto w = formats::BundleWriter::create(shorter);
    writeInts(*w, "0/0", {4, 7, 9, 5});
    writeInts(*w, "0/1", {3, 2, 1});
    writeInts(*w, "0/2", {1, 0, 2});
    formats::StepBeginData begin;
    begin.step = 6;
    for (const char* name : {"0/0", "0/1", "0/2"}) begin.batch.push_back(formats::batchTensorName(6, name));
    begin.rowDims = {-1, 0, 0};
    begin.structure = R"({"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}, {"tensor": "0/2"}, {"value": null}],
        "type": "torch.nn.utils.rnn:PackedSequence"})";
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  CHECK(findRowOddities(shorter, 6, {0, 1, 2}, embedding).empty());
}

TEST_CASE("a loss's 'Target N is out of bounds' takes its classes from the loss in the trace and judges every row",
          "[investigate][triage]") {
  // The loss's wording names no size: without a loss in the trace it names no domain.
  CHECK_FALSE(domainOfError("IndexError: Target 9 is out of bounds."));
  const std::vector<IndexDomain> traced = {{"aten::embedding", 50, {6, 3}, {50, 8}, std::nullopt},
                                           {"aten::cross_entropy_loss", 5, {6}, {6, 5}, -100},
                                           {"aten::nll_loss", 3, {6}, {6, 3}, -100}};
  // The newest loss is the one that raised; an embedding beside it is no loss.
  auto d = domainOfError("IndexError: Target 9 is out of bounds.", traced);
  REQUIRE(d);
  CHECK(d->raisedValue == 9);
  CHECK(d->size == 5);
  CHECK(d->op == "aten::cross_entropy_loss");
  CHECK(d->ignoreIndex == -100);
  CHECK(d->indexShape.empty());
  CHECK(d->describe() ==
        "the error says target 9 is out of bounds, and the loss (aten::cross_entropy_loss) sees 5 classes "
        "(logits [6,5])");
  CHECK(domainOfError("Target -3 is out of bounds.", traced)->raisedValue == -3);
  CHECK_FALSE(domainOfError("Target 99999999999999999999 is out of bounds.", traced));

  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  {
    auto w = formats::BundleWriter::create(bundle);
    writeInts(*w, "label", {0, 4, -1, 9, 1, 3});  // row 3 holds 9; row 2 the program's ignore_index, -1
    writeInts(*w, "length", {3, 9, 5, 2, 7, 4});  // row 1 holds 9 too, but row 3 does not
    sealStep6(*w, {"label", "length"});
  }
  // Every row at once (a batch that cannot be cut): the label row, and the -1 is no finding.
  auto all = findRowOddities(bundle, 6, {0, 1, 2, 3, 4, 5}, {*d});
  REQUIRE(all.size() == 1);
  CHECK(all[0].tensor == "steps/6/batch/label");
  CHECK(all[0].row == 3);
  CHECK(all[0].value == 9);
  CHECK(all[0].domain->ignoreIndex == -1);
  // The culprit row alone, the others judged by the same domain.
  auto one = findRowOddities(bundle, 6, {3}, {*d});
  REQUIRE(one.size() == 1);
  CHECK(one[0].tensor == "steps/6/batch/label");
  // Two different negative values are not one ignore_index: no domain applies.
  const std::string two = dir.file("two.ccap");
  {
    auto w = formats::BundleWriter::create(two);
    writeInts(*w, "label", {0, -2, -1, 9, 1, 3});
    formats::StepBeginData begin;
    begin.step = 6;
    begin.batch = {formats::batchTensorName(6, "label")};
    begin.rowDims = {0};
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  CHECK(findRowOddities(two, 6, {0, 1, 2, 3, 4, 5}, {*d}).empty());
}

TEST_CASE("a loss's ignore_index is the negative padding the working rows share, not only PyTorch's default",
          "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  // Tags of 4 sequences of 3 tokens, padded with -1 (CrossEntropyLoss(ignore_index=-1)); row 2
  // holds tag 7 of 6 classes.
  // Step 6's batch: one [4, 3] tensor of tags.
  auto writeTags = [](const std::string& path, const std::vector<int64_t>& values) {
    auto w = formats::BundleWriter::create(path);
    w->writeTensor(formats::batchTensorName(6, "tags"), formats::DType::Int64, {4, 3}, values.data(),
                   values.size() * sizeof(int64_t));
    formats::StepBeginData begin;
    begin.step = 6;
    begin.batch = {formats::batchTensorName(6, "tags")};
    begin.rowDims = {0};
    formats::writeMetaRecord(*w, begin);
    w->seal();
  };
  writeTags(bundle, {0, 5, -1, 1, -1, -1, 3, 7, 2, 4, 4, -1});
  // The loss sees the tags flattened: logits [12, 6], target [12].
  const std::vector<IndexDomain> domains = {{"aten::nll_loss_nd", 6, {12}, {12, 6}, -100}};
  auto findings = findRowOddities(bundle, 6, {2}, domains);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == RowFinding::Kind::OutOfDomain);
  CHECK(findings[0].value == 7);
  CHECK(findings[0].domain->ignoreIndex == -1);
  // Padding is no finding in a row that works.
  CHECK(findRowOddities(bundle, 6, {1}, domains).empty());

  // Where the working rows pad with -1, PyTorch's default -100 is outside.
  const std::string other = dir.file("other.ccap");
  writeTags(other, {0, 5, -1, 1, -1, -1, 3, -100, 2, 4, 4, -1});
  auto defaultOutside = findRowOddities(other, 6, {2}, domains);
  REQUIRE(defaultOutside.size() == 1);
  CHECK(defaultOutside[0].value == -100);
  CHECK(defaultOutside[0].domain->ignoreIndex == -1);
}

TEST_CASE("a loss's ignore_index is inferred only when no tensor of the batch holds its default", "[investigate][triage]") {
  // Tags of 4 sequences of 3 tokens padded with -100 (the default), and beside them same-shaped ids
  // that mark their own padding with -1. Row 2 holds tag 9 of 6 classes and id 7 (an ordinary id).
  // The ids fit the loss's domain only with an inferred ignore_index of -1; the tags fit its
  // default, so they are the target, and the id is no finding.
  test::TempDir dir;
  // Step 6's batch: the tags and a second [4, 3] integer tensor beside them.
  auto writeBatch = [](const std::string& path, const std::vector<int64_t>& tags, const char* other,
                       const std::vector<int64_t>& values) {
    auto w = formats::BundleWriter::create(path);
    formats::StepBeginData begin;
    begin.step = 6;
    for (const auto& [name, v] : {std::pair{"tags", tags}, std::pair{other, values}}) {
      w->writeTensor(formats::batchTensorName(6, name), formats::DType::Int64, {4, 3}, v.data(), v.size() * sizeof(int64_t));
      begin.batch.push_back(formats::batchTensorName(6, name));
    }
    begin.rowDims = {0, 0};
    formats::writeMetaRecord(*w, begin);
    w->seal();
  };
  const std::string bundle = dir.file("batch.ccap");
  writeBatch(bundle, {0, 5, -100, 1, -100, -100, 3, 9, 2, 4, 4, -100}, "ids", {1, 2, -1, 0, -1, -1, 4, 7, 3, 2, 5, -1});
  const std::vector<IndexDomain> domains = {{"aten::nll_loss_nd", 6, {12}, {12, 6}, -100}};
  auto findings = findRowOddities(bundle, 6, {2}, domains);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/tags");
  CHECK(findings[0].value == 9);
  CHECK(findings[0].domain->ignoreIndex == -100);

  // Tags padded with -1 (CrossEntropyLoss(ignore_index=-1)) beside a 0/1 mask, which fits the
  // default only because it holds no negative value: the tags' -1 is still inferred, and row 2's
  // tag 9 found.
  const std::string masked = dir.file("masked.ccap");
  writeBatch(masked, {0, 5, -1, 1, -1, -1, 3, 9, 2, 4, 4, -1}, "mask", {1, 1, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0});
  auto beside = findRowOddities(masked, 6, {2}, domains);
  REQUIRE(beside.size() == 1);
  CHECK(beside[0].tensor == "steps/6/batch/tags");
  CHECK(beside[0].value == 9);
  CHECK(beside[0].domain->ignoreIndex == -1);
}

TEST_CASE("row findings name negative values in a row when the batch's other rows have none", "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  // Pixels in 0..1 in 10 rows of 8; row 2 holds -0.75 (a log downstream goes NaN). The offsets are
  // centred: every row has negatives, so none is singled out there. Targets padded with -100 (a
  // loss's default ignore_index) in row 2 only are no finding: padding is the loss domain's to judge.
  std::vector<float> pixels(80), offsets(80);
  std::vector<int64_t> targets(80, 1);
  for (size_t i = 0; i < pixels.size(); ++i) {
    pixels[i] = static_cast<float>(i % 11) / 10.0f;
    offsets[i] = static_cast<float>(i % 8) - 3.5f;
  }
  pixels[2 * 8 + 5] = -0.75f;
  for (size_t i = 16; i < 24; ++i) targets[i] = -100;
  {
    auto w = formats::BundleWriter::create(bundle);
    w->writeTensor(formats::batchTensorName(6, "pixels"), formats::DType::Float32, {10, 8}, pixels.data(),
                   pixels.size() * sizeof(float));
    w->writeTensor(formats::batchTensorName(6, "offsets"), formats::DType::Float32, {10, 8}, offsets.data(),
                   offsets.size() * sizeof(float));
    w->writeTensor(formats::batchTensorName(6, "targets"), formats::DType::Int64, {10, 8}, targets.data(),
                   targets.size() * sizeof(int64_t));
    sealStep6(*w, {"pixels", "offsets", "targets"});
  }
  auto findings = findRowOddities(bundle, 6, {2}, {});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/pixels");
  CHECK(findings[0].kind == RowFinding::Kind::Negative);
  CHECK(findings[0].value == -0.75);
  CHECK(findings[0].invalid());
  CHECK(findRowOddities(bundle, 6, {1}, {}).empty());
  // Against 7 other rows it says nothing: a signed feature may be >= 0 in that few by chance.
  for (const auto& x : findRowOddities(bundle, 6, {2, 3, 4}, {})) CHECK(x.kind != RowFinding::Kind::Negative);

  // It makes the rows invalid data, and the loss is not blamed for a legitimate edge case.
  auto f = reproducedAt6();
  f.samples = samplesFound({2});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.replay->firstNonFiniteOp = nonFiniteOp("aten::log", {stats(0, 0, -0.75, 1.0)});
  f.rowFindings = findings;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "row 2 of steps/6/batch/pixels holds negative values (down to -0.75), while every value of the batch's "
               "other rows is >= 0"));
  CHECK_FALSE(has(judgeLossNumerics(f), "legitimate edge case"));
}

TEST_CASE("row findings read a sequence-first tensor's rows along its recorded row dimension", "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  // Tokens [time 5, batch 8] and labels [8]: sample 3's token at time 2 is outside the table of 50.
  std::vector<int64_t> tokens(5 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i % 50);
  tokens[2 * 8 + 3] = 99;
  {
    auto w = formats::BundleWriter::create(bundle);
    w->writeTensor(formats::batchTensorName(6, "tokens"), formats::DType::Int64, {5, 8}, tokens.data(),
                   tokens.size() * sizeof(int64_t));
    writeInts(*w, "label", {0, 1, 2, 0, 1, 2, 0, 1});
    formats::StepBeginData begin;
    begin.step = 6;
    begin.batch = {formats::batchTensorName(6, "tokens"), formats::batchTensorName(6, "label")};
    begin.rowDims = formats::rowDimensions({{5, 8}, {8}}, 8);
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  const std::vector<IndexDomain> domains = {{"aten::embedding", 50, {5, 8}, {50, 4}, std::nullopt}};
  auto findings = findRowOddities(bundle, 6, {3}, domains);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].tensor == "steps/6/batch/tokens");
  CHECK(findings[0].row == 3);
  CHECK(findings[0].kind == RowFinding::Kind::OutOfDomain);
  CHECK(findings[0].value == 99);
  // Row 2, sample 2's column of tokens, is as ordinary as the rest.
  CHECK(findRowOddities(bundle, 6, {2}, domains).empty());
}

TEST_CASE("row findings find a feature far beyond its scale in the other rows, which a row-wide maximum hides",
          "[investigate][triage]") {
  test::TempDir dir;
  const std::string bundle = dir.file("batch.ccap");
  // Feature 0 is of scale 10, feature 1 of scale 0.001; row 2's feature 1 is 0.9 (150x).
  std::vector<float> x;
  for (int r = 0; r < 6; ++r) {
    x.push_back(static_cast<float>(10 - r));
    x.push_back(r == 2 ? 0.9f : 0.001f * static_cast<float>(r + 1));
  }
  {
    auto w = formats::BundleWriter::create(bundle);
    w->writeTensor(formats::batchTensorName(6, "x"), formats::DType::Float32, {6, 2}, x.data(), x.size() * sizeof(float));
    formats::StepBeginData begin;
    begin.step = 6;
    begin.batch = {formats::batchTensorName(6, "x")};
    begin.rowDims = {0};
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  auto findings = findRowOddities(bundle, 6, {2}, {});
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == RowFinding::Kind::Outlier);
  CHECK(findings[0].column == 1);
  CHECK(findings[0].invalid());
  auto f = reproducedAt6();
  f.samples = samplesFound({2});
  f.withoutRows = replayOf(Verdict::NotReproduced);
  f.rowFindings = findings;
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "row 2 of steps/6/batch/x reaches 0.9 in magnitude in feature 1, while the batch's other rows stay within "
               "0.006 there"));
  CHECK(findRowOddities(bundle, 6, {3}, {}).empty());  // an ordinary row
}

TEST_CASE("a crash while loading the batch after a step is invalid data when that batch, loaded again, has samples "
          "that fail",
          "[investigate][triage]") {
  auto f = reproducedAt6();
  f.crashStep = 6;
  f.crashPhase = "loading";
  f.replay->error = "ValueError: corrupt record 37";
  replayer::BatchLoad load;
  load.indices = {4, 9, 2};
  load.datasetIndices = {40, 37, 20};
  load.error = f.replay->error;
  load.searched = true;
  f.replay->batchLoad = load;
  // Loaded again, it failed, and no sample fails alone: the batch as a whole.
  auto h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK(has(h, "the batch after step 6 never came: loaded again from its 3 recorded dataset indices"));
  CHECK(has(h, "no sample fails loaded alone or collated alone"));
  CHECK(h.rerun == "crashcap replay " + std::string(kBundle) + " --json");
  CHECK_FALSE(findCulprit(f).datasetIndices);

  replayer::LoadCulprit c;
  c.position = 1;
  c.index = 9;
  c.datasetIndex = 37;
  c.error = "Traceback (most recent call last):\nValueError: corrupt record 37";
  f.replay->batchLoad->culprits = {c};
  f.replay->batchLoad->culpritsBy = "loaded alone";
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Confirmed);
  CHECK(has(h, "dataset index 37 (sample 1 of the batch) fails loaded alone: ValueError: corrupt record 37"));
  auto culprit = findCulprit(f);
  REQUIRE(culprit.datasetIndices);
  CHECK(*culprit.datasetIndices == std::vector<int64_t>{37});
  CHECK(culprit.phase == "loading");
  CHECK_FALSE(culprit.rows);
  // No op of a step made the error.
  auto numerics = judgeLossNumerics(f);
  CHECK(numerics.verdict == V::Refuted);
  CHECK(has(numerics, "the error came from the DataLoader loading the batch after step 6, not from an op of a step"));

  // Loaded again cleanly: the replay does not show the failure, and nothing is tested.
  f.replay->verdict = Verdict::NotReproduced;
  f.replay->error.clear();
  f.replay->batchLoad->error.clear();
  f.replay->batchLoad->culprits.clear();
  h = judgeInvalidData(f);
  CHECK(h.verdict == V::Inconclusive);
  CHECK_FALSE(findCulprit(f).datasetIndices);
}

TEST_CASE("a crash while loading a batch that the replay could not load again is not read as a failure that does not "
          "reproduce",
          "[investigate][triage]") {
  // An IterableDataset's batch: the crash record holds no indices to load its samples by, so the
  // replay ran the steps before it bit for bit and loaded nothing after them.
  auto f = reproducedAt6();
  f.crashStep = 6;
  f.crashPhase = "loading";
  f.replay->verdict = Verdict::NotReproduced;
  f.replay->error.clear();
  f.steps = stepsWith({3.0, 3.1, 3.0, 3.05}, {0.1, 0.1, 0.1, 0.1, 0.1});
  REQUIRE(f.loadingNotRepeated());
  const std::string blocked = "the replay could not load that batch again";
  for (auto judge : {judgeInvalidData, judgeDeviceSpecific, judgeConfigDependent, judgeNondeterminism}) {
    auto h = judge(f);
    INFO(h.id);
    CHECK(h.verdict == V::Inconclusive);
    CHECK(has(h, blocked));
    CHECK_FALSE(has(h, "does not reproduce"));
    CHECK_FALSE(has(h, "ran clean"));
  }
  auto numerics = judgeLossNumerics(f);
  CHECK(numerics.verdict == V::Refuted);
  CHECK(has(numerics, "the error came from the DataLoader loading the batch after step 6, not from an op of a step"));
  // The steps up to the failing one did replay: their weights still say what they say.
  auto divergence = judgeOptimizerDivergence(f);
  CHECK(divergence.verdict == V::Refuted);
  CHECK_FALSE(has(divergence, blocked));

  // An error of the replayed steps' own is a finding, not a block.
  f.replay->error = "RuntimeError: mat1 and mat2 shapes cannot be multiplied";
  CHECK_FALSE(f.loadingNotRepeated());
  CHECK_FALSE(f.replayBlocked());
  f.replay->error.clear();

  // A batch that was loaded again and raised nothing is a finding, not a block.
  f.replay->batchLoad = replayer::BatchLoad{};
  f.replay->batchLoad->indices = {1, 2};
  CHECK_FALSE(f.loadingNotRepeated());
  CHECK_FALSE(judgeInvalidData(f).evidence.empty());
  CHECK_FALSE(has(judgeInvalidData(f), blocked));
}
