#pragma once
// An op's own arguments and results as an at::RecordFunction observer sees them.
//
// On the unboxed call path inputs() and outputs() are exactly the op's arguments and results.
// On the boxed path (every op the TorchScript interpreter calls) they are the interpreter's whole
// stack: values left there by earlier instructions come first, the op's own arguments (at the
// start callback) or results (at the end callback) last. num_inputs() and num_outputs() give the
// schema's counts (for a RecordFunction named by a string, the vectors' sizes), so the op's own
// values are the last that many.

#include <ATen/record_function.h>

#include <vector>

namespace crashcap::formats::torch {

/// The op's own arguments: valid in the start callback only.
inline c10::ArrayRef<const c10::IValue> opArguments(const at::RecordFunction& fn) {
  c10::ArrayRef<const c10::IValue> all = fn.inputs();
  size_t own = fn.num_inputs();
  return own < all.size() ? all.slice(all.size() - own) : all;
}

/// The op's own results: valid in the end callback.
inline c10::ArrayRef<c10::IValue> opResults(const at::RecordFunction& fn) {
  const std::vector<c10::IValue>& all = fn.outputs();
  size_t own = fn.num_outputs();
  c10::ArrayRef<c10::IValue> ref(all);
  return own < ref.size() ? ref.slice(ref.size() - own) : ref;
}

}  // namespace crashcap::formats::torch
