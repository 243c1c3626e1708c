"""Old and new figures side by side: the printed outputs of two runs of one benchmark.

Reads what `benchmarks/sim_vs_measured.py`, `benchmarks/routing.py` or `sparkgate plan` printed
(saved to files), pairs the rows by their key and prints a Markdown table: old, new, new / old.
Used for the catalogue change of issue 41 (BENCHMARKS.md, "Flash-Next on its real shape").

    python benchmarks/side_by_side.py svm /tmp/old_svm.txt /tmp/new_svm.txt --match Flash-Next
    python benchmarks/side_by_side.py routing /tmp/old_routing.txt /tmp/new_routing.txt
    python benchmarks/side_by_side.py plan /tmp/old_plan.txt /tmp/new_plan.txt
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

SVM_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\w+)\s+([\d.]+)\s+([\d.]+)\s+[+-][\d.]+%")
SVM_SCALING = re.compile(r"^\s+(\S+)\s+([\d.]+) ->\s+([\d.]+) tok/s")
ROUTING_ROW = re.compile(r"^\s*([\d.]+) (.+?)\s+(\d+)\s+(\d+)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)s\s+([\d.]+)s")
PLAN_ROW = re.compile(r"^(\S.*?)\s+([\d.]+)\s+(\d+)$")


def parse(kind: str, text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if kind == "svm":
            if m := SVM_ROW.match(line):
                out[f"{m[1]} {m[2]} c={m[3]} {m[4]} (measured {m[5]})"] = float(m[6])
            elif m := SVM_SCALING.match(line):
                out[f"{m[1]} 2048 decode tok/s alone"] = float(m[2])
                out[f"{m[1]} 2048 decode tok/s at c=4"] = float(m[3])
        elif kind == "routing":
            if m := ROUTING_ROW.match(line):
                out[f"{float(m[1]):.3f} req/s {m[2]} attained %"] = float(m[5])
                out[f"{float(m[1]):.3f} req/s {m[2]} TTFT p50 s"] = float(m[7])
        elif (m := PLAN_ROW.match(line)) and not line.startswith("placement"):
            out[f"{m[1]} req/s at target"] = float(m[2])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["svm", "routing", "plan"])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--match", default="", help="only rows whose key contains this")
    ap.add_argument("--changed", action="store_true", help="only rows whose value changed")
    args = ap.parse_args()
    old, new = parse(args.kind, args.old.read_text()), parse(args.kind, args.new.read_text())
    print("| row | old | new | new / old |\n|---|---:|---:|---:|")
    for key in old:
        if key not in new or args.match not in key or (args.changed and old[key] == new[key]):
            continue
        ratio = f"{new[key] / old[key]:.2f}" if old[key] else "-"
        label = key.replace("|", "\\|")  # a placement's boxes, escaped for the table
        print(f"| {label} | {old[key]:g} | {new[key]:g} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
