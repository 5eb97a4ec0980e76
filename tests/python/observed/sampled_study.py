#!/usr/bin/env python3
"""An Optuna study sampled by a seeded multivariate TPE sampler, run in one process or with
crashcap.optuna's isolated trials: prints the parameters of each trial as JSON, which must be the
same both ways.

    python sampled_study.py DIR plain|isolated
"""

import json
import os
import sys

import optuna


def objective(trial):
    x = trial.suggest_float("x", -3, 3)
    y = trial.suggest_float("y", -3, 3)
    depth = trial.suggest_int("depth", 1, 8)
    return (x - 1) ** 2 + (y + 0.5) ** 2 + 0.1 * depth


def main():
    directory, mode = sys.argv[1], sys.argv[2]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=2)
    study = optuna.create_study(storage=f"sqlite:///{os.path.join(directory, mode + '.db')}", study_name=mode,
                                sampler=sampler)
    if mode == "isolated":
        import crashcap.optuna
        crashcap.optuna.optimize(study, objective, n_trials=6, directory=os.path.join(directory, mode))
    else:
        study.optimize(objective, n_trials=6)
    print(json.dumps([t.params for t in study.trials]))


if __name__ == "__main__":
    main()
