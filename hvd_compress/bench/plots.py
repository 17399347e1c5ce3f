"""The PNGs of the benchmarks and the demo, from their JSON alone (no torch or MPI): loss against wall-clock time,
one line per method, and the held-out figure each method ended at.

The PNGs of docs/ are committed and a test re-renders them, so a render must be byte-equal on the same matplotlib:
the Agg backend, fixed size, dpi and font (DejaVu Sans, which matplotlib ships), no date in the metadata (the
Software entry names the matplotlib that drew it, which is how the test knows whether it can compare bytes).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

#: dpi of every PNG; with the fixed figure sizes, the pixel size.
DPI = 100
RC = {"font.family": "DejaVu Sans", "font.size": 8, "axes.titlesize": 8, "legend.fontsize": 6.5,
      "path.simplify": True, "savefig.dpi": DPI, "figure.dpi": DPI}


def smooth(xs: list[float], k: int = 10) -> list[float]:
    """The mean of each value and the ``k - 1`` before it (fewer at the start)."""
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


@contextlib.contextmanager
def context():
    """matplotlib's own defaults (not a matplotlibrc's or another caller's settings) and ``RC``, for this block."""
    import matplotlib

    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        matplotlib.rcParams.update(RC)
        yield


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def software() -> str:
    """What the PNGs' Software entry says: matplotlib's own default, which names its version."""
    import matplotlib

    return f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/"


def save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": software()})
    pyplot().close(fig)
    return path


def style(method: str) -> str:
    """hvd_compress's ops solid, the alternatives (Horovod, DDP) dotted, the no-communication floors dashed."""
    return "--" if method.startswith("floor") else "-" if method.startswith("hc") else ":"


def loss_panel(ax, curves: list[tuple[str, list[float], list[float], float | None]], colors: dict[str, object],
               window: int) -> None:
    """One panel: each ``(method, wall_s, training losses, held-out loss at the end or None)`` as its training loss
    (smoothed over ``window`` steps) against wall-clock seconds, and its held-out loss as a dot at its last step."""
    for method, wall_s, losses, test_loss in curves:
        color = colors[method]
        ax.plot(wall_s, smooth(losses, window), label=method, color=color, linestyle=style(method), linewidth=1.2)
        if test_loss is not None and wall_s:
            ax.plot([wall_s[-1]], [test_loss], marker="o", markersize=4, color=color, linestyle="none")
    # A diverged run leaves the chart above twice the highest starting loss instead of squashing every other line.
    starts = [losses[0] for _, _, losses, _ in curves if losses and math.isfinite(losses[0])]
    if starts:
        top = 2 * max(starts)
        shown = [v for _, _, losses, test in curves for v in [*smooth(losses, window), test]
                 if v is not None and math.isfinite(v) and 0 < v <= top]
        ax.set_ylim(0.7 * min(shown, default=top / 10), top)
    ax.set_xlabel("wall-clock s (rank 0)")
    ax.set_ylabel(f"training loss (smoothed over {window} steps)\ndot: held-out loss at the end")
    ax.set_yscale("log")
    ax.grid(True, which="major", linewidth=0.3)
    ax.legend(ncol=2, loc="best")


def held_out_panel(ax, curves: list[tuple[str, list[float], list[float]]], colors: dict[str, object]) -> None:
    """One panel: each ``(method, wall_s, held-out losses)`` (a run's ``test_curve``) against training seconds."""
    for method, wall_s, losses in curves:
        ax.plot(wall_s, losses, label=method, color=colors[method], linestyle=style(method), linewidth=1.2,
                marker=".", markersize=2)
    ax.set_xlabel("training s (rank 0; evaluation off the clock)")
    ax.set_ylabel("held-out loss")
    ax.set_yscale("log")
    ax.grid(True, which="major", linewidth=0.3)
    ax.legend(ncol=2, loc="best")


def has_test_curves(result: dict) -> bool:
    """Whether a result's runs recorded held-out loss during training (older results hold it at the end only)."""
    return any(r.get("test_curve") for r in result.get("runs", []))


def palette(methods: list[str]) -> dict[str, object]:
    """A color per method, the same in every panel of a figure."""
    cmap = pyplot().get_cmap("tab20")
    return {m: cmap(i % 20) for i, m in enumerate(dict.fromkeys(methods))}


def e2e_group(group, path: Path, window: int = 10) -> Path:
    """docs/benchmarks.md's PNG of one link and rank count (an e2e_results.Group): a panel per run and model,
    every method of that run; where the run has no Horovod step, the group's Horovod run of that model is drawn
    beside it (same link and ranks, another run: its legend names the file)."""
    plt = pyplot()

    panels = []
    for name, result in group.results:
        for model in dict.fromkeys(r["model"] for r in result.get("runs", [])):
            panels.append((name, result, model))
    with context():
        cols = min(2, len(panels)) or 1
        rows = (len(panels) + cols - 1) // cols or 1
        fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
        methods = [r["method"] for _, res, _ in panels for r in res["runs"]]
        colors = palette([*methods, "Horovod Adam"])
        for ax, (name, result, model) in zip(axes.flat, panels, strict=False):
            test = {(r["model"], r["method"]): r.get("test_loss") for r in result["rows"]}
            curves = [(r["method"], r["wall_s"], r["losses"], test.get((model, r["method"])))
                      for r in result["runs"] if r["model"] == model and r.get("step_ms") and not r.get("skipped")]
            if not any(m.startswith("Horovod") for m, *_ in curves):
                for other, res in group.results:
                    tests = {r["method"]: r.get("test_loss") for r in res["rows"] if r["model"] == model}
                    hv = [r for r in res.get("runs", []) if r["model"] == model and r["method"].startswith("Horovod")
                          and r.get("step_ms")]
                    for r in hv if other != name else []:
                        label = f"{r['method']} ({other})"
                        colors[label] = colors.get(r["method"], "black")
                        curves.append((label, r["wall_s"], r["losses"], tests.get(r["method"])))
                    if other != name and hv:
                        break
            if has_test_curves(result):
                held_out_panel(ax, [(r["method"], [p[1] for p in r["test_curve"]], [p[2] for p in r["test_curve"]])
                                    for r in result["runs"] if r["model"] == model and r.get("test_curve")], colors)
            else:
                loss_panel(ax, curves, colors, window)
            ax.set_title(f"{name}: {model}")
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        held = [has_test_curves(res) for _, res, _ in panels]
        what = "held-out loss" if held and all(held) else "held-out or training loss" if any(held) else "training loss"
        fig.suptitle(f"End to end, {group.title}: {what} against wall-clock time", fontsize=10,
                     y=1 - 0.12 / fig.get_figheight(), va="top")
        # Fixed margins in inches rather than tight_layout, which draws every panel once more to measure it.
        w, h = fig.get_figwidth(), fig.get_figheight()
        fig.subplots_adjust(left=1.0 / w, right=1 - 0.15 / w, bottom=0.5 / h, top=1 - 0.7 / h, wspace=0.24,
                            hspace=0.28)
        return save(fig, path)


def demo(result: dict, path: Path, window: int) -> Path:
    """The demo's PNG: training loss against wall-clock time per op (left), and each op's held-out accuracy
    against its step time (right), Horovod's dense step marked."""
    plt = pyplot()

    with context():
        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
        runs = [r for r in result["runs"] if r.get("step_ms")]
        colors = palette([r["method"] for r in runs])
        tests = {r["method"]: r.get("test_loss") for r in result["rows"]}
        loss_panel(left, [(r["method"], r["wall_s"], r["losses"], tests.get(r["method"])) for r in runs], colors,
                   window)
        left.set_title("training loss against wall-clock time")
        for row in result["rows"]:
            if row.get("skipped") or row["method"] not in colors:
                continue
            horovod = row["method"].startswith("Horovod")
            right.plot([row["median_step_ms"]], [100 * row["test_accuracy"]], marker="*" if horovod else "o",
                       markersize=10 if horovod else 6, color=colors[row["method"]], linestyle="none")
            right.annotate(row["method"], (row["median_step_ms"], 100 * row["test_accuracy"]), fontsize=6.5,
                           xytext=(4, 3), textcoords="offset points")
        right.set_xscale("log")
        right.set_xlabel("median step ms (log)")
        right.set_ylabel("held-out accuracy %")
        right.set_title("held-out accuracy against step time (star: Horovod's dense step)")
        right.grid(True, which="both", linewidth=0.3)
        fig.tight_layout()
        return save(fig, path)
