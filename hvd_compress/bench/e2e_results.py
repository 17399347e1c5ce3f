"""The stamped end-to-end results (``make bench-e2e``'s JSON) grouped by the link and rank count that measured them,
with the figures a reader compares across a group: each method's step, Horovod's step of the same rule on that
link and rank count, and the ratio of the two. docs/benchmarks.md and README's op table are both rendered from
these (hvd_compress/bench/report.py), so they cannot disagree. No torch, MPI or matplotlib is imported here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def link_bits_per_s(net: str) -> float | None:
    """The rate of a tc rate string (``1gbit``, ``100mbit``, ``500kbit``), or None for shared memory."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if net.endswith(unit) and net[: -len(unit)].replace(".", "", 1).isdigit():
            return float(net[: -len(unit)]) * scale
    return None


def link_name(net: str) -> str:
    """``""`` -> shared memory, ``1gbit`` -> 1 Gbit/s, ``2nodes-1gbit`` -> two nodes, 1 Gbit/s."""
    if not net:
        return "shared memory"
    nodes, _, rate = net.rpartition("-") if net.startswith("2nodes-") else ("", "", net)
    bits = link_bits_per_s(rate)
    if bits is None:
        name = rate
    else:
        unit, scale = next((u, s) for u, s in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3), ("bit/s", 1.0))
                           if bits >= s)
        name = f"{bits / scale:g} {unit}"
    return f"two nodes, {name}" if nodes else name


def anchor(net: str, ranks: int) -> str:
    """The id of a group's heading on docs/benchmarks.md, e.g. ``e2e-1gbit-np2``."""
    return f"e2e-{net or 'shm'}-np{ranks}"


@dataclass
class Group:
    """Every e2e result of one link and rank count, by file name (sorted)."""

    net: str
    ranks: int
    results: list[tuple[str, dict]] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return anchor(self.net, self.ranks)

    @property
    def title(self) -> str:
        return f"{link_name(self.net)}, {self.ranks} ranks"


def groups(results: dict[str, dict]) -> list[Group]:
    """The e2e results grouped by link and ranks: shared memory first, then the faster links, fewer ranks first."""
    by_key: dict[tuple[str, int], Group] = {}
    for name, r in sorted(results.items()):
        if r["stamp"]["kind"] != "e2e":
            continue
        key = (r["stamp"]["net"], r["stamp"]["ranks"])
        by_key.setdefault(key, Group(*key)).results.append((name, r))

    def order(g: Group) -> tuple:
        rate = link_bits_per_s(g.net.removeprefix("2nodes-"))
        return (bool(g.net), g.net.startswith("2nodes-"), -(rate or 0.0), g.net, g.ranks)

    return sorted(by_key.values(), key=order)


def run_of(result: dict, model: str, method: str) -> dict | None:
    return next((r for r in result.get("runs", []) if r["model"] == model and r["method"] == method), None)


def rule_of(result: dict, row: dict) -> str | None:
    """The optimizer rule a row trained (``adam``, ``lamb``, ``birder``), from its run."""
    run = run_of(result, row["model"], row["method"])
    return None if run is None else run.get("rule")


def mean_step_ms(result: dict, row: dict) -> float | None:
    """The mean step after the warm-up (the throughput of a method whose steps differ, as 0/1 Adam's local and sync
    steps): the row's, or from its run's step times where the row predates the bench recording it."""
    if row.get("mean_step_ms") is not None:
        return row["mean_step_ms"]
    run = run_of(result, row["model"], row["method"])
    if run is None or not run.get("step_ms"):
        return None
    steps = run["step_ms"][result.get("args", {}).get("warmup", 0):] or run["step_ms"]
    return statistics.fmean(steps)


def step_ms(result: dict, row: dict) -> float:
    """The step a ratio is taken of: the mean where known, else the median."""
    mean = mean_step_ms(result, row)
    return row["median_step_ms"] if mean is None else mean


def horovod_step(group: Group, name: str, model: str, rule: str | None) -> tuple[float, str] | None:
    """Horovod's step of ``rule`` on ``model`` in this group, and the file it comes from: from the run ``name``
    itself where it has one, else from the group's first file that does (a dense run on its own)."""
    if rule is None:
        return None
    ordered = sorted(group.results, key=lambda nr: nr[0] != name)
    for file, result in ordered:
        for row in result["rows"]:
            if (row["model"] == model and row["method"].startswith("Horovod") and not row.get("skipped")
                    and rule_of(result, row) == rule):
                return step_ms(result, row), file
    return None


def vs_horovod(group: Group, name: str, result: dict, row: dict) -> tuple[float, str] | None:
    """Horovod's step of the same rule, model, link and ranks / this row's step (above 1: faster than Horovod),
    and the file Horovod's step comes from; None where the group has no Horovod step of that rule."""
    if row.get("skipped"):
        return None
    found = horovod_step(group, name, row["model"], rule_of(result, row))
    if found is None:
        return None
    ms = step_ms(result, row)
    return (found[0] / ms, found[1]) if ms > 0 and math.isfinite(ms) else None


def find(group: Group, name: str, model: str, method: str) -> tuple[dict, dict]:
    """The result ``name`` of this group and its row of ``method`` on ``model``; KeyError naming what is missing."""
    result = dict(group.results).get(name)
    if result is None:
        raise KeyError(f"{name} is not an e2e result of {group.title}")
    row = next((r for r in result["rows"] if r["model"] == model and r["method"] == method), None)
    if row is None:
        raise KeyError(f"{name} has no row {method!r} on {model!r}")
    return result, row
