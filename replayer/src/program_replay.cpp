#include "crashcap/replayer/program_replay.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/replayer/replay_json.hpp"

namespace crashcap::replayer {

using nlohmann::json;
using namespace json_fields;

json toJson(const ReplayRequest& r) {
  return {{"crashcap_version", formats::toolVersion()},
          {"bundle", r.bundle},
          {"options", toJson(r.options)},
          {"compare", r.compare},
          {"tolerance", r.tolerance},
          {"side", comparisonSideName(r.side)},
          {"reference_outputs", r.referenceOutputs},
          {"result_path", r.resultPath}};
}

ReplayRequest replayRequestFromJson(const json& j) {
  ReplayRequest r;
  r.bundle = text(j, "bundle");
  r.options = replayOptionsFromJson(at(j, "options"));
  r.compare = flag(j, "compare");
  r.tolerance = real(j, "tolerance");
  r.side = parseComparisonSide(j.value("side", "both"));  // absent before programs could serve one side
  r.referenceOutputs = j.value("reference_outputs", "");
  r.resultPath = text(j, "result_path");
  return r;
}

std::optional<ReplayRequest> replayRequestOfThisProcess() {
  const char* path = std::getenv(kReplayRequestVariable);
  if (!path || !*path) return std::nullopt;
  std::ifstream in(path);
  if (!in)
    throw Error(ErrorCode::Io, fmt::format("cannot read the replay request {} ({}): {}", path, kReplayRequestVariable,
                                           std::strerror(errno)),
                "crashcap replay writes it before it starts the program; do not set the variable by hand");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return replayRequestFromJson(json::parse(text.str()));
  } catch (const json::exception& e) {
    throw Error(ErrorCode::Corrupt, fmt::format("the replay request {} is not JSON: {}", path, e.what()));
  } catch (Error& e) {
    throw e.with(fmt::format("while reading the replay request {} (this program is built with crashcap {})", path,
                             formats::toolVersion()));
  }
}

namespace {

ErrorCode errorCodeNamed(const std::string& name) {
  for (int c = static_cast<int>(ErrorCode::Io); c <= static_cast<int>(ErrorCode::Internal); ++c)
    if (errorCodeName(static_cast<ErrorCode>(c)) == name) return static_cast<ErrorCode>(c);
  return ErrorCode::Internal;
}

}  // namespace

json toJson(const ReplayOutcome& o) {
  json j = {{"crashcap_version", formats::toolVersion()}};
  if (o.replay)
    j["replay"] = toJson(*o.replay);
  else if (o.comparison)
    j["comparison"] = toJson(*o.comparison);
  else if (o.error)
    j["error"] = {{"code", std::string(errorCodeName(o.error->code()))},
                  {"message", o.error->message()},
                  {"hint", o.error->hint()},
                  {"context", o.error->context()}};
  else
    throw Error(ErrorCode::Internal, "an empty replay outcome");
  return j;
}

ReplayOutcome replayOutcomeFromJson(const json& j) {
  ReplayOutcome o;
  if (j.is_object() && j.contains("replay")) {
    o.replay = replayResultFromJson(j["replay"]);
  } else if (j.is_object() && j.contains("comparison")) {
    o.comparison = referenceComparisonFromJson(j["comparison"]);
  } else {
    const json& e = at(j, "error");
    Error error(errorCodeNamed(text(e, "code")), text(e, "message"), optText(e, "hint"));
    if (e.contains("context") && e["context"].is_array())
      for (const auto& frame : e["context"])
        if (frame.is_string()) error.with(frame.get<std::string>());
    o.error = std::move(error);
  }
  return o;
}

bool writeReplayOutcome(const ReplayRequest& request, const ReplayOutcome& outcome) {
  // Written whole to a temporary name and renamed: crashcap reads either nothing or all of it.
  const std::string partial = request.resultPath + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << toJson(outcome).dump();
    out.close();
    if (!out) {
      std::fprintf(stderr, "crashcap: cannot write the replay result %s: %s\n", partial.c_str(), std::strerror(errno));
      return false;
    }
  }
  if (std::rename(partial.c_str(), request.resultPath.c_str()) != 0) {
    std::fprintf(stderr, "crashcap: cannot write the replay result %s: %s\n", request.resultPath.c_str(),
                 std::strerror(errno));
    return false;
  }
  return true;
}

bool serveReplayRequest(const ReplayRequest& request, const NamedTensors& parameters, const NamedTensors& buffers,
                        const StepFunction& step) {
  ReplayOutcome outcome;
  try {
    if (request.compare && request.side != ComparisonSide::Both)
      throw Error(ErrorCode::Internal, fmt::format("a C++ program serves both sides of an ops bisection at once, not the {} "
                                                   "side alone",
                                                   comparisonSideName(request.side)));
    if (request.compare)
      outcome.comparison = compareWithReference(request.bundle, parameters, buffers, step, request.options, request.tolerance);
    else
      outcome.replay = replay(request.bundle, parameters, buffers, step, request.options);
  } catch (const Error& e) {
    outcome = {};
    outcome.error = e;
  } catch (const std::exception& e) {
    outcome = {};
    outcome.error = Error(ErrorCode::Internal, fmt::format("replay in the program failed: {}", e.what()));
  }
  return writeReplayOutcome(request, outcome);
}

}  // namespace crashcap::replayer
