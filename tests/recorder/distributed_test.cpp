// A rank's place in its job, as a launcher's environment says it.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include "crashcap/formats/error.hpp"
#include "crashcap/recorder/distributed.hpp"

using namespace crashcap::recorder;

namespace {

EnvironmentLookup lookupIn(const std::map<std::string, std::string>& env) {
  return [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

}  // namespace

TEST_CASE("torchrun's variables place a rank in its job", "[recorder][distributed]") {
  auto d = distributedFromEnvironment(lookupIn({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                                {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "29500"},
                                                {"TORCHELASTIC_RUN_ID", "none"}}));
  REQUIRE(d);
  CHECK(d->rank == 3);
  CHECK(d->worldSize == 4);
  CHECK(d->localRank == 1);
  CHECK(d->rendezvous == "env://10.0.0.2:29500");
  CHECK(d->backend.empty());  // the environment does not say
  CHECK(d->source == "environment");
  // torchrun's default run id "none" names no job: the rendezvous the ranks met at does.
  CHECK(d->jobId == "env://10.0.0.2:29500");
  CHECK(d->jobIdSource == "rendezvous");
}

TEST_CASE("the job id comes from crashcap run first, then torchelastic, then the rendezvous", "[recorder][distributed]") {
  std::map<std::string, std::string> env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"},
                                         {"TORCHELASTIC_RUN_ID", "study-7"}};
  CHECK(distributedFromEnvironment(lookupIn(env))->jobId == "study-7");
  CHECK(distributedFromEnvironment(lookupIn(env))->jobIdSource == "torchelastic");
  env[kJobIdVariable] = "job-123";
  CHECK(distributedFromEnvironment(lookupIn(env))->jobId == "job-123");
  CHECK(distributedFromEnvironment(lookupIn(env))->jobIdSource == "crashcap run");
  CHECK(jobIdFromEnvironment("", lookupIn({})) == std::pair<std::string, std::string>{"", ""});
}

TEST_CASE("a process that is not a rank, or whose variables contradict, is not placed", "[recorder][distributed]") {
  CHECK_FALSE(distributedFromEnvironment(lookupIn({})));
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "0"}})));        // no world size
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"WORLD_SIZE", "2"}})));  // no rank
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "2"}, {"WORLD_SIZE", "2"}})));
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "-1"}, {"WORLD_SIZE", "2"}})));
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "1x"}, {"WORLD_SIZE", "2"}})));
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "0"}, {"WORLD_SIZE", "0"}})));
  CHECK_FALSE(distributedFromEnvironment(lookupIn({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}})));
  // A bad LOCAL_RANK alone leaves the rank placed, its local rank unknown.
  auto d = distributedFromEnvironment(lookupIn({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "7"}}));
  REQUIRE(d);
  CHECK(d->localRank == -1);
  CHECK(d->jobId.empty());
}

TEST_CASE("an identity a program gives is checked", "[recorder][distributed]") {
  crashcap::formats::DistributedData d;
  d.rank = 1;
  d.worldSize = 2;
  CHECK_NOTHROW(checkDistributed(d));
  d.rank = 2;
  CHECK_THROWS_AS(checkDistributed(d), crashcap::Error);
  d.rank = 0;
  d.worldSize = 0;
  CHECK_THROWS_AS(checkDistributed(d), crashcap::Error);
  d.worldSize = 2;
  d.localRank = -2;
  CHECK_THROWS_AS(checkDistributed(d), crashcap::Error);
}
