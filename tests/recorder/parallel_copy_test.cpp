// The keyframe copy's parallel memcpy (recorder/src/parallel_copy.hpp): every byte of every task
// lands where it belongs, whatever the sizes and however the shares fall across task boundaries.
#include <catch2/catch.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include "parallel_copy.hpp"
#include "test_support.hpp"

using namespace crashcap;

TEST_CASE("copyInParallel copies every task exactly, small or split across threads", "[recorder][copy]") {
  // Sizes that straddle the shares: odd lengths, an empty task, one larger than a share.
  const std::vector<std::vector<uint64_t>> layouts = {
      {1, 7, 4096},                                          // below the threshold: one thread
      {(9ull << 20) + 3, 0, (7ull << 20) + 61, 1, 5},        // 16 MiB and a bit, odd cuts
      {40ull << 20},                                         // one large tensor
  };
  uint64_t seed = 1;
  for (const auto& sizes : layouts) {
    std::vector<std::vector<uint8_t>> src, dst;
    std::vector<recorder::detail::CopyTask> tasks;
    uint64_t total = 0;
    for (uint64_t n : sizes) {
      src.push_back(test::randomBytes(n, seed++));
      dst.emplace_back(n, 0xAB);
      total += n;
    }
    for (size_t i = 0; i < sizes.size(); ++i) tasks.push_back({dst[i].data(), src[i].data(), sizes[i]});
    const unsigned threads = recorder::detail::copyInParallel(tasks);
    INFO("total " << total << " bytes, " << threads << " threads");
    for (size_t i = 0; i < sizes.size(); ++i) CHECK(dst[i] == src[i]);
    if (total < recorder::detail::kParallelCopyMinBytes) CHECK(threads == 1);
    else if (std::thread::hardware_concurrency() > 1) CHECK(threads > 1);
    CHECK(threads >= 1);
    CHECK(threads <= recorder::detail::kParallelCopyMaxThreads);
  }
}
