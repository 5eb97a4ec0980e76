#!/usr/bin/env python3
"""An Optuna study of a small classifier, some of whose trials die, each in its own way, as
trials of a real study do (the objective knows nothing of crashcap):

  num_classes = 4    a label 4 in the data (an annotation typo at dataset index 150):
                     cross_entropy raises IndexError
  temperature = 0    the logits are divided by zero: the loss is NaN
  kernel = custom    a native extension segfaults
  amp = True         a CUDA error (device-side assert) ends the process
  batch = 4096       the OOM killer sends SIGKILL

    python study.py DIR [--trials N] [--isolate | --in-process]
"""

import argparse
import ctypes
import os
import signal

import optuna
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(320, 10, generator=g)
    y = (x[:, :4].argmax(1)).clone()
    y[150] = 4  # the typo
    return TensorDataset(x, y)


def objective(trial):
    lr = trial.suggest_float("lr", 1e-3, 0.3, log=True)
    temperature = trial.suggest_float("temperature", 0.0, 2.0)
    hidden = trial.suggest_categorical("hidden", [16, 32, 64])
    num_classes = trial.suggest_categorical("num_classes", [4, 5])
    kernel = trial.suggest_categorical("kernel", ["builtin", "custom"])
    amp = trial.suggest_categorical("amp", [False, True])
    batch = trial.suggest_categorical("batch", [32, 4096])
    torch.manual_seed(trial.number)
    model = nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, num_classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loader = DataLoader(data(), batch_size=32, shuffle=True)
    step = 0
    for epoch in range(2):
        total = 0.0
        for x, y in loader:
            if step == 4 and batch == 4096:
                os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to a batch that does not fit
            if step == 5 and kernel == "custom":
                ctypes.string_at(0)  # the custom kernel's bad pointer
            if step == 3 and amp:
                raise RuntimeError("CUDA error: device-side assert triggered\nCUDA kernel errors might be "
                                   "asynchronously reported at some other API call, so the stacktrace below might be "
                                   "incorrect.")
            loss = F.cross_entropy(model(x) / temperature, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
        trial.report(total / len(loader), epoch)
    return total / len(loader)


HEALTHY = {"lr": 0.01, "temperature": 1.0, "hidden": 32, "num_classes": 5, "kernel": "builtin", "amp": False,
           "batch": 32}


def main():
    import crashcap.optuna
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--in-process", action="store_true")
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{os.path.join(a.dir, 'study.db')}", study_name="mlp",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    # The trials that die, by design; the rest are healthy ones with the learning rate, the width and
    # the temperature varied, so that nothing but the fault's own parameter sets the failures apart.
    faults = [{"num_classes": 4}, {"temperature": 0.0}, {"kernel": "custom"}, {"amp": True}, {"batch": 4096},
              {"num_classes": 4}, {"temperature": 0.0}, {"amp": True}]
    for k in range(a.trials):
        params = dict(HEALTHY)
        if k % 4 == 1 and faults:
            params.update(faults.pop(0))
        else:
            params["lr"] = [0.003, 0.01, 0.03, 0.1][(k // 4) % 4]
            params["hidden"] = [16, 32, 64][k % 3]
            params["temperature"] = [0.5, 1.0, 1.5][(k // 3) % 3]
        study.enqueue_trial(params)
    crashcap.optuna.optimize(study, objective, n_trials=a.trials, directory=os.path.join(a.dir, "trials"),
                             isolate=not a.in_process, keyframe_every=5)
    states = [t.state.name for t in study.trials]
    print(f"study: {len(states)} trials, {states.count('COMPLETE')} complete, {states.count('FAIL')} failed", flush=True)
    for t in study.trials:
        if t.state.name == "FAIL":
            print(f"trial {t.number}: {t.user_attrs.get('crashcap_classification')} "
                  f"step {t.user_attrs.get('crashcap_step')} poisoned {t.user_attrs.get('crashcap_poisoned')} "
                  f"bundle {os.path.basename(t.user_attrs.get('crashcap_bundle') or '-')}", flush=True)


if __name__ == "__main__":
    main()
