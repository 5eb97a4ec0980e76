#!/usr/bin/env bash
# The demo behind `./dev demo`: real LibTorch trainings crash under crashcap's flight
# recorder, the bundles they leave tell what happened, and replay re-runs the failing step
# bit for bit, bisects it to the corrupt sample, triages it and writes the bug report; a
# supervised run classifies a crash from outside (a sample, a shell, a Python training), and
# the GPU side says what it can trace here.
set -euo pipefail
BIN=${1:?usage: samples/demo.sh BUILD/bin}
CC="$BIN/crashcap"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/crashcap-demo-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
step() { printf '\n\033[1;36m### %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }
expect_fail() { printf '\033[2m$ %s\033[0m\n' "$*"; if "$@"; then echo "(expected a failure)"; exit 1; else echo "(exited $? as expected)"; fi; }

step "1. A text-segmentation training (ResNet encoder, FPN, DB head; Dice+BCE+L1) runs under the recorder."
echo "   At step 12, image 3 of the batch is corrupt (NaN pixels): one bad sample in a dataset of thousands."
expect_fail "$BIN/crashcap-sample-seg" --steps 40 --record "$WORK/runs" --fault nan-sample --fault-step 12 --fault-row 3 --keyframe-every 5
bundle=$(ls "$WORK"/runs/crash-*.ccap)

step "2. The story of the crash, one screen: where it died, the last ops, the failing batch"
show "$CC" inspect "$bundle"

step "3. The corrupt image, without Python: statistics and the NaN patch"
show "$CC" show "$bundle" steps/12/batch/image --stats --slice '3,0,26:31,26:31'

step "4. For scripts: the same story as JSON"
printf '\033[2m$ crashcap inspect %s --json | python3 ...\033[0m\n' "$bundle"
"$CC" inspect "$bundle" --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
c = j["crash"]
print("crash:", c["kind"], "at step", c["step"], "in", c["phase"], "| signal:", c["signal"])
print("steps:", j["steps"]["first"], "..", j["steps"]["last"], "| keyframes:", j["keyframes"], "| dropped records:", j["dropped_records"])'

step "5. Replay the failing step from the bundle: the newest keyframe, then the recorded steps, bit for bit"
show "$CC" replay "$bundle"

step "6. Which sample? Delta debugging over the batch rows, every experiment a replay in a child process"
show "$CC" bisect samples "$bundle"

step "7. A classifier fed an out-of-range label: the exception's own text is kept, and triage names the cause"
expect_fail "$BIN/crashcap-sample-cls" --steps 20 --record "$WORK/cls" --fault bad-label --fault-step 7 --fault-row 5 --keyframe-every 5
show "$CC" inspect "$(ls "$WORK"/cls/crash-*.ccap)"
show "$CC" triage "$(ls "$WORK"/cls/crash-*.ccap)"
PAGE=$(cd "$BIN/.." && pwd)/demo-report.html   # kept after the demo: open it in a browser
show "$CC" report "$(ls "$WORK"/cls/crash-*.ccap)" -o "$WORK/bug-report.md" --html-out "$PAGE"
printf '\033[2m(the first lines of the report, ready to paste into a bug tracker; the same with plots: %s)\033[0m\n' "$PAGE"
sed -n '/^## Summary/,/^## Steps/p' "$WORK/bug-report.md"
printf '\033[2m(and the attachment: a keyframe written at the failing step by a bit-for-bit replay, only the culprit row, and a report, in a zip)\033[0m\n'
show "$CC" pack "$(ls "$WORK"/cls/crash-*.ccap)" -o "$WORK/attach.zip" --zip --rows culprit --max-size 25M
(mkdir -p "$WORK/unzipped" && cd "$WORK/unzipped" && /usr/bin/python3 -m zipfile -e "$WORK/attach.zip" . && "$CC" replay attach.ccap | grep -E '^verdict|^error') || true

step "7b. A PyTorch training written in Python: recorded by the crashcap package, replayed in its own loop"
PYDIR=$(cd "$BIN/../python" 2>/dev/null && pwd || true)
if [ -n "$PYDIR" ] && [ -f "$PYDIR/crashcap/__init__.py" ]; then
  echo "   A classifier trained from a DataLoader with 2 augmenting workers, dropout and a cosine schedule;"
  echo "   at step 19 (epoch 1) sample 3 of the batch is corrupt. Keyframes every 10 steps: the newest is in epoch 0."
  expect_fail env PYTHONPATH="$PYDIR" /usr/bin/python3 "$(dirname "$0")/python/train.py" --steps 40 --record "$WORK/py" \
    --fault nan-sample --fault-step 19 --fault-row 3 --keyframe-every 10
  pybundle=$(ls "$WORK"/py/crash-*.ccap)
  show "$CC" inspect "$pybundle"
  show "$CC" replay "$pybundle"
  show "$CC" triage "$pybundle"
  step "7c. The same training left as it is: crashcap run --record records it from outside"
  echo "   No --record flag to the script, no crashcap import: the batches come from its DataLoader, the model and"
  echo "   its state from its optimizer, the loss from backward(). At step 21, row 5's label is out of range."
  expect_fail "$CC" run --record --keyframe-every 10 --dir "$WORK/observed" -- /usr/bin/python3 \
    "$(dirname "$0")/python/train.py" --steps 40 --quiet --fault bad-label --fault-step 21 --fault-row 5
  obundle=$(ls "$WORK"/observed/crash-*.ccap)
  show "$CC" replay "$obundle"
  show "$CC" triage "$obundle"
  echo "   Many runs at once: the run log and the bundles of a small sweep, grouped, with what sets the crashes apart"
  for fault in none bad-label none none bad-label none; do
    "$CC" run --record --dir "$WORK/sweep" -- /usr/bin/python3 "$(dirname "$0")/python/train.py" --steps 24 --quiet \
      --workers 0 --fault "$fault" --fault-step 3 >/dev/null 2>&1 || true
  done
  show "$CC" summary "$WORK/sweep"
else
  echo "   (skipped: this build has no Python package; configure with -DCRASHCAP_WITH_PYTHON=ON to see why)"
fi

step "8. SIGKILL (the OOM killer, a scheduler): nothing in the process can react, yet what reached the disk is kept"
"$BIN/crashcap-sample-seg" --steps 100000 --record "$WORK/killed" --keyframe-every 10 > /dev/null &
pid=$!
sleep 4
printf '\033[2m$ kill -9 %s\033[0m\n' "$pid"
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
show "$CC" seal "$WORK/killed"
killed=$(ls "$WORK"/killed/crash-*.ccap)
show "$CC" verify "$killed"
"$CC" inspect "$killed" | sed -n '/^steps/,/^keyframes/p;/NO CRASH/,+2p'

step "9. A bundle damaged in transit: verify names the bytes, recover keeps everything intact"
size=$(stat -c %s "$bundle")
head -c $((size * 2 / 3)) "$bundle" > "$WORK/cut.ccap"
show "$CC" info "$WORK/cut.ccap"
show "$CC" recover "$WORK/cut.ccap" "$WORK/recovered.ccap"
show "$CC" verify "$WORK/recovered.ccap"

step "10. Hand the evidence to numpy or torch"
show "$CC" export "$bundle" steps/12/batch/image --npy "$WORK/image.npy"
show "$CC" export "$bundle" keyframes/10/parameters/stem.conv.weight --pt "$WORK/stem.pt"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  show /usr/bin/python3 -c "import numpy as np, torch; a = np.load('$WORK/image.npy'); print('numpy', a.shape, 'NaN in rows', sorted(set(np.argwhere(np.isnan(a))[:, 0]))); print('torch', torch.load('$WORK/stem.pt').shape)"
fi
step "11. Supervised from outside: crashcap run classifies the death and seals one bundle per crash, with restarts"
echo "   (any command works; here a shell that prints a CUDA error the way PyTorch does, then the sample)"
expect_fail "$CC" run --dir "$WORK/supervised" --restart 1 --backoff 0 -- /bin/sh -c \
  "echo 'RuntimeError: CUDA error: device-side assert triggered' >&2; exit 1"
expect_fail "$CC" run --dir "$WORK/supervised-sample" -- "$BIN/crashcap-sample-cls" --steps 12 --fault nan-sample --fault-step 6
sup=$(ls "$WORK"/supervised-sample/crash-*.ccap)
printf '\033[2m$ crashcap inspect %s --json | python3 ...\033[0m\n' "$sup"
"$CC" inspect "$sup" --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
print("classification:", j["crash"]["classification"], "| step", j["crash"]["step"], "| trace:", j["supervision"]["trace"])'
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "   A Python training crashcap did not build (PyTorch's own cross_entropy, a label out of range at step 7):"
  cat > "$WORK/train.py" <<'PY'
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Linear(8, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = torch.randn(4, 8), torch.randint(0, 10, (4,))
    if step == 7:
        y[2] = 12
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
PY
  expect_fail "$CC" run --dir "$WORK/python" -- /usr/bin/python3 "$WORK/train.py"
fi

step "12. The GPU side: what this machine can trace, and the bundle's kernel trace and time line"
echo "   (with a GPU, crashcap run injects libcrashcap_inject.so: launches, the first sticky CUDA error and"
echo "   the ATen op that launched each kernel go into the bundle; here each says why there is none)"
show "$CC" doctor || true
show "$CC" inspect "$sup" --trace
show "$CC" export "$sup" --chrome "$WORK/trace.json"
printf '\n\033[1mDemo complete.\033[0m\n'
