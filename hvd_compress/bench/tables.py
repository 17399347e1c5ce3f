"""Markdown tables of benchmark results, from their JSON alone: the bench entry points print and write these, and
docs/benchmarks.md is built from the same functions (hvd_compress/bench/report.py). No MPI, torch or core module
is imported here, so the page can be rebuilt anywhere.
"""

from __future__ import annotations

import math
import statistics


def collectives(rows: list[dict], label: str) -> str:
    """``python -m hvd_compress.bench``: each collective of ours against Horovod's on the same buffer."""
    lines = [
        f"Benchmark `{label}`, {rows[0]['ranks']} ranks, float32, median ms (slowest rank) and ratio ours / baseline",
        "",
        "| collective | MB | ours ms | baseline(s) ms | ratio(s) | bytes sent / call (ours) | reps |",
        "|---|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        base = ", ".join(f"{k} {v:.2f}" for k, v in r["median_ms"].items() if k != "ours")
        ratios = ", ".join(f"{r['median_ms']['ours'] / r['median_ms'][k]:.2f} vs {k}" for k in r["ratio_vs"])
        lines.append(
            f"| {r['collective']} | {r['size_mb']:g} | {r['median_ms']['ours']:.2f} | {base} | {ratios} | "
            f"{r['bytes_sent_per_call']:,} | {r['reps']} |"
        )
    return "\n".join(lines) + "\n"


def kernels(rows: list[dict], isa: dict) -> str:
    """The 1-bit and stochastic kernels against memcpy; ``isa`` names the code path each family ran."""
    lines = [
        f"1-bit kernels ({isa.get('onebit', '?')}) and Birder's stochastic kernels ({isa.get('stochastic', '?')}) "
        "on one thread, median CPU ms, and ratio memcpy / kernel "
        "(memcpy of the bytes each kernel streams: see hvd_compress/bench/kernels.py)",
        "",
        "| kernel | dtype | MB | numel | kernel ms | memcpy ms | kernel / memcpy throughput |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['dtype']} | {r['size_mb']:g} | {r['numel']:,} | {r['kernel_ms']:.3f} | "
            f"{r['memcpy_ms']:.3f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def mask_kernels(rows: list[dict]) -> str:
    """SLAMB's mask kernels against a memcpy of the float32 buffer."""
    lines = ["Mask kernels (k = 0.1) on one thread, median ms, ratio = memcpy of the float32 buffer / kernel", "",
             "| kernel | MB | kernel ms | memcpy ms | ratio |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['kernel']} | {r['size_mb']:g} | {r['kernel_ms']:.3f} | {r['memcpy_ms']:.3f} | {r['ratio']:.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def keras_steps(rows: list[dict], args: dict, label: str, ranks: int) -> str:
    """``python -m hvd_compress.bench.keras_steps``: one row per method, its median step."""
    w = args["width"]
    params = 64 * w + w * w + w * 10 + 2 * w + 10
    lines = [f"Keras 3 model.fit, `{label}`, {ranks} ranks: ReLU MLP of {params / 1e6:.1f}M parameters, batch "
             f"{args['batch']} per rank; median step over {args['steps'] - args['warmup']} steps, slowest rank", "",
             "| method | step ms |", "|---|---:|"]
    lines += [f"| {r['method']} | {r['step_ms']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def vs_dense(row: dict) -> str:
    """An e2e row's held-out loss against the dense rule's at its step count, e.g. ``+1.2%``; empty without one."""
    v = row.get("test_loss_vs_dense")
    return "" if v is None else f"{100 * v:+.1f}%"


def paired_ratio(losses: list[float], dense: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """The geometric mean of the per-seed ratios ``losses[i] / dense[i]`` and its two-sided ``level`` interval
    (Student's t on the log ratios: the seeds pair each run with the dense run of the same weights and batches),
    each as a ratio minus 1; None under two seeds. The interval says what the seeds can resolve: where it spans
    tens of percent, a target of a few percent is neither met nor missed by the mean."""
    if len(losses) < 2:
        return None
    from scipy.stats import t as student_t  # scikit-learn's dependency; only the seeds table needs it

    logs = [math.log(x / d) for x, d in zip(losses, dense, strict=True)]
    mean, half = statistics.fmean(logs), 0.0
    if len(set(logs)) > 1:
        half = student_t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean) - 1, math.exp(mean - half) - 1, math.exp(mean + half) - 1


def e2e_seeds(rows: list[dict]) -> str:
    """The held-out loss of each e2e row over its model seeds (``--fidelity-seeds``), per seed against the dense
    rule's, the mean's against the dense mean, and the per-seed ratios' geometric mean with its 95% interval
    (``paired_ratio``); empty where no row has them."""
    seeded = [r for r in rows if r.get("test_loss_vs_dense_over_seeds") is not None]
    if not seeded:
        return ""
    lines = [f"Held-out loss from model seeds {', '.join(map(str, seeded[0]['seeds']))}: per seed this / the dense "
             "rule's at the same step count, the means, and the per-seed ratios' geometric mean [95% interval, "
             "Student's t on the log ratios]", "",
             "| model | method | per seed | mean | dense mean | mean vs dense | per seed vs dense |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in seeded:
        per_seed = ", ".join(f"{t:.4f} / {d:.4f}" for t, d in
                             zip(r["seed_test_losses"], r["seed_dense_test_losses"], strict=True))
        paired = paired_ratio(r["seed_test_losses"], r["seed_dense_test_losses"])
        paired_cell = "" if paired is None else "{:+.0%} [{:+.0%}, {:+.0%}]".format(*paired)
        lines.append(f"| {r['model']} | {r['method']} | {per_seed} | {statistics.fmean(r['seed_test_losses']):.4f} | "
                     f"{statistics.fmean(r['seed_dense_test_losses']):.4f} | "
                     f"{100 * r['test_loss_vs_dense_over_seeds']:+.1f}% | {paired_cell} |")
    return "\n".join(lines) + "\n"


def e2e_bytes(rows: list[dict]) -> str:
    """Bytes per step and rank of each end-to-end method that counts them, and its losses (the held-out one also
    against the dense rule's at the same step count, where the run computed it), a column per model."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    by_key = {(r["model"], r["method"]): r for r in rows}
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)
               if any(by_key.get((mo, m), {}).get("hc_bytes_per_step") is not None for mo in models)]
    lines = ["MB sent per step and rank (hvd_compress's counters), final training loss / held-out loss (against "
             "the dense rule's held-out loss at the same step)", "",
             "| method | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
    for method in methods:
        cells = []
        for model in models:
            r = by_key.get((model, method))
            if r is None or r.get("hc_bytes_per_step") is None:
                cells.append("")
            else:
                vs = vs_dense(r)
                cells.append(f"{r['hc_bytes_per_step'] / 1e6:.3f} MB, {r['final_train_loss']:.3f} / "
                             f"{r['test_loss']:.3f}" + (f" ({vs})" if vs else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _percent(v: float | None) -> str:
    return "" if v is None else f"{100 * v:+.1f}%"


def e2e_group(group) -> str:
    """docs/benchmarks.md's table of one link and rank count (an e2e_results.Group): a row per run, model and method,
    in the order each run wrote them, so a method or a result file new to the bench shows up without a change here.
    Horovod / this is Horovod's mean step of the same rule, model, link and ranks over this one (its own run's where
    it has one, else the group's dense run, marked *). Seeds: the mean held-out loss over the model seeds against
    the dense rule's mean, and the per-seed ratios' geometric mean [95% interval] (``paired_ratio``)."""
    from hvd_compress.bench import e2e_results

    header = ["run", "model", "method", "median step ms", "mean step ms", "Horovod / this", "MB / step / rank",
              "held-out loss", "vs dense", "over seeds: mean vs dense; per seed [95%]"]
    body = []
    borrowed = set()
    for name, result in group.results:
        run = f"[{result['label']}](#{stamp_anchor(name)})"
        for row in result["rows"]:
            head = [run, row["model"], row["method"]]
            if row.get("skipped"):
                body.append([*head, f"skipped: {row['skipped']}", *[""] * (len(header) - 4)])
                continue
            mean = e2e_results.mean_step_ms(result, row)
            ratio = e2e_results.vs_horovod(group, name, result, row)
            ratio_cell = ""
            if ratio is not None and not row["method"].startswith("Horovod"):
                ratio_cell = f"{ratio[0]:.2f}" if ratio[0] < 10 else f"{ratio[0]:.0f}"
                if ratio[1] != name:
                    ratio_cell += "\\*"
                    borrowed.add(ratio[1])
            if row.get("hc_bytes_per_step") is not None:
                sent = f"{row['hc_bytes_per_step'] / 1e6:.3f}"
            elif row.get("wire_bytes_per_step") is not None:
                sent = f"{row['wire_bytes_per_step'] / 1e6:.3f} (wire)"
            else:
                sent = ""
            test = row.get("test_loss")
            test_cell = ("" if test is None or not math.isfinite(test)
                         else f"{test:.4f}" if test < 1e3 else f"{test:.1e}")
            seeds = ""
            if row.get("test_loss_vs_dense_over_seeds") is not None:
                seeds = _percent(row["test_loss_vs_dense_over_seeds"])
                paired = paired_ratio(row["seed_test_losses"], row["seed_dense_test_losses"])
                if paired is not None:
                    seeds += "; {:+.0%} [{:+.0%}, {:+.0%}]".format(*paired) + f" ({len(row['seeds'])} seeds)"
            body.append([*head, f"{row['median_step_ms']:.1f}", "" if mean is None else f"{mean:.1f}", ratio_cell,
                         sent, test_cell, _percent(row.get("test_loss_vs_dense")), seeds])
    # A column no row of this group fills (no Horovod step, no dense reference, no seeds) is left out.
    keep = [i for i in range(len(header)) if i < 4 or any(cells[i] for cells in body)]
    lines = ["| " + " | ".join(header[i] for i in keep) + " |",
             "|" + "|".join("---" if i < 3 or i == len(header) - 1 else "---:" for i in keep) + "|"]
    lines += ["| " + " | ".join(cells[i] for i in keep) + " |" for cells in body]
    out = "\n".join(lines) + "\n"
    if borrowed:
        out += f"\n\\* against Horovod's step in {', '.join(sorted(borrowed))} (same link, ranks and model).\n"
    return out


def stamp_anchor(name: str) -> str:
    """The id of a result's provenance line on docs/benchmarks.md."""
    return "run-" + name.removesuffix(".json").replace("_", "-").replace(".", "-")


#: The op every demo row is compared with.
DEMO_BASELINE = "Horovod Adam"


def demo(result: dict) -> str:
    """``make demo``'s table, from the JSON it writes: a row per op, its step and held-out accuracy against
    Horovod's dense step (the row ``DEMO_BASELINE``), bytes, losses and the seconds to reach ``result["target"]``,
    the training loss Horovod's step ended at."""
    rows = [r for r in result["rows"] if not r.get("skipped")]
    base = next(r for r in rows if r["method"] == DEMO_BASELINE)
    lines = [f"| op | ms/step | Horovod ms / this | held-out accuracy | vs Horovod (points) | MB sent/step/rank "
             f"| steps | final train loss | held-out loss | s to loss {result['target']:.3g} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["hc_bytes_per_step"] is not None:
            sent = f"{r['hc_bytes_per_step'] / 1e6:.3f}"
        elif r.get("wire_bytes_per_step") is not None:
            sent = f"{r['wire_bytes_per_step'] / 1e6:.3f} *"
        else:
            sent = "n/a"
        reached = "not reached" if r["time_to_dense_loss_s"] is None else f"{r['time_to_dense_loss_s']:.1f}"
        lines.append(
            f"| {r['method']} | {r['median_step_ms']:.1f} | {base['median_step_ms'] / r['median_step_ms']:.1f}x | "
            f"{100 * r['test_accuracy']:.1f}% | {100 * (r['test_accuracy'] - base['test_accuracy']):+.1f} | {sent} | "
            f"{r['steps']} | {r['final_train_loss']:.4f} | {r['test_loss']:.4f} | {reached} |"
        )
    return "\n".join(lines) + "\n"
