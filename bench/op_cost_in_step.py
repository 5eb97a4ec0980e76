#!/usr/bin/env python3
"""What an op costs inside a recorded step, where the op ring observes it: a loop of torch.add,
20,000 calls a round between Recorder.begin and end, the median of 7 rounds of the thread's CPU
time per call. `bare` runs the same loop without a recorder. Run the modes alternately and
compare medians (docs/PERFORMANCE.md, "The newest op in the progress file"):

    for i in 1 2 3 4 5; do for m in bare rec; do echo $m $(PYTHONPATH=build/python \\
        /usr/bin/python3 bench/op_cost_in_step.py $m); done; done
"""
import statistics
import sys
import tempfile
import time

import torch

import crashcap

torch.set_num_threads(1)
a = torch.ones(4)
b = torch.ones(4)


def loop(n=20000):
    t0 = time.thread_time_ns()
    for _ in range(n):
        torch.add(a, b)
    return (time.thread_time_ns() - t0) / n


mode = sys.argv[1]
if mode == "rec":
    m = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = crashcap.Recorder(tempfile.mkdtemp(), model=m, optimizer=opt)
    x = torch.ones(2, 4)
    rec.begin(0, (x,))  # the op ring observes this thread until end()
loop()
print(statistics.median(loop() for _ in range(7)))
if mode == "rec":
    loss = m(x).sum()
    loss.backward()
    rec.end(loss)
    opt.step()
    rec.close()
