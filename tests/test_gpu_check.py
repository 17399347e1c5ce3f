"""tools/gpu_check.sh where there is no GPU: its dry run builds what it can, writes the CPU core's kernel fixtures
and renders the table with every GPU step skipped (so that the first GPU run measures instead of debugging), and
the table's rules (kernel rows folded per case, failures kept, speed targets judged against plain torch)."""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gpu_check_table


def _table(lines):
    return gpu_check_table.table(gpu_check_table.parse(lines))


def test_table_folds_kernel_sizes_and_keeps_a_failure():
    rows = [f"ROW\tkernel\tsign_unpack\t{n}\tPASS\tout equal" for n in (1, 7, 8)]
    rows += ["ROW\tkernel\tonebit_compress/f32\t1\tPASS\tbits equal; worker: CPU kernel's scale differs by 1 ulp",
             "ROW\tkernel\tonebit_compress/f32\t4095\tFAIL\terror: first difference at byte 12"]
    text, failed = _table(rows)
    assert failed == 1
    assert "| kernel  | sign_unpack" in text and "bytes equal at n=1,7,8" in text
    assert "n=4095: error: first difference at byte 12" in text
    assert "gpu_check: 1 passed, 1 failed" in text


def test_table_judges_speed_targets_against_plain_torch():
    rows = ["ROW\tspeed\tonebit_compress f32 (2 passes)\t16777216\t0.1300\t1600 GB/s",
            "ROW\tspeed\ttorch 1-bit compress+pack\t16777216\t0.6500\tH100",
            "ROW\tspeed\tonebit_adam_apply\t16777216\t0.5000\t670 GB/s",
            "ROW\tspeed\ttorch fused Adam step\t16777216\t0.2600\tH100",
            "ROW\tprobe\tallreduce Adasum\t2 ranks\tREFUSED\tRejectedInputError: ... CPU tensors only"]
    text, failed = _table(rows)
    assert failed == 0
    line = next(x for x in text.splitlines() if "onebit_compress f32" in x)
    assert "MET" in line and "5.0x faster" in line and "target <= 0.15 ms" in line
    line = next(x for x in text.splitlines() if "onebit_adam_apply" in x)
    assert "MISSED" in line and "target <= 1.5x torch fused Adam" in line
    assert "1 refused, speed targets 1 met and 1 missed" in text


def _splitmix_bytes(seed, n):
    mask, out, s = (1 << 64) - 1, [], seed
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & mask
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) >> 56)
    return np.array(out, dtype=np.uint8)


def _fnv1a(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & ((1 << 64) - 1)
    return f"{h:016x}"


@pytest.mark.skipif(shutil.which("g++") is None, reason="the dry run builds the CPU fixture writer with g++")
def test_dry_run_writes_cpu_fixtures_and_skips_gpu_steps(tmp_path):
    out = tmp_path / "gpu_check"
    env = dict(os.environ, GPU_CHECK_OUT=str(out), KCHECK_SIZES="1,7,8,4095")
    proc = subprocess.run(["bash", "tools/gpu_check.sh", "--dry-run"], check=False, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    table = (out / "table.md").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "| fixtures" in table and "wrote" in table and "PASS" in table.split("| fixtures")[1].split("\n")[0]
    assert "no GPU" in table  # the kernel check and the probe say why they did not run
    assert "| probe" in table and "| missing" in table
    lines = [x.split() for x in (out / "fixtures.txt").read_text().splitlines() if not x.startswith("#")]
    cases = {x[0] for x in lines}
    with open(os.path.join(ROOT, "cpp", "tests", "kernel_cases.h")) as f:
        header = f.read()
    declared = set(re.findall(r'"([^"]+)"', header.split("case_names() {")[1].split("};")[0]))
    assert len(declared) >= 45 and cases == declared, sorted(declared ^ cases)  # every case of the check, no other
    assert {int(x[1]) for x in lines} == {1, 7, 8, 4095}
    # One digest recomputed here: bfloat16 -> float32 is the 16 bits shifted up, NaN payloads kept.
    raw = _splitmix_bytes(20261127 + 19, 2 * 4095).view("<u2").astype(np.uint32) << 16
    want = _fnv1a(raw.astype("<u4").tobytes())
    got = next(x for x in lines if x[0] == "widen_to_float/bf16" and x[1] == "4095")
    assert got[3:] == [str(4 * 4095), want], got
