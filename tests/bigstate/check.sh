#!/usr/bin/env bash
# The big-state check (./dev bigstate): records crashcap-bigstate (512 MiB of weights on Adam, a
# 1.5 GiB keyframe against the writer's default 512 MiB queue budget) under the default policy
# and with a keyframe every 5 steps, then checks that
#   - no step was lost: every step from the first retained keyframe to the crash has its batch,
#   - replay of the crash step is reproduced-bitwise,
#   - replay of the newest keyframe's own step is reproduced-bitwise (the step records a
#     keyframe used to crowd out).
# Minutes of CPU and about 8 GiB of memory; not part of ./dev test.
#   usage: tests/bigstate/check.sh BIN_DIR [STEPS]
set -euo pipefail
bin=${1:?usage: check.sh BIN_DIR [STEPS]}
steps=${2:-30}
nan_step=$((steps - 1))
py=/usr/bin/python3
work=$(mktemp -d "${TMPDIR:-/tmp}/crashcap-bigstate.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

check() {  # check NAME KEYFRAME_EVERY
  local name=$1 every=$2 dir="$work/$1"
  mkdir -p "$dir"
  echo "== $name: $steps steps, NaN at step $nan_step, keyframe every ${every:-default}"
  local args=(--record "$dir" --steps "$steps" --nan-step "$nan_step")
  [ -n "$every" ] && args+=(--keyframe-every "$every")
  local rc=0
  /usr/bin/time -f "recording: %e s wall, peak RSS %M KiB" "$bin/crashcap-bigstate" "${args[@]}" || rc=$?
  if [ "$rc" -ne 1 ]; then echo "FAIL $name: the training exited $rc, expected 1 (the NaN)"; failures=$((failures + 1)); return; fi
  local bundle
  bundle=$(ls "$dir"/*.ccap | head -n 1)
  "$bin/crashcap" inspect "$bundle" --json >"$dir/inspect.json"
  "$bin/crashcap" inspect "$bundle" | sed -n '1,20p'
  local newest
  newest=$("$py" -c 'import json,sys; print(max(json.load(open(sys.argv[1]))["keyframes"]))' "$dir/inspect.json")
  /usr/bin/time -f "replay of the crash step: %e s" "$bin/crashcap" replay "$bundle" --json >"$dir/replay-crash.json"
  /usr/bin/time -f "replay of step $newest: %e s" "$bin/crashcap" replay "$bundle" --step "$newest" --json >"$dir/replay-keyframe.json"
  "$py" - "$name" "$dir" "$nan_step" <<'PY' || failures=$((failures + 1))
import json, sys
name, d, nan_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
story = json.load(open(f"{d}/inspect.json"))
bad = []
first = min(story["keyframes"])
if story["steps"]["lost"]:
    bad.append(f"lost steps {story['steps']['lost']}")
st = story["steps"]
if st["first"] > first or st["last"] != nan_step or st["count"] != st["last"] - st["first"] + 1:
    bad.append(f"steps {st['first']}..{st['last']} ({st['count']} recorded), expected every step from {first} to {nan_step}")
for what in ("crash", "keyframe"):
    r = json.load(open(f"{d}/replay-{what}.json"))
    print(f"{name}: replay of step {r['step']} from keyframe {r['keyframe']}: {r['verdict']}"
          f" ({r['steps_replayed']} steps, load {r['load_ms']:.0f} ms, replay {r['replay_ms']:.0f} ms)")
    if r["verdict"] != "reproduced-bitwise":
        bad.append(f"replay of step {r['step']} is {r['verdict']}")
print(f"{name}: keyframes {story['keyframes']}, {story['keyframes_skipped']} skipped, "
      f"{story['dropped_records']} records dropped")
for b in bad:
    print(f"FAIL {name}: {b}")
sys.exit(1 if bad else 0)
PY
}

check default ""
check every5 5
if [ "$failures" -ne 0 ]; then echo "bigstate: $failures check(s) failed"; exit 1; fi
echo "bigstate: every check passed"
