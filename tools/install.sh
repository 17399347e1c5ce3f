#!/usr/bin/env bash
# Brings a fresh Debian machine (root, PyPI + Debian reachable) to the full hvd_compress stack,
# and returns in seconds when that stack is already there. Idempotent; safe to run repeatedly.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
CACHE=${HVDC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd_compress}
TORCH_VERSION=2.13.0
TF_VERSION=2.21.0
HOROVOD_VERSION=0.28.1
mkdir -p "$CACHE"
log() { echo "[install] $*"; }

have_py() { "$PY" - "$@" <<'PYEOF' 2>/dev/null
import importlib.metadata as md, sys
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        got = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if want and not got.split("+")[0] == want:
        sys.exit(1)
PYEOF
}

# 1. System MPI (Open MPI from Debian) and iproute2 (tc/ip netns for the slow-network bench).
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    log "apt: openmpi-bin libopenmpi-dev iproute2"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq openmpi-bin libopenmpi-dev iproute2 >/dev/null
fi
command -v tc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }

# 2. Python packages. torch first and pinned: the local CPU wheel; any other version pulls CUDA.
if ! have_py torch==$TORCH_VERSION; then
    log "pip: torch==$TORCH_VERSION"
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
# scikit-learn: only for its bundled digits data set (no download), used by the ReLU fidelity test.
if ! have_py tensorflow==$TF_VERSION tf_keras==$TF_VERSION mpi4py numpy nanobind==3.1.0 pytest pytest-timeout tqdm ruff matplotlib scikit-learn; then
    log "pip: tensorflow, tf_keras, mpi4py, numpy, nanobind, pytest, tqdm, ruff, matplotlib, scikit-learn"
    "$PY" -m pip install -q -c "$here/tools/constraints.txt" "torch==$TORCH_VERSION" \
        "tensorflow==$TF_VERSION" "tf_keras==$TF_VERSION" mpi4py numpy nanobind==3.1.0 pytest pytest-timeout \
        tqdm ruff matplotlib scikit-learn packaging wheel
fi

# 3. Horovod from its sdist, patched for torch 2.13 / TF 2.21, built once and cached as a wheel.
patch_file="$here/tools/horovod-$HOROVOD_VERSION.patch"
key=$( (cat "$patch_file"; echo "torch=$TORCH_VERSION tf=$TF_VERSION") | sha256sum | cut -c1-12)
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION-$key"
if ! have_py horovod==$HOROVOD_VERSION || [ "$(cat "$CACHE/horovod.key" 2>/dev/null)" != "$key" ]; then
    if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
        log "building Horovod $HOROVOD_VERSION (about 4 minutes on 2 cores)"
        src=$(mktemp -d)
        trap 'rm -rf "$src"' EXIT
        "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$src"
        tar xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
        patch -s -d "$src/horovod-$HOROVOD_VERSION" -p1 < "$patch_file"
        mkdir -p "$wheel_dir.tmp"
        (cd "$src/horovod-$HOROVOD_VERSION" && \
            MAKEFLAGS=-j2 CMAKE_POLICY_VERSION_MINIMUM=3.5 \
            HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
            HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
            "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$wheel_dir.tmp" .)
        rm -rf "$wheel_dir"; mv "$wheel_dir.tmp" "$wheel_dir"
    fi
    log "pip: horovod wheel from $wheel_dir"
    "$PY" -m pip install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
    # Horovod's runtime deps, without letting pip touch torch.
    "$PY" -m pip install -q -c "$here/tools/constraints.txt" cloudpickle psutil pyyaml packaging cffi
    echo "$key" > "$CACHE/horovod.key"
fi

# 4. The extension, in place (editable) so tests and examples import the checkout.
if ! (cd "$here" && "$PY" -c "import hvd_compress._core, hvd_compress._kernel_bench" 2>/dev/null) || \
   [ -n "$(find "$here/cpp" "$here/setup.py" -newer "$here/hvd_compress/.core_built" 2>/dev/null | head -1)" ] || \
   [ ! -e "$here/hvd_compress/.core_built" ]; then
    log "building hvd_compress._core and hvd_compress._kernel_bench"
    # Each extension's sources compile side by side, one per core (setuptools alone compiles them in turn).
    (cd "$here" && HVDC_BUILD_JOBS="${HVDC_BUILD_JOBS:-$(getconf _NPROCESSORS_ONLN)}" \
        "$PY" setup.py -q build_ext --inplace >/dev/null)
    touch "$here/hvd_compress/.core_built"
fi
log "ok"
