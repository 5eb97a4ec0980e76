// cutStructure: a Python batch's per-row lists go with the rows its tensors are cut to.

// LibTorch first: glog's CHECK must not replace Catch's.
#include "crashcap/formats/error.hpp"
#include "crashcap/replayer/batch_cut.hpp"
#undef CHECK

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

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
