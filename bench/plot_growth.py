#!/usr/bin/env python3
"""The cost of growth as a picture: what a keyframe and the recording cost as the model's state grows.

Reads the JSON of `crashcap-bench-keyframe --json` (one file or several, their sizes merged) and of
`crashcap-bench-record --json` (its small case and its large_state case), and writes one SVG with
three panels against the state's size (log scale):
  1. the training thread's stall per keyframe, beside a plain memcpy of the same bytes;
  2. the writer's rate, beside `zstd -1 -T0` on the same bytes;
  3. the recording's overhead on a training's step time (median ratio, min..max over rounds),
     with the 1.03 target.
Only the standard library: no plotting package is needed to redraw docs/img/growth.svg.

  usage: bench/plot_growth.py --keyframe K.json [K2.json ...] --record R.json [--small-state-mb MB] -o OUT.svg
"""
import argparse
import json
import math
import sys

W, H = 330, 250  # one panel
PAD_L, PAD_R, PAD_T, PAD_B = 58, 12, 30, 42
COLORS = ["#1f77b4", "#d62728", "#2ca02c"]


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Panel:
    def __init__(self, x0, title, xs, ys, ylog, ylabel):
        self.x0, self.title, self.ylog, self.ylabel = x0, title, ylog, ylabel
        lo, hi = min(xs), max(xs)
        self.xlo, self.xhi = math.log10(lo) - 0.25, math.log10(hi) + 0.25
        ylo, yhi = min(ys), max(ys)
        if ylog:
            self.ylo, self.yhi = math.floor(math.log10(ylo)), math.ceil(math.log10(yhi))
        else:
            span = (yhi - ylo) or abs(yhi) or 1
            self.ylo, self.yhi = ylo - 0.15 * span, yhi + 0.15 * span
        self.out = []

    def px(self, x):
        return self.x0 + PAD_L + (math.log10(x) - self.xlo) / (self.xhi - self.xlo) * (W - PAD_L - PAD_R)

    def py(self, y):
        v = math.log10(y) if self.ylog else y
        return PAD_T + (self.yhi - v) / (self.yhi - self.ylo) * (H - PAD_T - PAD_B)

    def frame(self):
        o = self.out
        x1, x2 = self.x0 + PAD_L, self.x0 + W - PAD_R
        y1, y2 = PAD_T, H - PAD_B
        o.append(f'<rect x="{x1}" y="{y1}" width="{x2 - x1}" height="{y2 - y1}" fill="none" stroke="#444"/>')
        o.append(f'<text x="{self.x0 + W / 2}" y="16" text-anchor="middle" font-weight="bold">{esc(self.title)}</text>')
        for e in range(math.ceil(self.xlo), math.floor(self.xhi) + 1):
            x = self.px(10 ** e)
            label = f"{10 ** e:g} MB" if e < 3 else f"{10 ** (e - 3):g} GB"
            o.append(f'<line x1="{x:.1f}" y1="{y2}" x2="{x:.1f}" y2="{y2 + 4}" stroke="#444"/>')
            o.append(f'<text x="{x:.1f}" y="{y2 + 16}" text-anchor="middle">{label}</text>')
        o.append(f'<text x="{self.x0 + W / 2}" y="{H - 8}" text-anchor="middle">model state</text>')
        if self.ylog:
            ticks = [10 ** e for e in range(int(self.ylo), int(self.yhi) + 1)]
        else:
            step = 10 ** math.floor(math.log10((self.yhi - self.ylo) / 3))
            for m in (1, 2, 5):
                if (self.yhi - self.ylo) / (m * step) <= 6:
                    step *= m
                    break
            t = math.ceil(self.ylo / step) * step
            ticks = []
            while t <= self.yhi:
                ticks.append(t)
                t += step
        for t in ticks:
            y = self.py(t)
            o.append(f'<line x1="{x1}" y1="{y:.1f}" x2="{x2}" y2="{y:.1f}" stroke="#ddd"/>')
            o.append(f'<text x="{x1 - 4}" y="{y + 4:.1f}" text-anchor="end">{t:g}</text>')
        o.append(f'<text transform="translate({self.x0 + 13},{(y1 + y2) / 2}) rotate(-90)" text-anchor="middle">'
                 f'{esc(self.ylabel)}</text>')

    def series(self, points, color, label, index, dashed=False):
        pts = sorted(points)
        path = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="5,4"' if dashed else ""
        self.out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for x, y in pts:
            self.out.append(f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="3.5" fill="{color}"/>')
        ly = PAD_T + 14 + 15 * index
        lx = self.x0 + PAD_L + 8
        self.out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{color}" stroke-width="2"{dash}/>')
        self.out.append(f'<text x="{lx + 23}" y="{ly}">{esc(label)}</text>')

    def bars(self, points, color):
        for x, y, lo, hi in points:
            X = self.px(x)
            self.out.append(f'<line x1="{X:.1f}" y1="{self.py(lo):.1f}" x2="{X:.1f}" y2="{self.py(hi):.1f}" '
                            f'stroke="{color}" stroke-width="1.5"/>')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keyframe", nargs="+", required=True, help="crashcap-bench-keyframe --json output(s)")
    ap.add_argument("--record", required=True, help="crashcap-bench-record --json output (with large_state)")
    ap.add_argument("--small-state-mb", type=float, default=None,
                    help="the small case's state in MB when its JSON does not say (state_bytes)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    sizes = {}
    for path in a.keyframe:
        with open(path) as f:
            for s in json.load(f)["sizes"]:
                sizes[round(s["state_mb"], 1)] = s  # a later file's size replaces an earlier one's
    if not sizes:
        sys.exit("plot_growth: no sizes in the keyframe JSON")
    kf = [sizes[k] for k in sorted(sizes)]
    with open(a.record) as f:
        rec = json.load(f)
    if "large_state" not in rec:
        sys.exit("plot_growth: the record JSON has no large_state case (run without --large-rounds 0)")
    small_mb = rec.get("state_bytes", 0) / 1e6 or a.small_state_mb
    if not small_mb:
        sys.exit("plot_growth: the record JSON's small case has no state_bytes: give --small-state-mb")
    large = rec["large_state"]

    xs = [s["state_mb"] for s in kf]
    p1 = Panel(0, "stall per keyframe", xs, [s["stall_ms"] for s in kf] + [s["memcpy_ms"] for s in kf], True, "ms")
    p1.frame()
    p1.series([(s["state_mb"], s["stall_ms"]) for s in kf], COLORS[0], "training thread's stall", 0)
    p1.series([(s["state_mb"], s["memcpy_ms"]) for s in kf], COLORS[1], "memcpy of the same bytes in the step", 1, dashed=True)

    p2 = Panel(W, "write rate", xs, [s["writer_mb_s"] for s in kf] + [s["zstd_mb_s"] for s in kf], False, "MB/s")
    p2.frame()
    p2.series([(s["state_mb"], s["writer_mb_s"]) for s in kf], COLORS[0], "recorder's writer", 0)
    p2.series([(s["state_mb"], s["zstd_mb_s"]) for s in kf], COLORS[1], "zstd -1 -T0", 1, dashed=True)

    ov = [(small_mb, rec["overhead_ratio"], rec["overhead_ratio_spread"]["min"], rec["overhead_ratio_spread"]["max"]),
          (large["state_bytes"] / 1e6, large["overhead_ratio"], large["overhead_ratio_spread"]["min"],
           large["overhead_ratio_spread"]["max"])]
    p3 = Panel(2 * W, "overhead on step time", [small_mb, xs[-1]],
               [v for o in ov for v in o[1:]] + [1.0, 1.03], False, "recorded / bare")
    p3.frame()
    p3.series([(small_mb, 1.03), (xs[-1], 1.03)], "#888", "target 1.03", 1, dashed=True)
    p3.bars(ov, COLORS[2])
    p3.series([(o[0], o[1]) for o in ov], COLORS[2], "median ratio (bars: min..max)", 0)

    body = "\n".join(p1.out + p2.out + p3.out)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{3 * W}" height="{H}" viewBox="0 0 {3 * W} {H}" '
           f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n')
    with open(a.output, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
