"""``python -m hvd_compress.bench.e2e_summary bench_results/e2e_*.json``: the condensed end-to-end tables of
docs/benchmarks.md, from the JSON files that ``make bench-e2e`` writes (no run, no MPI).

One table per result file: a row per method that a user would choose between, a column per model, each cell
the median step in ms, then {the mean step} where it is more than ``UNEVEN`` above the median (a method whose
steps differ in kind, as 0/1 Adam's local and sync steps: its mean is its throughput), (Horovod's step of the
same rule / this step) and, for the compressed optimizers, [this step / the physical limit max(floor, wire
time)] under an emulated network.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

#: The rows, in order: the alternatives first, then ours, then the floors.
METHODS = (
    "Horovod Adam",
    "DDP Adam",
    "DDP+PowerSGD r4 Adam",
    "hc Average (Adam)",
    "hc PowerSGD r4 (Adam)",
    "hc OneBitAdam",
    "hc OneBitAdam no overlap",
    "hc ZeroOneAdam",
    "hc ZeroOneAdam sync/4",
    "Horovod Lamb",
    "hc OneBitLamb",
    "hc SLAMB",
    "Horovod Birder",
    "hc Birder",
    "floor Adam (no comm)",
    "floor Lamb (no comm)",
    "floor Birder (no comm)",
)
COMPRESSED = ("hc OneBitAdam", "hc OneBitAdam no overlap", "hc ZeroOneAdam", "hc ZeroOneAdam sync/4", "hc OneBitLamb",
              "hc SLAMB", "hc Birder", "DDP+PowerSGD r4 Adam", "hc PowerSGD r4 (Adam)")
#: The mean step is shown beside the median where it is more than this share above it.
UNEVEN = 0.1


def _cell(row: dict, networked: bool) -> str:
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    out = f"{row['median_step_ms']:.0f}"
    mean = row.get("mean_step_ms")  # absent in results written before the bench measured it
    if mean is not None and mean > (1 + UNEVEN) * row["median_step_ms"]:
        out += f" {{{mean:.0f}}}"
    speedup = row.get("speedup_vs_horovod")
    if speedup is not None and not math.isnan(speedup) and not row["method"].startswith("Horovod"):
        out += f" ({speedup:.1f}x)"
    limit = row.get("ratio_to_limit")
    if networked and row["method"] in COMPRESSED and limit is not None and not math.isnan(limit):  # nan: no floor ran
        out += f" [{limit:.2f}]"
    return out


def table(result: dict, ranks: int) -> str:
    """The condensed markdown table of one ``e2e_<label>_np<n>.json``."""
    rows = result["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if "stamp" in result:  # the network the ranks ran behind, whatever the label says
        networked = bool(result["stamp"]["net"])
    else:
        networked = result["label"] != "shm" and not result["label"].startswith("shm_")
    by_key = {(r["model"], r["method"]): r for r in rows}
    lines = [
        f"`{result['label']}`, {ranks} ranks: median step ms "
        f"{{mean step ms, where over {UNEVEN:.0%} above the median}} (Horovod's step of the same rule / this)"
        + (" [this / max(floor, wire time)]" if networked else ""),
        "",
        "| method | " + " | ".join(models) + " |",
        "|---|" + "---:|" * len(models),
    ]
    for method in METHODS:
        cells = [by_key.get((m, method)) for m in models]
        if not any(cells):
            continue
        lines.append(f"| {method} | " + " | ".join("" if c is None else _cell(c, networked) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(paths: list[str]) -> None:
    for path in paths:
        result = json.loads(Path(path).read_text())
        ranks = result["stamp"]["ranks"] if "stamp" in result else int(Path(path).stem.rsplit("_np", 1)[1])
        print(table(result, ranks))


if __name__ == "__main__":
    main(sys.argv[1:])
