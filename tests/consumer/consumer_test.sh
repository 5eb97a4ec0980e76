#!/usr/bin/env bash
# A training program outside crashcap's tree, end to end, as a user meets crashcap:
#   cmake --install, find_package(crashcap) + crashcap::recorder in the program's own project,
#   the program crashes on a corrupt sample, and the *installed* crashcap replays and triages it,
#   directly and under `crashcap run`.
#
#   consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d /tmp/crashcap-consumer-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "consumer test FAILED: $*" >&2; exit 1; }
json() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

echo "== cmake --install into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install"; }
cc="$work/prefix/bin/crashcap"
[ -x "$cc" ] || fail "no installed crashcap at $cc"

echo "== configure and build tests/consumer against the installed package"
cmake -S "$src/tests/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure (find_package(crashcap))"; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
train="$work/build/consumer-train"

echo "== a clean run records and leaves no crash bundle"
"$train" --record "$work/clean" --steps 6 >/dev/null || fail "clean run exited $?"
! ls "$work"/clean/crash-*.ccap >/dev/null 2>&1 || fail "a clean run left a crash bundle"

echo "== a corrupt sample at step 9 crashes the training"
set +e
"$train" --record "$work/runs" --inf-at 9 >"$work/train.out" 2>"$work/train.err"
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$work/train.err"; fail "the faulty run exited $rc, expected 1"; }
bundles=("$work"/runs/crash-*.ccap)
[ "${#bundles[@]}" -eq 1 ] && [ -f "${bundles[0]}" ] || fail "expected exactly one crash bundle, found: ${bundles[*]}"
bundle=${bundles[0]}

echo "== installed crashcap: inspect, replay, triage"
"$cc" inspect "$bundle" --json >"$work/inspect.json"
[ "$(json "$work/inspect.json" 'd["crash"]["step"]')" = 9 ] || fail "inspect: crash step is not 9"
[ "$(json "$work/inspect.json" 'd["crash"]["kind"]')" = nonfinite ] || fail "inspect: crash kind is not nonfinite"
"$cc" replay "$bundle" --json >"$work/replay.json" || true
verdict=$(json "$work/replay.json" 'd["verdict"]')
[ "$verdict" = reproduced-bitwise ] || fail "replay verdict $verdict, expected reproduced-bitwise"
[ "$(json "$work/replay.json" 'd["first_nonfinite_op"]["name"]')" = aten::mm ] || fail "first non-finite op is not aten::mm"
"$cc" triage "$bundle" --json >"$work/triage.json" 2>"$work/triage.err" || true
verdictOf() { json "$work/triage.json" "[h['verdict'] for h in d['hypotheses'] if h['id']=='$1'][0]"; }
[ "$(verdictOf invalid-data)" = confirmed ] || { cat "$work/triage.json"; fail "invalid-data is not confirmed"; }
[ "$(verdictOf optimizer-divergence)" = refuted ] || fail "optimizer-divergence is not refuted"
[ "$(verdictOf loss-numerics)" = refuted ] || fail "loss-numerics is not refuted"
[ "$(json "$work/triage.json" 'd["culprit"]["rows"]')" = "[3]" ] || fail "culprit rows are not [3]"
[ "$(json "$work/triage.json" 'd["culprit"]["dataset_indices"]')" = "[147]" ] || fail "dataset index is not 147"
[ "$(json "$work/triage.json" 'd["culprit"]["step"]')" = 9 ] || fail "culprit step is not 9"

echo "== a torch::nn::Module training (setModel + setStep): the installed crashcap runs it again to replay"
set +e
"$train" --record "$work/module" --inf-at 9 --module >/dev/null 2>"$work/module.err"
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$work/module.err"; fail "the faulty module run exited $rc, expected 1"; }
mod=("$work"/module/crash-*.ccap)
[ "${#mod[@]}" -eq 1 ] && [ -f "${mod[0]}" ] || fail "module run: expected one bundle, found: ${mod[*]}"
(cd / && "$cc" replay "${mod[0]}" --json) >"$work/module-replay.json" || true
[ "$(json "$work/module-replay.json" 'd["verdict"]')" = reproduced-bitwise ] \
  || { cat "$work/module-replay.json"; fail "module replay is not reproduced-bitwise"; }
"$cc" triage "${mod[0]}" --json >"$work/module-triage.json" 2>/dev/null || true
mverdict() { json "$work/module-triage.json" "[h['verdict'] for h in d['hypotheses'] if h['id']=='$1'][0]"; }
[ "$(mverdict invalid-data)" = confirmed ] || { cat "$work/module-triage.json"; fail "module: invalid-data is not confirmed"; }
[ "$(json "$work/module-triage.json" 'd["culprit"]["rows"]')" = "[3]" ] || fail "module: culprit rows are not [3]"

echo "== under the installed crashcap run (the recorder writes into CRASHCAP_DIR)"
set +e
"$cc" run --dir "$work/supervised" -- "$train" --inf-at 9 >/dev/null 2>"$work/run.err"
rc=$?
set -e
[ "$rc" -eq 1 ] || { cat "$work/run.err"; fail "crashcap run exited $rc, expected the program's 1"; }
sup=("$work"/supervised/crash-*.ccap)
[ "${#sup[@]}" -eq 1 ] && [ -f "${sup[0]}" ] || fail "crashcap run: expected one bundle, found: ${sup[*]}"
"$cc" inspect "${sup[0]}" --json >"$work/sup.json"
[ "$(json "$work/sup.json" 'd["crash"]["classification"]')" = nonfinite-loss ] || fail "classification is not nonfinite-loss"
[ "$(json "$work/sup.json" 'd["steps"]["last"]')" = 9 ] || fail "the supervised bundle lacks the recorder's steps"
json "$work/sup.json" 'd["supervision"]["trace"]' | grep -q . || fail "the supervision record has no trace status"
echo "consumer test passed: $bundle triaged to row 3 (dataset index 147) by the installed crashcap"
