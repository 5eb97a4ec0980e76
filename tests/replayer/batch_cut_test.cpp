// cutStructure: a Python batch's per-row lists go with the rows its tensors are cut to; cutBatch: a
// PackedSequence in it is packed anew from the rows kept.

// LibTorch first: glog's CHECK must not replace Catch's.
#include <ATen/ATen.h>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/replayer/batch_cut.hpp"
#undef CHECK

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_support.hpp"

using crashcap::replayer::cutStructure;
using nlohmann::json;

TEST_CASE("a batch structure's lists of one value per row are cut to the rows, in their order", "[replayer]") {
  // (frames, frame lengths, transcripts, transcript lengths, {"names": [...], "classes": [...]})
  const json batch = json::parse(R"({"tuple": [
      {"tensor": "0"}, {"value": [20, 21, 22, 23]}, {"tensor": "2"}, {"value": [3, 4, 5, 6]},
      {"dict": [["names", {"value": ["a.wav", "b.wav", "c.wav", "d.wav"]}],
                ["classes", {"value": ["cat", "dog", "owl"]}],
                ["speaker", {"value": "x"}]]}]})");
  const json cut = json::parse(cutStructure(batch.dump(), 4, {3, 1}));
  INFO(cut.dump());
  CHECK(cut["tuple"][1]["value"] == json({23, 21}));
  CHECK(cut["tuple"][3]["value"] == json({6, 4}));
  CHECK(cut["tuple"][4]["dict"][0][1]["value"] == json({"d.wav", "b.wav"}));
  // Not one value per row (a list of the classes), not a list, a tensor: whole.
  CHECK(cut["tuple"][4]["dict"][1][1]["value"] == json({"cat", "dog", "owl"}));
  CHECK(cut["tuple"][4]["dict"][2][1]["value"] == "x");
  CHECK(cut["tuple"][0] == batch["tuple"][0]);
  // Every row in order is the batch as recorded; a flat batch of tensors has no structure.
  CHECK(json::parse(cutStructure(batch.dump(), 4, {0, 1, 2, 3})) == batch);
  CHECK(cutStructure("", 4, {1}).empty());
  CHECK_THROWS_AS(cutStructure(batch.dump(), 4, {4}), crashcap::Error);
}

TEST_CASE("a batch structure's list of per-sample lists is cut by its items, not inside them", "[replayer]") {
  // Boxes of 4 coordinates for each of 4 samples; per-sample tensors are left whole (their
  // tensors are the batch's, which the cut does not drop).
  const std::string boxes = R"({"tuple":[{"tensor":"0"},{"list":[{"value":[1,1,1,1]},{"value":[2,2,2,2]},)"
                            R"({"value":[3,3,3,3]},{"value":[4,4,4,4]}]},{"list":[{"tensor":"2/0"},{"tensor":"2/1"},)"
                            R"({"tensor":"2/2"},{"tensor":"2/3"}]}]})";
  const json cut = json::parse(cutStructure(boxes, 4, {2}));
  INFO(cut.dump());
  CHECK(cut["tuple"][1]["list"] == json::parse(R"([{"value":[3,3,3,3]}])"));
  CHECK(cut["tuple"][2]["list"].size() == 4);
  // Nothing per row: the structure as written, byte for byte.
  const std::string none = R"({"tuple": [{"tensor": "0"}, {"value": "été"}]})";
  CHECK(cutStructure(none, 4, {2}) == none);
}

TEST_CASE("a batch structure's lists of one integer per row are named by where they nest", "[replayer]") {
  using crashcap::replayer::perRowLists;
  // (frames, frame lengths, transcripts, {"lengths": transcript lengths, "names": [...], "flags": [...]})
  const std::string batch = R"({"tuple": [{"tensor": "0"}, {"value": [20, 21, 22]}, {"tensor": "2"},
      {"dict": [["lengths", {"value": [3, 0, 5]}], ["names", {"value": ["a", "b", "c"]}],
                ["flags", {"value": [true, false, true]}], ["classes", {"value": [1, 2]}]]}]})";
  const auto lists = perRowLists(batch, 12, 3);
  REQUIRE(lists.size() == 2);
  CHECK(lists[0].first == "list '1' of step 12's batch");
  CHECK(lists[0].second == std::vector<int64_t>{20, 21, 22});
  CHECK(lists[1].first == "list '3/lengths' of step 12's batch");
  CHECK(lists[1].second == std::vector<int64_t>{3, 0, 5});
  // Names, bools and a list of another length are none (above); the list of two classes is one
  // only in a batch of two. A flat batch, or text that is not JSON, has none.
  const auto two = perRowLists(batch, 12, 2);
  REQUIRE(two.size() == 1);
  CHECK(two[0].first == "list '3/classes' of step 12's batch");
  CHECK(perRowLists("", 12, 3).empty());
  CHECK(perRowLists("{not json", 12, 3).empty());
  CHECK(perRowLists(R"({"value": [1, 2, 3]})", 4, 3).front().first == "list '' of step 4's batch");
}

TEST_CASE("a batch structure's lists of one item of tensors per row are found, outermost first", "[replayer]") {
  using crashcap::replayer::perSampleLists;
  // (images, [{"boxes", "labels"} of each image]): detection targets collated as a list.
  const std::string batch = R"({"tuple": [{"tensor": "0"}, {"list": [
      {"dict": [["boxes", {"tensor": "1/0/boxes"}], ["labels", {"tensor": "1/0/labels"}]]},
      {"dict": [["boxes", {"tensor": "1/1/boxes"}], ["labels", {"tensor": "1/1/labels"}]]}]},
      {"list": [{"value": 1}, {"value": 2}]}]})";
  // In a batch of 2, the root tuple of 3 fields is not one; the list of targets is, and the list of
  // plain values is not (its items hold no tensor).
  auto lists = perSampleLists(batch, 2);
  REQUIRE(lists.size() == 1);
  CHECK(lists[0].list == "1");
  CHECK(lists[0].tensors == std::vector<std::vector<std::string>>{{"1/0/boxes", "1/0/labels"}, {"1/1/boxes", "1/1/labels"}});
  // In a batch of 3 the root tuple is a candidate too (outermost first), though it is the batch's
  // fields: the caller tells them apart by row dimensions. The list of targets is not one there.
  lists = perSampleLists(batch, 3);
  CHECK(lists.empty());  // its third field holds no tensor
  const std::string fields = R"({"list": [{"tensor": "0"}, {"tensor": "1"}, {"tuple": [{"tensor": "2/0"}, {"tensor": "2/1"}, {"tensor": "2/2"}]}]})";
  lists = perSampleLists(fields, 3);
  REQUIRE(lists.size() == 2);
  CHECK(lists[0].list.empty());
  CHECK(lists[1].list == "2");
  // torchvision's tuple(zip(*batch)): a tuple of no named type; a namedtuple is the batch's fields.
  CHECK(perSampleLists(R"({"tuple": [{"tensor": "0"}, {"tensor": "1"}]})", 2).size() == 1);
  CHECK(perSampleLists(R"({"tuple": [{"tensor": "0"}, {"tensor": "1"}], "type": "m:Pair"})", 2).empty());
  CHECK(perSampleLists("", 2).empty());
}

TEST_CASE("a batch structure's paths name dict keys as the recorder names its parts", "[replayer]") {
  using crashcap::replayer::perRowLists;
  const auto lists = perRowLists(R"({"dict": [["a/b\u0001", {"value": [1, 2]}]]})", 0, 2);
  REQUIRE(lists.size() == 1);
  CHECK(lists[0].first == "list 'a_b_' of step 0's batch");
}

TEST_CASE("a batch structure's namedtuple parts are named by its fields, as the recorder names them", "[replayer]") {
  using crashcap::replayer::perSampleLists;
  // Det(images, targets): the recorder names the targets' tensors "targets/<row>/boxes".
  const std::string batch = R"({"tuple": [{"tensor": "images"}, {"list": [
      {"dict": [["boxes", {"tensor": "targets/0/boxes"}]]}, {"dict": [["boxes", {"tensor": "targets/1/boxes"}]]}]}],
      "type": "m:Det", "fields": ["images", "targets"]})";
  const auto lists = perSampleLists(batch, 2);
  REQUIRE(lists.size() == 1);
  CHECK(lists[0].list == "targets");
  CHECK(lists[0].tensors == std::vector<std::vector<std::string>>{{"targets/0/boxes"}, {"targets/1/boxes"}});
  const json cut = json::parse(crashcap::replayer::cutStructure(batch, 2, {1}, {"targets"}));
  INFO(cut.dump());
  CHECK(cut["tuple"][1]["list"].size() == 1);
  CHECK(cut["tuple"][1]["list"][0]["dict"][0][1]["tensor"] == "targets/0/boxes");
  CHECK(cut["fields"] == json::parse(R"(["images", "targets"])"));
  // Fields that do not match the items (a structure not the recorder's) leave the places.
  const std::string odd = R"({"tuple": [{"tensor": "0"}, {"list": [{"dict": [["b", {"tensor": "1/0/b"}]]},
      {"dict": [["b", {"tensor": "1/1/b"}]]}]}], "type": "m:Odd", "fields": ["only"]})";
  REQUIRE(perSampleLists(odd, 2).size() == 1);
  CHECK(perSampleLists(odd, 2)[0].list == "1");
}

TEST_CASE("a batch structure's PackedSequences are found wherever they nest, with their tensors", "[replayer]") {
  using crashcap::replayer::packedSequences;
  // (PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices), labels): a collate
  // function that packs the batch itself.
  const std::string packed = R"({"tuple": [{"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}, {"tensor": "0/2"},
      {"tensor": "0/3"}], "type": "torch.nn.utils.rnn:PackedSequence"}, {"tensor": "1"}]})";
  auto found = packedSequences(packed);
  REQUIRE(found.size() == 1);
  CHECK(found[0].place == "0");
  CHECK(found[0].tensors == std::array<std::string, 4>{"0/0", "0/1", "0/2", "0/3"});
  // Packed already sorted: no indices.
  found = packedSequences(R"({"dict": [["text", {"tuple": [{"tensor": "text/0"}, {"tensor": "text/1"}, {"value": null},
      {"value": null}], "type": "torch.nn.utils.rnn:PackedSequence"}]]})");
  REQUIRE(found.size() == 1);
  CHECK(found[0].place == "text");
  CHECK(found[0].tensors == std::array<std::string, 4>{"text/0", "text/1", "", ""});
  CHECK(packedSequences(R"({"tuple": [{"tensor": "0"}], "type": "torch.nn.utils.rnn:PackedSequence"})").at(0).place.empty());
  // Another namedtuple, a plain tuple, a flat batch, text that is not JSON: none.
  CHECK(packedSequences(R"({"tuple": [{"tensor": "0"}, {"tensor": "1"}], "type": "m:Pair"})").empty());
  CHECK(packedSequences(R"({"tuple": [{"tensor": "0"}, {"tensor": "1"}]})").empty());
  CHECK(packedSequences("").empty());
  CHECK(packedSequences("{not json").empty());
}

namespace {

/// A bundle whose step 3 batch is (PackedSequence, labels): rows of lengths 2, 4, 1, row r's value
/// at time step t 10r + t, packed as pack_padded_sequence(enforce_sorted=False) packs them, and
/// one label per row. Without `sortedIndices`, rows of lengths 4, 2, 1 packed already sorted.
std::map<std::string, at::Tensor> cutPackedBatch(const std::string& path, const std::vector<int64_t>& rows,
                                                 bool sortedIndices = true) {
  namespace formats = crashcap::formats;
  std::filesystem::remove(path);  // each cut from a bundle written anew
  {
    auto w = formats::BundleWriter::create(path);
    auto name = [](const char* input) { return formats::batchTensorName(3, input); };
    formats::StepBeginData begin;
    begin.step = 3;
    if (sortedIndices) {
      // Longest first: rows 1, 0, 2. Time step 0: 10, 0, 20; 1: 11, 1; 2: 12; 3: 13.
      formats::torch::writeTensor(*w, name("0/0"), at::tensor({10.f, 0.f, 20.f, 11.f, 1.f, 12.f, 13.f}).unsqueeze(1));
      formats::torch::writeTensor(*w, name("0/1"), at::tensor(std::vector<int64_t>{3, 2, 1, 1}));
      formats::torch::writeTensor(*w, name("0/2"), at::tensor(std::vector<int64_t>{1, 0, 2}));
      formats::torch::writeTensor(*w, name("0/3"), at::tensor(std::vector<int64_t>{1, 0, 2}));
      begin.batch = {name("0/0"), name("0/1"), name("0/2"), name("0/3"), name("1")};
      begin.rowDims = {-1, -1, 0, 0, 0};
      begin.structure = R"({"tuple": [{"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}, {"tensor": "0/2"},
          {"tensor": "0/3"}], "type": "torch.nn.utils.rnn:PackedSequence"}, {"tensor": "1"}]})";
    } else {
      formats::torch::writeTensor(*w, name("0/0"), at::tensor({0.f, 10.f, 20.f, 1.f, 11.f, 2.f, 3.f}).unsqueeze(1));
      formats::torch::writeTensor(*w, name("0/1"), at::tensor(std::vector<int64_t>{3, 2, 1, 1}));
      begin.batch = {name("0/0"), name("0/1"), name("1")};
      begin.rowDims = {-1, -1, 0};
      begin.structure = R"({"tuple": [{"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}, {"value": null},
          {"value": null}], "type": "torch.nn.utils.rnn:PackedSequence"}, {"tensor": "1"}]})";
    }
    formats::torch::writeTensor(*w, name("1"), at::tensor(std::vector<int64_t>{7, 8, 9}));
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  auto reader = formats::BundleReader::open(path);
  const auto records = formats::readRecords(*reader);
  return crashcap::replayer::cutBatch(*reader, records, records.stepBegins.at(0), rows, "refused", "").tensors;
}

std::vector<float> floats(const at::Tensor& t) {
  auto c = t.contiguous().to(at::kFloat);
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}
std::vector<int64_t> longs(const at::Tensor& t) {
  auto c = t.contiguous().to(at::kLong);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE("a PackedSequence in a batch is cut to its rows by packing the kept rows anew", "[replayer]") {
  crashcap::test::TempDir dir;
  const std::string bundle = dir.file("packed.ccap");
  // Rows 2 and 0 (lengths 1 and 2): row 0 is longer, so first in packed order.
  auto cut = cutPackedBatch(bundle, {2, 0});
  CHECK(floats(cut.at("steps/3/batch/0/0")) == std::vector<float>{0, 20, 1});
  CHECK(longs(cut.at("steps/3/batch/0/1")) == std::vector<int64_t>{2, 1});
  CHECK(longs(cut.at("steps/3/batch/0/2")) == std::vector<int64_t>{1, 0});  // packed place 0 holds kept row 1
  CHECK(longs(cut.at("steps/3/batch/0/3")) == std::vector<int64_t>{1, 0});
  CHECK(longs(cut.at("steps/3/batch/1")) == std::vector<int64_t>{9, 7});  // the labels, by row
  // Every row, in order: the recorded tensors.
  cut = cutPackedBatch(bundle, {0, 1, 2});
  CHECK(floats(cut.at("steps/3/batch/0/0")) == std::vector<float>{10, 0, 20, 11, 1, 12, 13});
  CHECK(longs(cut.at("steps/3/batch/0/1")) == std::vector<int64_t>{3, 2, 1, 1});
  CHECK(longs(cut.at("steps/3/batch/0/2")) == std::vector<int64_t>{1, 0, 2});
  CHECK(longs(cut.at("steps/3/batch/0/3")) == std::vector<int64_t>{1, 0, 2});
  // A row repeated (a batch filled to its size with copies): each copy its own row.
  cut = cutPackedBatch(bundle, {1, 1});
  CHECK(floats(cut.at("steps/3/batch/0/0")) == std::vector<float>{10, 10, 11, 11, 12, 12, 13, 13});
  CHECK(longs(cut.at("steps/3/batch/0/1")) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(longs(cut.at("steps/3/batch/0/2")) == std::vector<int64_t>{0, 1});

  // Packed already sorted (no indices): rows kept in that order are cut, others refused.
  cut = cutPackedBatch(dir.file("sorted.ccap"), {0, 2}, false);
  CHECK(floats(cut.at("steps/3/batch/0/0")) == std::vector<float>{0, 20, 1, 2, 3});
  CHECK(longs(cut.at("steps/3/batch/0/1")) == std::vector<int64_t>{2, 1, 1, 1});
  CHECK(cut.count("steps/3/batch/0/2") == 0);
  try {
    cutPackedBatch(dir.file("unsorted.ccap"), {2, 0}, false);
    FAIL("a cut out of the packed order was not refused");
  } catch (const crashcap::Error& e) {
    CHECK(std::string(e.what()).find("its PackedSequence '0' was packed already sorted (no sorted_indices), and the "
                                     "rows kept are not in its order; refused") != std::string::npos);
  }
}

TEST_CASE("a PackedSequence's rows lie where its batch_sizes and sorted_indices put them", "[replayer]") {
  using crashcap::replayer::packedRowPositions;
  // Rows of lengths 2, 4, 1 packed longest first (rows 1, 0, 2): batch_sizes 3, 2, 1, 1.
  auto at = packedRowPositions({3, 2, 1, 1}, {1, 0, 2});
  REQUIRE(at);
  CHECK(*at == std::vector<std::vector<int64_t>>{{1, 4}, {0, 3, 5, 6}, {2}});
  // Packed already sorted: row r at place r.
  at = packedRowPositions({2, 1}, {});
  REQUIRE(at);
  CHECK(*at == std::vector<std::vector<int64_t>>{{0, 2}, {1}});
  // Sizes that grow or are not positive, indices that are no permutation of the rows: none.
  CHECK_FALSE(packedRowPositions({2, 3}, {}));
  CHECK_FALSE(packedRowPositions({2, 0}, {}));
  CHECK_FALSE(packedRowPositions({3, 1}, {0, 0, 2}));
  CHECK_FALSE(packedRowPositions({3, 1}, {0, 1}));
  CHECK(packedRowPositions({}, {})->empty());
}

TEST_CASE("a list of each row's own tensors is cut by its items, renamed to their places among the kept rows",
          "[replayer]") {
  using crashcap::replayer::movedItemInput;
  CHECK(movedItemInput("1", 5, 0, "1/5/boxes") == "1/0/boxes");
  CHECK(movedItemInput("1", 5, 0, "1/5") == "1/0");
  CHECK(movedItemInput("", 5, 2, "5/boxes") == "2/boxes");
  CHECK(movedItemInput("a/b", 1, 3, "a/b/1/x/y") == "a/b/3/x/y");
  CHECK_FALSE(movedItemInput("1", 5, 0, "1/50/boxes"));
  CHECK_FALSE(movedItemInput("1", 5, 0, "2/5/boxes"));

  // (images, [{"boxes", "labels"} of each image]): rows 1, 0, 1 of 2.
  const std::string batch = R"({"tuple": [{"tensor": "0"}, {"list": [
      {"dict": [["boxes", {"tensor": "1/0/boxes"}], ["labels", {"tensor": "1/0/labels"}]]},
      {"dict": [["boxes", {"tensor": "1/1/boxes"}], ["labels", {"tensor": "1/1/labels"}]]}]}]})";
  const json cut = json::parse(cutStructure(batch, 2, {1, 0, 1}, {"1"}));
  INFO(cut.dump());
  const json items = cut["tuple"][1]["list"];
  REQUIRE(items.size() == 3);
  for (int j = 0; j < 3; ++j) {
    CHECK(items[j]["dict"][0][1]["tensor"] == fmt::format("1/{}/boxes", j));
    CHECK(items[j]["dict"][1][1]["tensor"] == fmt::format("1/{}/labels", j));
  }
  CHECK(cut["tuple"][0] == json::parse(R"({"tensor": "0"})"));
  // Without the list named, a list whose items hold tensors stays whole.
  CHECK(cutStructure(batch, 2, {1}) == batch);
}

namespace {

/// A bundle of one step (3) whose batch is (images [3, 2], [{"boxes" [n, 4], "labels" [n]}] per row)
/// with 2, 3 and 1 objects: row 1's boxes have as many objects as the batch has rows.
crashcap::replayer::BatchCut cutTargetsBatch(const std::string& path, const std::vector<int64_t>& rows,
                                             const std::string& misnamed = "") {
  namespace formats = crashcap::formats;
  {
    auto w = formats::BundleWriter::create(path);
    auto name = [](const std::string& input) { return formats::batchTensorName(3, input); };
    formats::StepBeginData begin;
    begin.step = 3;
    formats::torch::writeTensor(*w, name("0"), at::arange(6, at::kFloat).reshape({3, 2}));
    begin.batch = {name("0")};
    begin.rowDims = {0};
    std::string items;
    const int64_t objects[] = {2, 3, 1};
    for (int64_t r = 0; r < 3; ++r) {
      const std::string boxes = r == 2 && !misnamed.empty() ? misnamed : fmt::format("1/{}/boxes", r);
      formats::torch::writeTensor(*w, name(boxes), at::full({objects[r], 4}, static_cast<float>(10 * r)));
      formats::torch::writeTensor(*w, name(fmt::format("1/{}/labels", r)), at::full({objects[r]}, r, at::kLong));
      begin.batch.push_back(name(boxes));
      begin.batch.push_back(name(fmt::format("1/{}/labels", r)));
      begin.rowDims.push_back(objects[r] == 3 ? 0 : -1);  // as the recorder guesses from sizes alone
      begin.rowDims.push_back(objects[r] == 3 ? 0 : -1);
      items += fmt::format(R"({}{{"dict": [["boxes", {{"tensor": "{}"}}], ["labels", {{"tensor": "1/{}/labels"}}]]}})",
                           r ? ", " : "", boxes, r);
    }
    formats::torch::writeTensor(*w, name("index"), at::tensor(std::vector<int64_t>{40, 41, 42}));
    begin.batch.push_back(name("index"));
    begin.rowDims.push_back(0);
    begin.structure = R"({"tuple": [{"tensor": "0"}, {"list": [)" + items + "]}]}";
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  auto reader = formats::BundleReader::open(path);
  const auto records = formats::readRecords(*reader);
  return crashcap::replayer::cutBatch(*reader, records, records.stepBegins.at(0), rows, "refused", "");
}

}  // namespace

TEST_CASE("a batch's list of each row's own tensors keeps the kept rows' items at their new places", "[replayer]") {
  crashcap::test::TempDir dir;
  const auto cut = cutTargetsBatch(dir.file("targets.ccap"), {2, 1});
  auto name = [](const std::string& input) { return crashcap::formats::batchTensorName(3, input); };
  CHECK(floats(cut.tensors.at(name("0"))) == std::vector<float>{4, 5, 2, 3});
  CHECK(longs(cut.tensors.at(name("index"))) == std::vector<int64_t>{42, 41});
  // Row 2's target is item 0 now, row 1's (3 objects: not cut as rows) item 1.
  CHECK(cut.tensors.at(name("1/0/boxes")).sizes() == at::IntArrayRef{1, 4});
  CHECK(floats(cut.tensors.at(name("1/0/boxes")))[0] == 20);
  CHECK(longs(cut.tensors.at(name("1/0/labels"))) == std::vector<int64_t>{2});
  CHECK(cut.tensors.at(name("1/1/boxes")).sizes() == at::IntArrayRef{3, 4});
  CHECK(longs(cut.tensors.at(name("1/1/labels"))) == std::vector<int64_t>{1, 1, 1});
  CHECK(cut.tensors.count(name("1/2/boxes")) == 0);
  CHECK(cut.batch == std::vector<std::string>{name("0"), name("1/0/boxes"), name("1/0/labels"), name("1/1/boxes"),
                                              name("1/1/labels"), name("index")});
  CHECK(cut.rowDims == std::vector<int8_t>{0, -1, -1, -1, -1, 0});
  const json structure = json::parse(cut.structure);
  REQUIRE(structure["tuple"][1]["list"].size() == 2);
  CHECK(structure["tuple"][1]["list"][1]["dict"][0][1]["tensor"] == "1/1/boxes");
  // A row repeated: a third item, a name the recording lacks.
  const auto twice = cutTargetsBatch(dir.file("twice.ccap"), {0, 0, 0});
  CHECK(twice.tensors.at(name("1/2/boxes")).sizes() == at::IntArrayRef{2, 4});
  // A tensor not named by its item's place cannot be given its new one: refused, naming it.
  try {
    cutTargetsBatch(dir.file("misnamed.ccap"), {0}, "1/9/boxes");
    FAIL("a misnamed row's own tensor was not refused");
  } catch (const crashcap::Error& e) {
    CHECK(std::string(e.what()).find("its tensor '1/9/boxes' is not named by its item's place") != std::string::npos);
  }
}

TEST_CASE("a list whose every item is a list of each row's own tensors too is neither cut nor judged by rows",
          "[replayer]") {
  // tuple(zip(*batch)) of (image, mask) pairs of their own sizes in a batch of 2: two fields of two
  // samples each, or, as the names alone say it, two samples of two fields each.
  namespace formats = crashcap::formats;
  crashcap::test::TempDir dir;
  const std::string path = dir.file("pairs.ccap");
  {
    auto w = formats::BundleWriter::create(path);
    formats::StepBeginData begin;
    begin.step = 0;
    for (const char* input : {"0/0", "0/1", "1/0", "1/1"}) {
      formats::torch::writeTensor(*w, formats::batchTensorName(0, input), at::zeros({1, 5, 7}));
      begin.batch.push_back(formats::batchTensorName(0, input));
      begin.rowDims.push_back(-1);
    }
    formats::torch::writeTensor(*w, formats::batchTensorName(0, "index"), at::tensor(std::vector<int64_t>{3, 9}));
    begin.batch.push_back(formats::batchTensorName(0, "index"));
    begin.rowDims.push_back(0);
    begin.structure = R"({"tuple": [{"tuple": [{"tensor": "0/0"}, {"tensor": "0/1"}]},
                                     {"tuple": [{"tensor": "1/0"}, {"tensor": "1/1"}]}]})";
    formats::writeMetaRecord(*w, begin);
    w->seal();
  }
  auto reader = formats::BundleReader::open(path);
  const auto records = formats::readRecords(*reader);
  const auto& begin = records.stepBegins.at(0);
  const auto lists = crashcap::replayer::rowOwnLists(begin, *reader, formats::batchRows(begin, *reader));
  REQUIRE(lists.size() == 1);  // the root; the lists inside it are not counted again
  CHECK(lists[0].list.empty());
  CHECK(lists[0].ambiguous);
  try {
    crashcap::replayer::cutBatch(*reader, records, begin, {1}, "refused", "");
    FAIL("an ambiguous list was cut");
  } catch (const crashcap::Error& e) {
    CHECK(std::string(e.what()).find("its list '' holds 2 items that each hold 2 items of tensors alike without rows") !=
          std::string::npos);
  }
}
