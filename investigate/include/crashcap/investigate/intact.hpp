#pragma once
// Before any verdict: is the bundle whole? A replay of a damaged bundle can be wrong without
// failing (a bundle cut in half has lost its crash record and replays an earlier step "bit for
// bit"), so every investigation first runs the check `crashcap verify` runs and says what is lost.

#include <optional>
#include <string>
#include <vector>

namespace crashcap::investigate {

/// What verify found wrong with a bundle.
struct BundleDamage {
  std::vector<std::string> problems;   ///< verify's problems, one line each, in file order
  bool sealed = false;                 ///< a valid footer and index were found
  bool crashLost = false;              ///< no crash record could be read
  /// One paragraph: what is damaged or lost and what that means for a verdict.
  std::string describe(const std::string& bundle) const;
};

/// The damage in `bundle` (formats::verifyBundle), nullopt when it is whole. A file too damaged
/// to be read as a bundle at all is damage too (its one problem says why); a file that is not a
/// bundle, was made by a newer crashcap or is beyond the reader's limits is an error as it is.
std::optional<BundleDamage> findDamage(const std::string& bundle);

/// A bundle `crashcap recover` wrote from a damaged file (it passes verify) that has no crash
/// record: damage too, for a replay, which would take an earlier step for the failure.
std::optional<BundleDamage> findRecoveredLoss(const std::string& bundle);

/// Throws crashcap::Error{Corrupt} describing the damage (findDamage, then findRecoveredLoss)
/// when `bundle` is damaged and
/// `allowDamaged` is false; returns the damage (or nullopt) otherwise.
std::optional<BundleDamage> requireIntact(const std::string& bundle, bool allowDamaged);

}  // namespace crashcap::investigate
