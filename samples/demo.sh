#!/usr/bin/env bash
# The demo behind `./dev demo`: a real LibTorch training writes a bundle; we inspect it,
# damage copies the way crashes and bad disks do, and recover what is intact.
# (The recorder, replay and triage arrive with their issues; this shows the bundle they stand on.)
set -euo pipefail
BIN=${1:?usage: samples/demo.sh BUILD/bin}
CC="$BIN/crashcap"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/crashcap-demo-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
step() { printf '\n\033[1;36m### %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

step "1. A real LibTorch training run (conv net, 20 SGD steps) writes its state into a bundle"
show "$BIN/crashcap-sample-snapshot" --out "$WORK/run.ccap" --steps 20

step "2. What is in it"
show "$CC" info "$WORK/run.ccap"
show "$CC" ls "$WORK/run.ccap"

step "3. Look at tensors without Python: the last batch, its statistics, a slice"
show "$CC" show "$WORK/run.ccap" batch/images --stats --slice '0,0,:4,:6'
show "$CC" show "$WORK/run.ccap" batch/labels

step "4. A crash while writing: the file is cut off mid-record"
size=$(stat -c %s "$WORK/run.ccap")
head -c $((size * 2 / 3)) "$WORK/run.ccap" > "$WORK/cut.ccap"
show "$CC" info "$WORK/cut.ccap"

step "5. A bad disk: one bit flipped; verify finds it (exit 1) and says where"
cp "$WORK/run.ccap" "$WORK/flip.ccap"
printf '\x55' | dd of="$WORK/flip.ccap" bs=1 seek=$((size / 2)) conv=notrunc status=none
show "$CC" verify "$WORK/flip.ccap" || echo "(verify exited $?)"

step "6. Recover a sealed copy of everything intact; the evidence file is never touched"
show "$CC" recover "$WORK/cut.ccap" "$WORK/recovered.ccap"
show "$CC" verify "$WORK/recovered.ccap"

step "7. Hand a tensor to numpy or torch"
show "$CC" export "$WORK/run.ccap" weights/conv1.weight --npy "$WORK/conv1.npy"
show "$CC" export "$WORK/run.ccap" batch/images --pt "$WORK/images.pt"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  show /usr/bin/python3 -c "import numpy as np, torch; print('numpy', np.load('$WORK/conv1.npy').shape, '| torch', torch.load('$WORK/images.pt').shape)"
fi
printf '\n\033[1mDemo complete.\033[0m Next: the recorder (a crashing training recorded end to end), then replay and triage.\n'
