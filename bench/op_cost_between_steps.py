#!/usr/bin/env python3
"""What an op costs between steps with a Recorder running: a loop of torch.add, 20,000 calls a
round, the median of 7 rounds of the thread's CPU time per call. Between steps the op ring is off;
what is left registered is the process-wide callback for the collectives (a user-scope
RecordFunction callback), which ATen ops should not pay for. Run it alternately with `bare` and
`rec` (docs/PERFORMANCE.md, "Collectives"):

    for i in 1 2 3 4 5; do for m in bare rec; do echo $m $(PYTHONPATH=build/python \
        /usr/bin/python3 bench/op_cost_between_steps.py $m); done; done
"""
import sys, time, tempfile, statistics, torch
import crashcap
torch.set_num_threads(1)
a = torch.ones(4); b = torch.ones(4)
def loop(n=20000):
    t0 = time.thread_time_ns()
    for _ in range(n): torch.add(a, b)
    return (time.thread_time_ns() - t0) / n
mode = sys.argv[1]
if mode == "rec":
    d = tempfile.mkdtemp()
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = crashcap.Recorder(d, model=m, optimizer=opt)
    # One step, so that the ops measured below run between steps (the op ring is off there; what
    # is left is the process-wide callback for the collectives' user scope).
    x = torch.ones(2, 4)
    rec.begin(0, (x,))
    loss = m(x).sum(); loss.backward()
    rec.end(loss)
    opt.step()
loop()
print(statistics.median(loop() for _ in range(7)))
