#pragma once
// The subcommands that re-execute a recording: replay, bisect, triage, report. Their options
// are plain structs so that main.cpp can wire them in every build; the commands themselves
// need LibTorch (investigate.cpp is built only with it).

#include <cstdint>
#include <string>
#include <vector>

namespace crashcap::cli {

struct ReplayCliOptions {
  int64_t step = -1;
  std::string device;                  ///< "": the recorded device when here, else cpu
  std::string dtype;                   ///< "" | "float64"
  std::vector<std::string> settings;   ///< "NAME=VALUE"
  bool json = false;
  std::string rows;                    ///< "0,3,5": keep only these rows of the target step's batch
  bool noInstrument = false;
};

struct BisectCliOptions {
  std::string what;                    ///< steps | ops | samples | config
  int64_t step = -1;
  double timeout = 300;
  double tolerance = 1e-3;             ///< ops: normalised error allowed against float64
  bool json = false;
};

struct TriageCliOptions {
  double timeout = 600;
  bool json = false;
};

struct ReportCliOptions {
  std::string out;
  bool noTriage = false;
  double timeout = 600;
};

int cmdReplay(const std::string& bundle, const ReplayCliOptions& o);
int cmdBisect(const std::string& bundle, const BisectCliOptions& o);
int cmdTriage(const std::string& bundle, const TriageCliOptions& o);
int cmdReport(const std::string& bundle, const ReportCliOptions& o);

}  // namespace crashcap::cli
