#include "crashcap/recorder/distributed.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "crashcap/formats/error.hpp"

namespace crashcap::recorder {

namespace {

const char* get(const EnvironmentLookup& lookup, const char* name) {
  return lookup ? lookup(name) : std::getenv(name);
}

/// A whole decimal int32, nothing else (" 1", "1x", "" are not).
std::optional<int32_t> integer(const char* text) {
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text, &end, 10);
  if (errno || *end || end == text || v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    return std::nullopt;
  return static_cast<int32_t>(v);
}

}  // namespace

std::pair<std::string, std::string> jobIdFromEnvironment(const std::string& rendezvous, const EnvironmentLookup& lookup) {
  if (const char* v = get(lookup, kJobIdVariable); v && *v) return {v, "crashcap run"};
  if (const char* v = get(lookup, "TORCHELASTIC_RUN_ID"); v && *v && std::string(v) != "none") return {v, "torchelastic"};
  if (!rendezvous.empty()) return {rendezvous, "rendezvous"};
  return {"", ""};
}

std::optional<formats::DistributedData> distributedFromEnvironment(const EnvironmentLookup& lookup) {
  auto rank = integer(get(lookup, "RANK"));
  auto world = integer(get(lookup, "WORLD_SIZE"));
  if (!rank || !world || *world < 1 || *rank < 0 || *rank >= *world) return std::nullopt;
  formats::DistributedData d;
  d.rank = *rank;
  d.worldSize = *world;
  auto local = integer(get(lookup, "LOCAL_RANK"));
  d.localRank = local && *local >= 0 && *local < *world ? *local : -1;
  const char* addr = get(lookup, "MASTER_ADDR");
  const char* port = get(lookup, "MASTER_PORT");
  if (addr && *addr && port && *port) d.rendezvous = fmt::format("env://{}:{}", addr, port);
  std::tie(d.jobId, d.jobIdSource) = jobIdFromEnvironment(d.rendezvous, lookup);
  d.source = "environment";
  return d;
}

void checkDistributed(const formats::DistributedData& d) {
  if (d.worldSize < 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("a distributed identity with world size {}", d.worldSize),
                "the world size counts the job's processes: 1 or more");
  if (d.rank < 0 || d.rank >= d.worldSize)
    throw Error(ErrorCode::InvalidArgument, fmt::format("rank {} is not in a world of {}", d.rank, d.worldSize),
                "ranks run from 0 to world size - 1");
  if (d.localRank < -1 || d.localRank >= d.worldSize)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("local rank {} is not in a world of {}", d.localRank, d.worldSize),
                "give -1 when the local rank is not known");
}

}  // namespace crashcap::recorder
