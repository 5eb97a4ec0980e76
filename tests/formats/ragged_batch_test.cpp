// Batches whose samples cannot be cut by row: told from the shapes of their tensors over steps.
#include <catch2/catch.hpp>

#include <map>

#include "crashcap/formats/ragged_batch.hpp"

using namespace crashcap::formats;

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

/// Steps whose batches have the inputs `names`, each step's shapes from `shapes` (a name's shape
/// per step), row dimensions as the recorder finds them for `rows` samples.
std::vector<StepBeginData> steps(const std::vector<std::string>& names, const std::vector<std::vector<std::vector<int64_t>>>& shapes,
                                 int64_t rows, Shapes& all) {
  std::vector<StepBeginData> out;
  for (size_t s = 0; s < shapes.size(); ++s) {
    StepBeginData b;
    b.step = static_cast<int64_t>(s);
    for (size_t i = 0; i < names.size(); ++i) {
      b.batch.push_back(batchTensorName(b.step, names[i]));
      all[b.batch.back()] = shapes[s][i];
    }
    b.rowDims = rowDimensions(shapes[s], rows);
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST_CASE("a batch tensor without rows whose size changes from step to step holds the samples concatenated",
          "[formats][records]") {
  Shapes all;
  auto shapeOf = [&](const std::string& n) { return all.count(n) ? all[n] : std::vector<int64_t>{}; };
  // A ragged text batch: labels (12), the tokens of all 12 samples concatenated, offsets (12).
  auto ragged = steps({"0", "1", "2"}, {{{12}, {82}, {12}}, {{12}, {79}, {12}}}, 12, all);
  auto found = concatenatedBatchTensors(ragged, 1, shapeOf);
  REQUIRE(found.size() == 1);
  CHECK(found[0].text() == "'1' [79] ([82] at step 0)");
  CHECK(found[0].name == "steps/1/batch/1");
  CHECK(found[0].shape == std::vector<int64_t>{79});
  // A graph batch: node features [N, 8], edges [2, E], graph of each node [N], labels [4].
  auto graph = steps({"x", "edges", "graph", "y"}, {{{40, 8}, {2, 90}, {40}, {4}}, {{37, 8}, {2, 81}, {37}, {4}}}, 4, all);
  CHECK(concatenatedBatchTensors(graph, 1, shapeOf).size() == 3);
  // A padded batch padded to its longest sample: tokens [8, T], position ids [1, T] and a causal
  // mask [T, T] change with T, which is a size of the tokens' other dimension: cut by row.
  auto padded = steps({"tokens", "positions", "mask", "labels"},
                      {{{8, 17}, {1, 17}, {17, 17}, {8}}, {{8, 23}, {1, 23}, {23, 23}, {8}}}, 8, all);
  CHECK(concatenatedBatchTensors(padded, 1, shapeOf).empty());
  // A tensor without rows that keeps its size (class weights, a vocabulary mask) is shared.
  auto shared = steps({"x", "weights"}, {{{8, 3}, {10}}, {{8, 3}, {10}}}, 8, all);
  CHECK(concatenatedBatchTensors(shared, 1, shapeOf).empty());
  // One recorded step alone cannot tell; a step that is not recorded, or a batch without rows, has none.
  auto alone = steps({"0", "1"}, {{{12}, {79}}}, 12, all);
  CHECK(concatenatedBatchTensors(alone, 0, shapeOf).empty());
  CHECK(concatenatedBatchTensors(ragged, 7, shapeOf).empty());
  auto rowless = steps({"a"}, {{{}}, {{}}}, -1, all);
  CHECK(concatenatedBatchTensors(rowless, 1, shapeOf).empty());
}

TEST_CASE("a batch tensor of one integer per row tells the rows' spans in a concatenated one, as lengths or offsets",
          "[formats][records]") {
  using Candidates = std::vector<std::pair<std::string, std::vector<int64_t>>>;
  // A CTC batch: 3 transcripts concatenated (3 + 5 + 2 = 10), their lengths, and the inputs' frames.
  auto ctc = raggedSpans(10, Candidates{{"y_len", {3, 5, 2}}, {"x_len", {20, 29, 24}}});
  REQUIRE(ctc);
  CHECK(ctc->by == "y_len");
  CHECK_FALSE(ctc->offsets);
  CHECK(ctc->spans == std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 8}, {8, 10}});
  CHECK(ctc->text() == "the lengths in y_len");

  // An EmbeddingBag's offsets: each row's first position; the last row runs to the end.
  auto bags = raggedSpans(10, Candidates{{"labels", {4, 1, 3}}, {"offsets", {0, 3, 8}}});
  REQUIRE(bags);
  CHECK(bags->offsets);
  CHECK(bags->spans == std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 8}, {8, 10}});
  CHECK(bags->text() == "the offsets in offsets");

  // Two that tell the same spans agree; two that tell different ones say nothing.
  CHECK(raggedSpans(10, Candidates{{"len", {3, 5, 2}}, {"off", {0, 3, 8}}}));
  CHECK_FALSE(raggedSpans(10, Candidates{{"len", {3, 5, 2}}, {"off", {0, 4, 8}}}));
  // Lengths that are also offsets (0 first, never decreasing): either reading fits, so neither.
  CHECK_FALSE(raggedSpans(6, Candidates{{"both", {0, 1, 2, 3}}}));
  // Nothing that fits: lengths that do not sum to the size, offsets past it, negative values,
  // offsets that decrease.
  CHECK_FALSE(raggedSpans(10, Candidates{{"a", {3, 5, 1}}}));
  CHECK_FALSE(raggedSpans(10, Candidates{{"b", {0, 5, 11}}}));
  CHECK_FALSE(raggedSpans(10, Candidates{{"c", {-1, 9, 2}}}));
  CHECK_FALSE(raggedSpans(10, Candidates{{"d", {0, 6, 3}}}));
  CHECK_FALSE(raggedSpans(10, Candidates{}));
  // A candidate that does not fit is passed over for one that does.
  auto passedOver = raggedSpans(10, Candidates{{"labels", {2, 0, 1}}, {"len", {3, 5, 2}}});
  REQUIRE(passedOver);
  CHECK(passedOver->by == "len");
  // An empty row: a length of 0, or an offset repeated (the last row's span runs to the end).
  CHECK(raggedSpans(10, Candidates{{"len", {3, 0, 7}}})->spans ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 3}, {3, 10}});
  CHECK(raggedSpans(10, Candidates{{"off", {0, 3, 10}}})->spans ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 10}, {10, 10}});
}

TEST_CASE("a list of lengths tells the spans only where it reads as lengths, never as offsets", "[formats][records]") {
  using Candidates = std::vector<std::pair<std::string, std::vector<int64_t>>>;
  const Candidates tensors{{"steps/3/batch/2", {0, 4, 9}}};
  const Candidates lists{{"list '1' of step 3's batch", {4, 5, 3}}, {"list '4' of step 3's batch", {0, 0, 0}},
                         {"list '5' of step 3's batch", {0, 1, 2}}};
  // Of 12 samples: the tensor's offsets and the lengths 4+5+3 agree; the ids and flags, which
  // could pass for offsets and would then disagree, are not read so.
  auto twelve = raggedSpans(12, tensors, lists);
  REQUIRE(twelve);
  CHECK(twelve->by == "steps/3/batch/2");
  CHECK(twelve->spans == std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 9}, {9, 12}});
  // Of 3 samples the ids 0+1+2 sum to it and are lengths there; the flags sum to 0.
  auto three = raggedSpans(3, tensors, lists);
  REQUIRE(three);
  CHECK(three->by == "list '5' of step 3's batch");
  CHECK_FALSE(three->offsets);
  // A list that would read both ways is lengths, where a tensor would tell nothing.
  auto both = raggedSpans(6, {}, Candidates{{"list '2' of step 0's batch", {0, 1, 2, 3}}});
  REQUIRE(both);
  CHECK(both->spans == std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {1, 3}, {3, 6}});
}
