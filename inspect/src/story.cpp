#include "crashcap/inspect/story.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <cmath>

#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/observed_run.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/tensor_info.hpp"
#include "crashcap/inspect/stats.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::inspect {
namespace {

using nlohmann::json;

json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string numberText(double v) { return fmt::format("{:.6g}", v); }

/// The step a crash is about: the crash's own, else the last step begun.
int64_t focusStep(const formats::BundleRecords& v) {
  if (v.crash && v.crash->step >= 0) return v.crash->step;
  return v.stepBegins.empty() ? -1 : v.stepBegins.back().step;
}

}  // namespace

bool collectiveEndObservable(const std::string& name) { return name.rfind("nccl:", 0) != 0 && name.rfind("ucc:", 0) != 0; }

json collectiveJson(const formats::CollectiveData& c) {
  json inputs = json::array();
  for (const auto& in : c.inputs) inputs.push_back({{"dtype", in.dtype}, {"shape", in.shape}});
  return {{"seq", c.seq},
          {"name", c.name},
          {"step", c.step >= 0 ? json(c.step) : json(nullptr)},
          {"thread", c.thread},
          {"inputs", inputs},
          {"ended", c.endNs != 0},
          {"end_observable", collectiveEndObservable(c.name)},
          {"seconds", c.endNs != 0 ? json(double(c.endNs - c.startNs) / 1e9) : json(nullptr)}};
}

json collectivesJson(const formats::BundleRecords& v, size_t last) {
  json out = json::array();
  if (!v.opTrace) return out;
  const auto& cs = v.opTrace->collectives;
  for (size_t i = cs.size() > last ? cs.size() - last : 0; i < cs.size(); ++i) out.push_back(collectiveJson(cs[i]));
  return out;
}


std::string collectiveText(const json& c) {
  std::string inputs;
  for (const auto& in : c["inputs"]) {
    std::string shape;
    for (const auto& d : in["shape"]) shape += fmt::format("{}{}", shape.empty() ? "" : ", ", d.dump());
    inputs += fmt::format("{}{}[{}]", inputs.empty() ? "" : " ", in["dtype"].get<std::string>(), shape);
  }
  return fmt::format("#{} {} {} {}{}", c["seq"].dump(), c["name"].get<std::string>(),
                     c["step"].is_null() ? std::string("between steps") : "at step " + c["step"].dump(), inputs,
                     !collectiveEndObservable(c["name"].get<std::string>()) ? std::string(", issued (its completion on the GPU is not observable)")
                     : c["ended"] == true ? fmt::format(", ended after {:.3g} s", c["seconds"].get<double>())
                                          : std::string(", had not ended"));
}

json storyJson(const formats::BundleReader& reader, const StoryOptions& options) {
  auto v = formats::readRecords(reader);
  json j;
  j["bundle"] = reader.path();
  j["sealed"] = reader.report().sealed;
  j["state"] = reader.report().summary();
  if (auto info = reader.recordingInfo())
    j["run"] = {{"id", formats::formatRecordingId(reader.fileHeader().recordingId)},
                {"producer", info->producer},
                {"tool_version", info->toolVersion},
                {"hostname", info->hostname},
                {"pid", info->pid},
                {"created", formats::formatTime(info->createdNs)}};
  else
    j["run"] = nullptr;
  // Always an object (empty when the bundle has no fingerprint), so scripts can index it.
  auto env = reader.environment();
  j["env"] = env ? environmentJson(*env) : json::object();
  if (v.program)
    j["program"] = {{"format", v.program->format},
                    {"device", v.program->device},
                    {"inputs", v.program->inputs},
                    {"parameters", v.program->parameters.size()},
                    {"buffers", v.program->buffers.size()},
                    {"serves_replay", v.program->servesReplay}};
  if (v.program) {
    json sources = json::array();
    for (const auto& f : v.program->sources)
      sources.push_back({{"path", f.path}, {"sha256", f.sha256}, {"bytes", f.bytes}, {"tensor", f.tensor}});
    j["program"]["sources"] = sources;
  } else
    j["program"] = nullptr;
  if (v.optimizer) {
    json groups = json::array();
    for (const auto& g : v.optimizer->groups) {
      json opts = json::object();
      for (const auto& [k, val] : g.options) opts[k] = number(val);
      groups.push_back({{"parameters", g.parameters.size()}, {"options", opts}});
    }
    j["optimizer"] = {{"kind", v.optimizer->kind}, {"groups", groups}, {"grad_clip_norm", v.optimizer->gradClipNorm}};
  } else {
    j["optimizer"] = nullptr;
  }
  // A step's end record holds its loss, and is written before the optimizer's update: the step the
  // process failed in (a non-finite loss stops it there; an exception in optimizer.step(), a
  // SIGKILL in it, come after) ended but never completed. A crash between steps (validation,
  // logging, a signal while the loader waits, the loader's own error) names the step before it,
  // which did complete.
  const auto failedIn = formats::failedInStep(v);
  std::set<int64_t> ended;
  for (const auto& e : v.stepEnds) ended.insert(e.step);
  const size_t completed = ended.size() - (failedIn && ended.count(*failedIn) ? 1 : 0);
  json steps = {{"count", v.stepBegins.size()}, {"ended", ended.size()}, {"completed", completed}};
  steps["first"] = v.stepBegins.empty() ? json(nullptr) : json(v.stepBegins.front().step);
  steps["last"] = v.stepBegins.empty() ? json(nullptr) : json(v.stepBegins.back().step);
  steps["last_loss"] = v.stepEnds.empty() ? json(nullptr) : number(v.stepEnds.back().loss);
  // The schedule moves the learning rates: the optimizer record has the first ones.
  steps["last_learning_rates"] = json::array();
  if (!v.stepBegins.empty()) {  // the last step's update's, when its end(loss) kept them
    const auto& last = v.stepBegins.back();
    const formats::StepEndData* end = nullptr;
    for (const auto& e : v.stepEnds)
      if (e.step == last.step) end = &e;
    for (double lr : formats::updateLearningRates(last, end)) steps["last_learning_rates"].push_back(number(lr));
  }
  steps["last_grad_norm"] =
      v.stepEnds.empty() || !v.stepEnds.back().hasGradNorm ? json(nullptr) : number(v.stepEnds.back().gradNorm);
  // Steps the recorder lost (their records were dropped): replay cannot cross them.
  steps["lost"] = formats::lostSteps(v);
  j["steps"] = steps;
  json keyframes = json::array();
  for (const auto& k : v.keyframes) keyframes.push_back(k.step);
  j["keyframes"] = keyframes;
  if (v.crash) {
    const auto& c = *v.crash;
    j["crash"] = {{"kind", c.kind},
                  {"source", "recorder"},
                  {"step", c.step >= 0 ? json(c.step) : json(nullptr)},
                  {"phase", c.phase},
                  {"error", c.error},
                  {"error_type", c.errorType},
                  {"signal", c.signal ? json(c.signal) : json(nullptr)},
                  {"signal_name", c.signal ? json(c.signalName) : json(nullptr)},
                  {"stack", c.stack},
                  {"time", formats::formatTime(c.timeNs)},
                  {"pid", c.pid},
                  {"thread", c.thread}};
    if (c.phase == "loading" && !c.loadingIndices.empty()) {
      j["crash"]["loading_indices"] = c.loadingIndices;
      j["crash"]["loading_dataset_indices"] = c.loadingDatasetIndices;
    }
    // Another loader's batch the program held at a crash between steps (a validation pass's):
    // the tensors of it the bundle holds (a drain cut short by its deadline may have lost some).
    std::vector<std::string> held;
    for (const auto& name : c.otherBatch)
      if (reader.find(name)) held.push_back(name);
    j["crash"]["other_batch"] = formats::otherBatchBegin(c) && !held.empty()
                                    ? json{{"loader", c.otherLoader}, {"tensors", held}}
                                    : json(nullptr);
  } else if (v.supervision) {
    // No recorder in the process (or it never got to record): what `crashcap run` saw.
    const auto& sv = *v.supervision;
    // A recorder killed before it could say (SIGKILL) left where it was in its run status.
    auto killedIn = formats::killedInStep(v);
    j["crash"] = {{"kind", sv.signal ? "signal" : "exit"},
                  {"source", "supervisor"},
                  {"step", killedIn ? json(*killedIn) : json(nullptr)},
                  {"phase", killedIn && !v.status->lastPhase.empty() ? json(v.status->lastPhase) : json(nullptr)},
                  {"error", sv.evidence},
                  {"error_type", ""},
                  {"signal", sv.signal ? json(sv.signal) : json(nullptr)},
                  {"signal_name", sv.signal ? json(sv.signalName) : json(nullptr)},
                  {"stack", json::array()},
                  {"time", formats::formatTime(sv.endNs)},
                  {"pid", sv.pid},
                  {"thread", nullptr}};
  } else {
    j["crash"] = nullptr;
  }
  if (v.distributed) {
    const auto& d = *v.distributed;
    j["distributed"] = {{"job_id", d.jobId},
                        {"job_id_source", d.jobIdSource},
                        {"rank", d.rank},
                        {"world_size", d.worldSize},
                        {"local_rank", d.localRank >= 0 ? json(d.localRank) : json(nullptr)},
                        {"backend", d.backend},
                        {"rendezvous", d.rendezvous},
                        {"source", d.source}};
  } else {
    j["distributed"] = nullptr;
  }
  if (v.supervision) {
    const auto& sv = *v.supervision;
    j["crash"]["classification"] = sv.classification;
    j["crash"]["evidence"] = sv.evidence;
    j["supervision"] = {{"command", sv.command},
                        {"attempt", sv.attempt},
                        {"pid", sv.pid},
                        {"exit_code", sv.signal ? json(nullptr) : json(sv.exitCode)},
                        {"signal", sv.signal ? json(sv.signal) : json(nullptr)},
                        {"signal_name", sv.signal ? json(sv.signalName) : json(nullptr)},
                        {"classification", sv.classification},
                        {"evidence", sv.evidence},
                        {"stdout_tail", sv.stdoutTail},
                        {"stderr_tail", sv.stderrTail},
                        {"seconds", double(sv.endNs - sv.startNs) / 1e9},
                        {"trace", sv.trace},
                        {"interrupted", sv.interrupted},
                        {"stopped", sv.stopped},
                        {"environment", sv.environment}};
  } else {
    if (!j["crash"].is_null()) j["crash"]["classification"] = nullptr;
    j["supervision"] = nullptr;
  }
  json ops = json::array();
  if (v.opTrace) {
    size_t n = v.opTrace->ops.size(), from = n > options.lastOps ? n - options.lastOps : 0;
    for (size_t i = from; i < n; ++i) {
      const auto& o = v.opTrace->ops[i];
      json inputs = json::array();
      for (const auto& in : o.inputs) inputs.push_back({{"dtype", in.dtype}, {"shape", in.shape}});
      ops.push_back({{"index", o.index},
                     {"name", o.name},
                     {"phase", o.phase},
                     {"seq", o.sequenceNr},
                     {"step", o.step},
                     {"thread", o.thread},
                     {"inputs", inputs}});
    }
    j["op_trace"] = {{"total_ops", v.opTrace->totalOps},
                     {"capacity", v.opTrace->capacity},
                     {"total_collectives", v.opTrace->totalCollectives}};
  } else {
    j["op_trace"] = nullptr;
  }
  j["last_ops"] = ops;
  j["collectives"] = collectivesJson(v, options.lastCollectives);
  json tensors = json::array();
  int64_t focus = focusStep(v);
  for (const auto& b : v.stepBegins) {
    if (b.step != focus) continue;
    for (const auto& name : b.batch) {
      const auto* t = reader.find(name);
      if (!t) continue;
      json e = {{"name", name}, {"dtype", formats::dtypeName(t->dtype)}, {"shape", t->shape}};
      if (options.tensorStats && t->totalBytes <= reader.limits().maxTensorBytes) {
        try {
          HostTensor h{t->dtype, t->shape, reader.readTensor(*t)};
          e["stats"] = statsToJson(computeStats(h));
        } catch (const Error& err) {
          e["stats"] = nullptr;
          e["error"] = err.message();
        }
      }
      tensors.push_back(std::move(e));
    }
  }
  j["crash_step"] = focus >= 0 ? json(focus) : json(nullptr);
  j["crash_tensors"] = tensors;
  if (v.status) {
    j["status"] = v.status->state;
    j["dropped_records"] = v.status->droppedRecords;
    j["dropped_bytes"] = v.status->droppedBytes;
    j["warnings"] = v.status->warnings;
    j["segments_deleted"] = v.status->segmentsDeleted;
    j["keyframes_skipped"] = v.status->keyframesSkipped;
    j["keyframes_written_raw"] = v.status->keyframesWrittenRaw;
    j["keyframe_interval"] = v.status->keyframeInterval;
    j["buffer_pool_peak_bytes"] = v.status->bufferPoolPeakBytes;
  } else {
    j["status"] = nullptr;
    j["dropped_records"] = 0;
    j["dropped_bytes"] = 0;
    j["warnings"] = json::array();
    j["segments_deleted"] = 0;
    j["keyframes_skipped"] = 0;
    j["keyframes_written_raw"] = 0;
    j["keyframe_interval"] = 0;
    j["buffer_pool_peak_bytes"] = 0;
  }
  j["problems"] = v.problems;
  return j;
}

std::string storyText(const formats::BundleReader& reader, const StoryOptions& options) {
  json j = storyJson(reader, options);
  std::string s;
  auto str = [](const json& x) {
    if (x.is_string()) return x.get<std::string>();
    if (x.is_number_float()) return numberText(x.get<double>());
    return x.dump();
  };
  s += fmt::format("bundle     {}\n", reader.path());
  s += fmt::format("state      {}\n", str(j["state"]));
  if (!j["run"].is_null())
    s += fmt::format("run        {} by {} (pid {}) on {}, started {}\n", str(j["run"]["id"]),
                     str(j["run"]["producer"]), str(j["run"]["pid"]), str(j["run"]["hostname"]),
                     str(j["run"]["created"]));
  if (!j["distributed"].is_null()) {
    const auto& d = j["distributed"];
    std::string job = str(d["job_id"]).empty() ? "job id not known" : fmt::format("job {} ({})", str(d["job_id"]), str(d["job_id_source"]));
    s += fmt::format("rank       {} of {}{}{}, {}\n", str(d["rank"]), str(d["world_size"]),
                     d["local_rank"].is_null() ? "" : fmt::format(" (local rank {})", str(d["local_rank"])),
                     str(d["backend"]).empty() ? "" : fmt::format(", {}", str(d["backend"])), job);
  }
  const auto& facts = j["env"].value("facts", json::object());
  if (!facts.empty()) {
    // Only the facts the bundle has: `crashcap run`'s own bundle knows the machine, not LibTorch.
    std::string env;
    auto add = [&](const char* key, const char* label, const char* suffixKey = nullptr, const char* suffix = "") {
      if (!facts.contains(key)) return;
      env += fmt::format("{}{}{}", env.empty() ? "" : " | ", label, str(facts[key]));
      if (suffixKey && facts.contains(suffixKey)) env += fmt::format(" ({} {})", str(facts[suffixKey]), suffix);
    };
    add("os.name", "");
    add("cpu.model", "");
    add("torch.version", "torch ", "torch.threads", "threads");
    add("cuda.available", "cuda ");
    add("cudnn.benchmark", "cudnn benchmark ");
    add("cudnn.deterministic", "cudnn deterministic ");
    s += fmt::format("env        {}\n", env.empty() ? "(no facts recorded)" : env);
    std::string cmd;
    for (const auto& a : j["env"]["command_line"]) cmd += (cmd.empty() ? "" : " ") + str(a);
    if (!cmd.empty()) s += fmt::format("command    {}\n", cmd);
    if (!j["env"]["redacted"].empty()) s += fmt::format("redacted   {} secret value(s) withheld\n", j["env"]["redacted"].size());
  }
  if (!j["program"].is_null()) {
    std::string inputs;
    for (const auto& i : j["program"]["inputs"]) inputs += (inputs.empty() ? "" : ", ") + str(i);
    if (j["program"]["format"] == "torchscript")
      s += fmt::format("program    torchscript forward({}) -> loss; {} parameters, {} buffers\n", inputs,
                       str(j["program"]["parameters"]), str(j["program"]["buffers"]));
    else if (j["program"]["format"] == "python") {
      std::string files;
      for (const auto& f : j["program"]["sources"]) files += (files.empty() ? "" : ", ") + str(f["path"]);
      s += fmt::format("program    python (its own loop replays it: the recorded command line is run again); {} "
                       "parameters, {} buffers\n",
                       str(j["program"]["parameters"]), str(j["program"]["buffers"]));
      if (!files.empty()) s += fmt::format("sources    {}\n", files);
    } else
      s += fmt::format("program    {} ({}); {} parameters, {} buffers\n", str(j["program"]["format"]),
                       j["program"]["serves_replay"] == true
                           ? "no step program: the recorded command line replays it, through its setStep"
                           : "no step program and no setStep: replay from C++ with your step function",
                       str(j["program"]["parameters"]), str(j["program"]["buffers"]));
  }
  if (!j["optimizer"].is_null()) {
    // An option the groups set apart (an encoder's and a decoder's learning rates) is listed
    // per group, in the groups' order, the first kListedGroups of them: lr=0.001|0.003.
    constexpr size_t kListedGroups = 6;
    std::string opts;
    const auto& groups = j["optimizer"]["groups"];
    if (!groups.empty())
      for (const auto& [k, val] : groups[0]["options"].items()) {
        std::vector<std::string> values;
        bool same = true;
        for (const auto& g : groups) {
          const auto& o = g["options"];
          if (values.size() < kListedGroups) values.push_back(o.contains(k) ? str(o[k]) : "-");
          same = same && o.contains(k) && o[k] == val;
        }
        std::string listed = fmt::format("{}", fmt::join(values, "|"));
        if (groups.size() > kListedGroups) listed += fmt::format("|... ({} groups)", groups.size());
        opts += fmt::format("{}{}={}", opts.empty() ? "" : " ", k, same ? str(val) : listed);
      }
    const auto& st = j["steps"];
    std::string now;
    if (!st["last_learning_rates"].empty()) {
      std::vector<std::string> lrs;
      for (const auto& lr : st["last_learning_rates"]) lrs.push_back(str(lr));
      now = fmt::format("; at step {}: lr {}", str(st["last"]), fmt::join(lrs, ", "));
    }
    s += fmt::format("optimizer  {} ({} group(s)) {} (as first recorded){}\n", str(j["optimizer"]["kind"]),
                     j["optimizer"]["groups"].size(), opts, now);
  }
  const auto& st = j["steps"];
  if (st["count"].get<uint64_t>() > 0)
    s += fmt::format("steps      {}..{}: {} recorded, {} completed; last loss {}, grad norm {}\n", str(st["first"]),
                     str(st["last"]), str(st["count"]), str(st["completed"]), str(st["last_loss"]),
                     str(st["last_grad_norm"]));
  else
    s += "steps      none recorded\n";
  if (!st["lost"].empty()) {
    // Runs of three or more as a range: a SIGKILL can leave hundreds of queued steps unwritten.
    std::string lost;
    const auto& ls = st["lost"];
    for (size_t i = 0; i < ls.size();) {
      size_t j = i;
      while (j + 1 < ls.size() && ls[j + 1].get<int64_t>() == ls[j].get<int64_t>() + 1) ++j;
      const std::string run = j >= i + 2 ? fmt::format("{}..{}", str(ls[i]), str(ls[j])) : str(ls[i]);
      lost += (lost.empty() ? "" : ", ") + run;
      i = j >= i + 2 ? j + 1 : i + 1;
    }
    s += fmt::format("lost       step{} {}: {} records are not in the bundle (dropped while the writer was behind, or "
                     "still queued when the process died); replay stops before a lost step\n",
                     st["lost"].size() == 1 ? "" : "s", lost, st["lost"].size() == 1 ? "its" : "their");
  }
  std::string kfs;
  for (const auto& k : j["keyframes"]) kfs += (kfs.empty() ? "" : ", ") + str(k);
  s += fmt::format("keyframes  {}\n", kfs.empty() ? "none" : kfs);
  if (!j["crash"].is_null()) {
    const auto& c = j["crash"];
    std::string where = c["step"].is_null()
                            ? std::string(c["source"] == "recorder" ? "before any step"
                                                                    : "(seen from outside: no recorder in the process)")
                            : fmt::format("{} step {}, phase {}",
                                          formats::stepPreposition(c["phase"].is_string() ? str(c["phase"]) : ""),
                                          str(c["step"]), c["phase"].is_null() ? std::string("unknown") : str(c["phase"]));
    s += fmt::format("\nCRASH      {} {}{}\n", str(c["kind"]), where,
                     c["signal"].is_null() ? "" : fmt::format(", signal {}", str(c["signal_name"])));
    std::string err = str(c["error"]);
    // A front end's notes come first, each a line in parentheses ("(DataLoader #0 raised it while
    // loading ...)"): they stay. Of the rest, the last lines: a traceback's hold the message.
    std::string notes;
    while (!err.empty() && err[0] == '(') {
      const size_t nl = err.find('\n');
      if (nl == std::string::npos || err[nl - 1] != ')') break;
      notes += err.substr(0, nl + 1) + "           ";
      err = err.substr(nl + 1);
    }
    if (std::count(err.begin(), err.end(), '\n') > 8) {
      auto cut = err.size();
      for (int n = 0; n < 8 && cut > 0; ++n) cut = err.rfind('\n', cut - 1);
      err = "..." + err.substr(cut);
    }
    err = notes + err;
    s += fmt::format("error      {}\n", err);
    if (!c["classification"].is_null())
      s += fmt::format("class      {}  (crashcap run: {})\n", str(c["classification"]), str(c["evidence"]));
    if (!str(c["error_type"]).empty()) s += fmt::format("type       {}\n", str(c["error_type"]));
    if (c.contains("other_batch") && !c["other_batch"].is_null()) {
      std::string names;
      for (const auto& n : c["other_batch"]["tensors"]) names += (names.empty() ? "" : ", ") + str(n);
      s += fmt::format("held       DataLoader #{}'s batch, no step's, as the program held it at the crash: {} "
                       "(crashcap show BUNDLE NAME)\n",
                       str(c["other_batch"]["loader"]), names);
    }
    size_t shown = 0;
    for (const auto& f : c["stack"]) {
      if (shown++ >= options.stackFrames) {
        s += fmt::format("           ... {} more frames (--json shows all)\n", c["stack"].size() - options.stackFrames);
        break;
      }
      s += fmt::format("  #{:<3}    {}\n", shown - 1, str(f));
    }
  } else if (str(j["status"]) == "interrupted") {
    s += "\nNO CRASH RECORD: the recording ends without a crash or a clean close; the process was killed\n"
         "           (SIGKILL, the OOM killer, a scheduler) or the machine lost power. The last steps below\n"
         "           are the last that reached the disk.\n";
  } else {
    s += "\nno crash recorded\n";
  }
  if (!j["supervision"].is_null()) {
    const auto& sv = j["supervision"];
    std::string cmd;
    for (const auto& a : sv["command"]) cmd += (cmd.empty() ? "" : " ") + str(a);
    s += fmt::format("\nrun        `{}` (attempt {}, pid {}), {} after {:.1f} s{}\n", cmd, str(sv["attempt"]), str(sv["pid"]),
                     sv["signal"].is_null() ? "exit status " + str(sv["exit_code"]) : "killed by " + str(sv["signal_name"]),
                     sv["seconds"].get<double>(), sv["interrupted"] == true ? " (stopped by crashcap run)" : "");
    s += fmt::format("trace      {}\n", str(sv["trace"]));
    std::string tail = str(sv["stderr_tail"]);
    size_t cut = tail.size();
    for (int n = 0; n < 6 && cut > 0 && cut != std::string::npos; ++n) cut = tail.rfind('\n', cut - 1);
    if (!tail.empty())
      s += "stderr     ...\n" + (cut == std::string::npos || cut == 0 ? tail : tail.substr(cut + 1)) + (tail.back() == '\n' ? "" : "\n");
  }
  if (!j["last_ops"].empty()) {
    s += fmt::format("\nlast ops ({} of {} observed)\n", j["last_ops"].size(), str(j["op_trace"]["total_ops"]));
    for (const auto& o : j["last_ops"]) {
      std::string inputs;
      for (const auto& in : o["inputs"]) {
        std::string shape;
        for (const auto& d : in["shape"]) shape += (shape.empty() ? "" : ", ") + str(d);
        inputs += fmt::format("{}{}[{}]", inputs.empty() ? "" : " ", str(in["dtype"]), shape);
      }
      s += fmt::format("  {:>8} {:<9} step {:<5} {:<36} {}\n", str(o["index"]), str(o["phase"]), str(o["step"]),
                       str(o["name"]), inputs);
    }
  }
  if (!j["collectives"].empty()) {
    s += fmt::format("\nlast collectives ({} of {} issued)\n", j["collectives"].size(),
                     str(j["op_trace"]["total_collectives"]));
    for (const auto& c : j["collectives"]) s += "  " + collectiveText(c) + "\n";
  }
  if (!j["crash_tensors"].empty()) {
    bool older = !j["crash"].is_null() && !j["crash"]["step"].is_null() && j["crash"]["step"] != j["crash_step"];
    s += fmt::format("\nbatch of step {}{}\n", str(j["crash_step"]),
                     older ? fmt::format(" (the newest recorded; step {}'s is not in the bundle)", str(j["crash"]["step"]))
                           : std::string());
    for (const auto& t : j["crash_tensors"]) {
      std::string shape;
      for (const auto& d : t["shape"]) shape += (shape.empty() ? "" : ", ") + str(d);
      std::string stats;
      if (t.contains("stats") && !t["stats"].is_null()) {
        const auto& x = t["stats"];
        stats = fmt::format("min {} max {} mean {}", str(x["min"]), str(x["max"]), str(x["mean"]));
        if (x["nan_count"].get<uint64_t>() > 0)
          stats += fmt::format("  NaN {} (first at {})", str(x["nan_count"]), str(x["first_nan"]));
        if (x["inf_count"].get<uint64_t>() > 0)
          stats += fmt::format("  Inf {} (first at {})", str(x["inf_count"]), str(x["first_inf"]));
      }
      s += fmt::format("  {:<32} {:<8} [{}]  {}\n", str(t["name"]), str(t["dtype"]), shape, stats);
    }
  }
  if (j["status"].is_null() && !j["supervision"].is_null() && j["steps"]["count"].get<uint64_t>() == 0) {
    // Under crashcap run --record the recorder starts at the training's first batch; without it,
    // nothing in the process recorded.
    const bool observed = formats::askedToRecord(j["supervision"]["environment"].get<std::vector<std::string>>());
    s += observed ? "\nrecorder   none yet: the process ended before its training's first batch, where crashcap run --record "
                    "begins recording; no steps, batches or weights to replay\n"
                  : "\nrecorder   none in the process: no steps, batches or weights to replay (crashcap run --record "
                    "records a Python training; docs/RECORDING.md a C++ one)\n";
  } else {
    s += fmt::format("\nrecorder   {}; {} records dropped ({})", j["status"].is_null() ? "no status record" : str(j["status"]),
                     str(j["dropped_records"]), formatBytes(j["dropped_bytes"].get<uint64_t>()));
    if (j["segments_deleted"].get<uint64_t>())
      s += fmt::format("; {} old segments deleted by retention", str(j["segments_deleted"]));
    if (j["keyframes_skipped"].get<uint64_t>())
      s += fmt::format("; {} keyframes skipped (the last was still being written)", str(j["keyframes_skipped"]));
    if (j["keyframes_written_raw"].get<uint64_t>())
      s += fmt::format("; {} keyframes finished uncompressed (the writer had fallen behind)",
                       str(j["keyframes_written_raw"]));
    if (j["keyframe_interval"].get<int64_t>() > 0)
      // The interval the recorder held at its end: an automatic cadence starts at its floor and
      // may widen, so the keyframes listed above can lie closer together than this.
      s += fmt::format("; keyframe interval {} steps at the end", str(j["keyframe_interval"]));
    if (j["buffer_pool_peak_bytes"].get<uint64_t>())
      s += fmt::format("; copies held at most {} of host memory", formatBytes(j["buffer_pool_peak_bytes"].get<uint64_t>()));
    s += "\n";
  }
  for (const auto& w : j["warnings"]) s += fmt::format("warning    {}\n", str(w));
  for (const auto& p : j["problems"]) s += fmt::format("problem    {}\n", str(p));
  // Only a hint that can be run as printed: a bundle without tensors has nothing to show.
  if (!j["crash"].is_null() && !j["crash_tensors"].empty())
    s += fmt::format("\nnext       crashcap show {} {} --stats\n", reader.path(), str(j["crash_tensors"][0]["name"]));
  return s;
}

}  // namespace crashcap::inspect
