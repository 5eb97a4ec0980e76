"""crashcap: a flight recorder for PyTorch trainings, and the replay of their crashes.

    import crashcap
    rec = crashcap.Recorder("runs/crashes", model=model, optimizer=optimizer)
    for step, batch in rec.steps(loader):
        ...
        loss.backward()
        rec.end(loss)
        optimizer.step()

Then ``crashcap replay runs/crashes/crash-*.ccap``, ``crashcap triage ...``. docs/PYTHON.md.
"""

from . import _native
from ._params import hyperparameters
from ._recorder import Error, NonFiniteError, Recorder
from ._replay import replaying

__version__ = _native.version
__all__ = ["Recorder", "NonFiniteError", "Error", "replaying", "hyperparameters"]
