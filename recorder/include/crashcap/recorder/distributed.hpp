#pragma once
// Where a recorded process stands in a multi-process job (torch.distributed, c10d): its rank,
// the world size, the backend and the job id that every rank's recording of one job shares.
// docs/RECORDING.md, "Multi-process jobs".

#include <functional>
#include <optional>
#include <string>

#include "crashcap/formats/records.hpp"

namespace crashcap::recorder {

/// Set by `crashcap run` for every command it starts, one id per run of the command: every
/// rank a launcher under it starts inherits it. A value already in crashcap run's own
/// environment is kept (the same id on every node of a multi-node job).
inline constexpr const char* kJobIdVariable = "CRASHCAP_JOB_ID";

/// Reads one environment variable (nullptr: unset). The default is std::getenv.
using EnvironmentLookup = std::function<const char*(const char*)>;

/// The job id of this process and where it came from: $CRASHCAP_JOB_ID ("crashcap run"), else
/// $TORCHELASTIC_RUN_ID unless torchrun's default "none" ("torchelastic"), else `rendezvous`
/// ("rendezvous": the ranks of one job met there). {"", ""} when none of them is known.
std::pair<std::string, std::string> jobIdFromEnvironment(const std::string& rendezvous,
                                                         const EnvironmentLookup& lookup = {});

/// What a launcher (torchrun, `python -m torch.distributed.run`, `crashcap run --nproc`, a
/// script that sets the variables itself) told this process: RANK and WORLD_SIZE (both, as
/// integers, with 0 <= RANK < WORLD_SIZE), LOCAL_RANK when valid, MASTER_ADDR and MASTER_PORT
/// as the rendezvous "env://HOST:PORT", and the job id. The backend is not known from the
/// environment. nullopt when the process is not a rank of a job (or the variables contradict
/// each other: a rank the recording could not place is better left out than made up).
std::optional<formats::DistributedData> distributedFromEnvironment(const EnvironmentLookup& lookup = {});

/// Throws crashcap::Error{InvalidArgument} naming what is wrong with an identity a program gives
/// (world size < 1, rank outside the world, local rank < -1 or outside the world).
void checkDistributed(const formats::DistributedData& identity);

}  // namespace crashcap::recorder
