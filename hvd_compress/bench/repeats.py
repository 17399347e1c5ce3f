"""Medians over repeated benchmark runs: ``python -m hvd_compress.bench.repeats --out TABLE.md RUN.json...``.

Each run is the JSON that ``python -m hvd_compress.bench`` writes. For every (collective, size) row present in
all runs it reports the median over the runs of each implementation's median time, the speed-up of ours over
each baseline computed from those medians (baseline ms / ours ms: above 1, ours is faster), and the speed-ups
of the single runs, so that the spread is visible (tools/two_nodes.sh uses it for its repeats).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per (collective, size_mb) found in every run, in the first run's order."""
    keyed = [{(r["collective"], r["size_mb"]): r for r in run["rows"]} for run in runs]
    rows = []
    for key, first in keyed[0].items():
        if not all(key in k for k in keyed):
            continue
        same = [k[key] for k in keyed]
        med = {impl: statistics.median(r["median_ms"][impl] for r in same) for impl in first["median_ms"]}
        baselines = [impl for impl in first["median_ms"] if impl != "ours"]
        rows.append({
            "collective": key[0],
            "size_mb": key[1],
            "median_ms": med,
            "speedup": {b: med[b] / med["ours"] for b in baselines},
            "run_speedups": {b: [r["median_ms"][b] / r["median_ms"]["ours"] for r in same] for b in baselines},
            "bytes_sent_per_call": first["bytes_sent_per_call"],
        })
    return rows


def markdown(rows: list[dict], labels: list[str]) -> str:
    lines = [
        f"Medians over {len(labels)} runs ({', '.join(labels)}): median ms (slowest rank) and speed-up of ours "
        "(baseline ms / ours ms; per run in brackets)",
        "",
        "| collective | MB | ours ms | baseline ms | speed-up of ours | bytes sent / call (ours) |",
        "|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        base = ", ".join(f"{b} {r['median_ms'][b]:.1f}" for b in r["speedup"])
        speed = ", ".join(
            f"{s:.2f}x vs {b} [{' '.join(f'{x:.2f}' for x in r['run_speedups'][b])}]" for b, s in r["speedup"].items()
        )
        lines.append(f"| {r['collective']} | {r['size_mb']:g} | {r['median_ms']['ours']:.1f} | {base} | {speed} | "
                     f"{r['bytes_sent_per_call']:,} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="JSON files of python -m hvd_compress.bench")
    parser.add_argument("--out", required=True, help="markdown table to write (and print)")
    args = parser.parse_args()
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    table = markdown(median_rows(runs), [run["label"] for run in runs])
    Path(args.out).write_text(table)
    # The runs' own stamps (commit, machine, network: hvd_compress/bench/stamp.py) travel with their medians.
    result = {"stamps": [run.get("stamp") for run in runs], "labels": [run["label"] for run in runs],
              "rows": median_rows(runs)}
    Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(table)


if __name__ == "__main__":
    main()
