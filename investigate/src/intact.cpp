#include "crashcap/investigate/intact.hpp"

#include <fmt/format.h>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"

namespace crashcap::investigate {

std::string BundleDamage::describe(const std::string& bundle) const {
  std::string what;
  const size_t shown = std::min<size_t>(problems.size(), 3);
  for (size_t i = 0; i < shown; ++i) what += (i ? "; " : "") + problems[i];
  if (problems.size() > shown) what += fmt::format("; and {} more", problems.size() - shown);
  std::string meaning =
      crashLost ? "its crash record is lost, so replay cannot tell which step failed or how, and a verdict from what is "
                  "left would answer a different question"
                : "the steps, keyframes or records lost with the damage are not there to replay or compare against, so a "
                  "verdict from what is left may be wrong";
  return fmt::format("{} is damaged ({}): {}", bundle, what, meaning);
}

std::optional<BundleDamage> findDamage(const std::string& bundle) {
  BundleDamage d;
  try {
    auto report = formats::verifyBundle(bundle);
    if (report.ok()) return std::nullopt;
    d.sealed = report.sealed;
    for (const auto& p : report.problems) d.problems.push_back(fmt::format("{}: {}", p.where, p.what));
  } catch (const Error& e) {
    // Not a bundle, made by a newer crashcap, beyond the reader's limits, not there: said as they are.
    if (e.code() != ErrorCode::Truncated && e.code() != ErrorCode::Corrupt) throw;
    d.problems.push_back(e.what());
    d.crashLost = true;
    return d;
  }
  try {
    auto reader = formats::BundleReader::open(bundle);
    d.crashLost = !formats::readRecords(*reader).crash;
  } catch (const Error&) {
    d.crashLost = true;
  }
  return d;
}

std::optional<BundleDamage> findRecoveredLoss(const std::string& bundle) {
  // A copy `crashcap recover` made of a damaged file passes verify, but what the damage took is
  // still gone; without its crash record it would replay an earlier step as if it were the failure.
  auto reader = formats::BundleReader::open(bundle);
  const formats::NoteData* recovery = nullptr;
  for (const auto& n : reader->notes())
    if (n.key == "crashcap.recovery") recovery = &n;
  if (!recovery || formats::readRecords(*reader).crash) return std::nullopt;
  BundleDamage d;
  d.sealed = true;
  d.crashLost = true;
  d.problems.push_back("recovered from a damaged file (its crashcap.recovery note), without a crash record");
  return d;
}

std::optional<BundleDamage> requireIntact(const std::string& bundle, bool allowDamaged) {
  auto damage = findDamage(bundle);
  if (!damage) damage = findRecoveredLoss(bundle);
  if (damage && !allowDamaged)
    throw Error(ErrorCode::Corrupt, damage->describe(bundle),
                fmt::format("`crashcap verify {0}` lists the damage; `crashcap recover {0} OUT.ccap` writes a sealed copy of "
                            "what is intact; --allow-damaged investigates this file as it is",
                            bundle));
  return damage;
}

}  // namespace crashcap::investigate
