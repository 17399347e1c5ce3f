"""The one summary table of tools/gpu_check.sh, from the tab-separated ROW lines its steps print:

    ROW <section> <item> <n> <status> <detail>

status is PASS, FAIL, SKIP, REFUSED (the probe: the core refused a CUDA tensor) or INFO; in the speed section it is
the median milliseconds. Kernel rows are folded into one line per kernel case over the sizes; speed rows get
GB/s from their detail, the plain-torch figure they are set against and the target set for it in specs/gpu.md.
Usage: gpu_check_table.py ROWS_FILE... ; exit status 1 when any row failed."""
import re
import sys

SECTIONS = ("machine", "mpi", "build", "fixtures", "device", "kernel", "probe", "speed", "missing")
# Kernel -> (plain-torch row it is set against, target: ("ms", limit) or ("x torch", factor)).
SPEED_TARGETS = {
    "onebit_compress f32 (2 passes)": ("torch 1-bit compress+pack", ("ms", 0.15)),
    "stochastic_quantize + moments": ("torch stochastic quantize + moments", ("ms", 0.3)),
    "bernoulli_mask + mask_gather f32 k=0.1": ("torch Bernoulli mask + gather k=0.1", ("ms", 0.15)),
    "onebit_local_momentum": ("torch fused Adam step", ("x torch", 1.5)),
    "onebit_adam_apply": ("torch fused Adam step", ("x torch", 1.5)),
    "onebit_lamb_moments": ("torch fused Adam step", ("x torch", 1.5)),
    "onebit_lamb_apply": ("torch fused Adam step", ("x torch", 1.5)),
    "slamb_local_moments k=0.1": ("torch fused Adam step", ("x torch", 1.5)),
    "slamb_apply": ("torch fused Adam step", ("x torch", 1.5)),
}


def parse(lines):
    rows = []
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if parts[0] == "ROW" and len(parts) >= 5:
            rows.append(tuple(parts[1:6]) + ("",) * (6 - len(parts)))
    return rows


def fold_kernels(rows):
    """One row per kernel case: PASS when every size passed, the failing sizes' details otherwise."""
    cases = {}
    for _, item, n, status, detail in rows:
        cases.setdefault(item, []).append((n, status, detail))
    out = []
    for item, runs in cases.items():
        sizes = ",".join(n for n, _, _ in runs)
        failed = [(n, d) for n, s, d in runs if s == "FAIL"]
        skipped = all(s == "SKIP" for _, s, _ in runs)
        notes = sorted({note for _, _, d in runs for note in d.split("; ")[1:] if "differs" in note})
        if failed:
            out.append(("kernel", item, "FAIL", "; ".join(f"n={n}: {d}" for n, d in failed)))
        elif skipped:
            out.append(("kernel", item, "SKIP", runs[0][2]))
        else:
            out.append(("kernel", item, "PASS", f"bytes equal at n={sizes}" + "".join(f"; {x}" for x in notes)))
    return out


def speed_rows(rows):
    ms = {item: float(status) for _, item, _, status, _ in rows if re.fullmatch(r"[0-9.]+", status)}
    out = []
    for _, item, _, status, detail in rows:
        if item not in ms:
            out.append(("speed", item, status, detail))
        elif item.startswith("torch ") or item.startswith("D2H") or item.startswith("H2D") or item.startswith("device"):
            out.append(("speed", item, "INFO", f"{status} ms; {detail}"))
        else:
            out.append(speed_row(item, float(status), detail, ms))
    return out


def speed_row(item, mine, detail, ms):
    """A kernel's speed row: its time against its plain-torch row and its target, where it has them."""
    text, result = f"{mine:.4f} ms; {detail}", "INFO"
    if item in SPEED_TARGETS:
        torch_row, (kind, limit) = SPEED_TARGETS[item]
        if torch_row in ms:
            text += f"; torch {ms[torch_row]:.4f} ms ({ms[torch_row] / mine:.1f}x faster)"
        if kind == "ms":
            result = "MET" if mine <= limit else "MISSED"
            text += f"; target <= {limit} ms"
        elif torch_row in ms:
            result = "MET" if mine <= limit * ms[torch_row] else "MISSED"
            text += f"; target <= {limit}x torch fused Adam"
    return ("speed", item, result, text)


def table(rows):
    by_section = {s: [r for r in rows if r[0] == s] for s in SECTIONS}
    lines = []
    for section in SECTIONS:
        part = by_section[section]
        if section == "kernel":
            lines += fold_kernels(part)
        elif section == "speed":
            lines += speed_rows(part)
        else:
            lines += [(s, item if n in ("", "-") else f"{item} ({n})", status, detail)
                      for s, item, n, status, detail in part]
    width = [max(len(x[i]) for x in [*lines, ("section", "item", "result", "detail")]) for i in range(3)]
    out = [f"| {'section':<{width[0]}} | {'item':<{width[1]}} | {'result':<{width[2]}} | detail |",
           f"| {'-' * width[0]} | {'-' * width[1]} | {'-' * width[2]} | --- |"]
    out += [f"| {s:<{width[0]}} | {i:<{width[1]}} | {r:<{width[2]}} | {d} |" for s, i, r, d in lines]
    count = {k: sum(1 for x in lines if x[2] == k) for k in ("PASS", "FAIL", "SKIP", "REFUSED", "MET", "MISSED")}
    out.append(f"gpu_check: {count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} skipped, "
               f"{count['REFUSED']} refused, speed targets {count['MET']} met and {count['MISSED']} missed")
    return "\n".join(out), count["FAIL"]


def main(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += parse(f)
    text, failed = table(rows)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
