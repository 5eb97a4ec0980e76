"""crashcap.hyperparameters: a run's hyperparameters, told to `crashcap run`.

`crashcap run` names a file in CRASHCAP_PARAMS_FILE for each run of its command; what the program
writes there (a JSON object) is kept with the run's crash bundle and its line in runs.jsonl, beside
the options of its command line, so that `crashcap summary` can say which hyperparameters the
failing runs share and the healthy ones do not. Outside `crashcap run` it only returns them.
"""

import json
import math
import os

_declared = {}


def _plain(value):
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    item = getattr(value, "item", None)  # a numpy or torch scalar
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(value)


def hyperparameters(params=None, **named):
    """Declares this run's hyperparameters (a dict, or keywords; values are kept as numbers,
    booleans or text) to `crashcap run`; later calls add to and override earlier ones. Returns
    everything declared so far.

        crashcap.hyperparameters(lr=3e-4, num_classes=10, label_smoothing=0.1)
    """
    updates = dict(params or {}, **named)
    _declared.update({str(k): _plain(v) for k, v in updates.items()})
    path = os.environ.get("CRASHCAP_PARAMS_FILE")
    if path:
        # Through a rename: the supervisor reads the file when the run ends, however it ends.
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as f:
            json.dump(_declared, f)
        os.replace(partial, path)
    return dict(_declared)
