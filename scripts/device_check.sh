#!/usr/bin/env bash
# Device check: one GPU of the H200 class, at most 8 minutes, nothing downloaded.
#
#   bash scripts/device_check.sh                 # on the GPU machine (Python 3.12 with torch, CUDA)
#   bash scripts/device_check.sh --fetch-wheels  # beforehand, on a machine that reaches PyPI: fill the wheel folder
#   bash scripts/device_check.sh --help          # this text
#
# What it runs, each part under its own time limit, cut to what is left of the 8 minutes (SWERL_DEVICE_BUDGET_S,
# default 480) when less is left; a part with under 10 s left is not run (exit "out of budget"):
#   1. a virtualenv over the machine's Python and torch (--system-site-packages), swerl's trainer dependencies
#      installed from the carried wheel folder only (pip install --no-index --find-links WHEELS);
#   2. scripts/device_bench.py: FSDP2 SFT and GRPO steps on a Qwen3 built from config (Qwen3-0.6B's shape, random
#      weights, bf16 compute over fp32 master weights): tokens/s and MFU (6 N + 12 L H D S FLOPs per token against
#      the bf16 dense peak, H200 989 TFLOP/s); the GRPO trainer's weights to the local engine through disk (export,
#      update_weights_from_disk) and over a process group (DistributedWeights: NCCL, or gloo where NCCL refuses two
#      ranks on one GPU), seconds per sync and per GB, and a check that the engine then holds the trainer's weights;
#   3. pytest -m gpu on the test files that have gpu-marked tests;
#   4. where the megatron wheels fit (megatron-core and megatron-bridge import), a Megatron forward/backward and
#      optimizer step of a tiny Qwen3-MoE (device_bench.py --parts megatron); otherwise the reason it was skipped.
# Results: a summary on stdout and JSON under $OUT (default runs/device-check): device_bench.json,
# device_bench_megatron.json, pytest_gpu.txt, device_check.json (each part's exit code and seconds).
#
# The wheel folder: $SWERL_WHEELS, default runs/device-wheels (runs/ is git-ignored; carry it to the GPU machine
# with the working tree). --fetch-wheels downloads into it, for CPython 3.12 on x86_64 Linux: transformers and
# what swerl's trainer imports (requirements in WHEELS/requirements.txt; torch is the machine's own), pytest, and
# megatron-core/megatron-bridge without their dependencies in WHEELS/megatron (their full dependency set, ~290
# packages with CUDA libraries, does not fit a carried folder: docs/gpu.md makes that environment).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=${SWERL_WHEELS:-runs/device-wheels}
OUT=${OUT:-$ROOT/runs/device-check}
PY=${PYTHON:-python3}
VENV=${SWERL_DEVICE_VENV:-runs/device-venv}
BENCH_FLAGS=${SWERL_DEVICE_BENCH_FLAGS:-}  # e.g. "--cpu --tiny": the whole flow as a smoke test without a GPU

# Trainer dependencies, pinned as pyproject.toml pins them (swerl itself runs from the checkout, not installed).
REQUIREMENTS=(
  "transformers==5.23.0" "tokenizers>=0.22" "safetensors" "pydantic>=2.7,<3" "pyyaml>=6" "fsspec==2026.9.0"
  "numpy" "jinja2" "pytest==9.2.0" "pytest-timeout==2.4.0"
)
MEGATRON=("megatron-core==0.19.2" "megatron-bridge==0.6.2")

case "${1:-}" in
  "" | --fetch-wheels) ;;
  -h | --help)  # the header above, without its first line
    sed -n '2,/^set -uo pipefail/{/^set -uo pipefail/d;s/^# \{0,1\}//;p}' "$0"
    exit 0 ;;
  *) echo "unknown argument ${1}: use --fetch-wheels, --help, or none (the check itself)" >&2; exit 2 ;;
esac

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  mkdir -p "$WHEELS/megatron"
  printf '%s\n' "${REQUIREMENTS[@]}" > "$WHEELS/requirements.txt"
  platform=(--python-version 3.12 --implementation cp --only-binary=:all:
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  "$PY" -m pip download "${platform[@]}" -d "$WHEELS" -r "$WHEELS/requirements.txt" || exit 1
  "$PY" -m pip download "${platform[@]}" --no-deps -d "$WHEELS/megatron" "${MEGATRON[@]}" || exit 1
  du -sh "$WHEELS"
  exit 0
fi

started=$(date +%s)
mkdir -p "$OUT"
export ROOT WHEELS OUT PY VENV BENCH_FLAGS
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
declare -A RC TOOK
BUDGET_S=${SWERL_DEVICE_BUDGET_S:-480}
part() {  # part NAME LIMIT_S 'COMMAND': run it in bash under a time limit, keep its exit code and seconds
  local name=$1 limit=$2 command=$3 began left
  began=$(date +%s)
  left=$(( BUDGET_S - (began - started) - 15 ))  # 15 s: the kill grace below and the summary
  if (( left < 10 )); then
    echo "== $name: not run, ${left}s left of the ${BUDGET_S}s budget"
    RC[$name]="out of budget" TOOK[$name]=0
    return
  fi
  (( limit > left )) && limit=$left
  echo "== $name (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" bash -o pipefail -c "$command"
  RC[$name]=$?
  TOOK[$name]=$(( $(date +%s) - began ))
  echo "== $name: exit ${RC[$name]} in ${TOOK[$name]}s"
}

echo "== machine"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "| gpus", torch.cuda.device_count(), "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

part setup 90 '
  set -e
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv --system-site-packages "$VENV"
  if [[ -f "$WHEELS/requirements.txt" ]]; then
    "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" -r "$WHEELS/requirements.txt"
  else
    echo "no $WHEELS/requirements.txt: using what the machine'"'"'s Python already has"
  fi
  if compgen -G "$WHEELS/megatron/*.whl" >/dev/null; then
    "$VENV/bin/python" -m pip install --quiet --no-index --no-deps "$WHEELS"/megatron/*.whl ||
      echo "the megatron wheels did not install"
  fi
  "$VENV/bin/python" -c "import torch, transformers, pydantic, yaml, pytest; print(\"trainer dependencies import\")"
'
VPY=$VENV/bin/python
[[ -x "$VPY" ]] || VPY=$(command -v "$PY")
export VPY

part bench 270 '"$VPY" scripts/device_bench.py $BENCH_FLAGS --parts sft,grpo,sync --out "$OUT/device_bench.json"'

GPU_TESTS=$(grep -rl --include="test_*.py" "pytest.mark.gpu" tests | tr '\n' ' ')
export GPU_TESTS
if [[ -n "$GPU_TESTS" ]]; then
  part pytest_gpu 120 '"$VPY" -m pytest -m gpu -q -p no:cacheprovider $GPU_TESTS 2>&1 | tee "$OUT/pytest_gpu.txt"'
else
  echo "== pytest_gpu: no test file has gpu-marked tests"
  RC[pytest_gpu]=0 TOOK[pytest_gpu]=0
fi

if reason=$("$VPY" -c 'import megatron.core, megatron.bridge' 2>&1); then
  part megatron 75 '"$VPY" scripts/device_bench.py $BENCH_FLAGS --parts megatron --out "$OUT/device_bench_megatron.json"'
else
  reason=$(echo "${reason:-not installed}" | tail -1)
  echo "== megatron: skipped (the megatron wheels do not import here: $reason)"
  "$VPY" -c 'import json, sys; print(json.dumps({"megatron": {"skipped": sys.argv[1]}}))' "$reason" \
    > "$OUT/device_bench_megatron.json"
  RC[megatron]=skipped TOOK[megatron]=0
fi

total=$(( $(date +%s) - started ))
{
  echo "{"
  for name in setup bench pytest_gpu megatron; do
    echo "  \"$name\": {\"exit\": \"${RC[$name]:-not run}\", \"seconds\": ${TOOK[$name]:-0}},"
  done
  echo "  \"total_seconds\": $total"
  echo "}"
} > "$OUT/device_check.json"
echo "== device check: ${total}s in all; results in $OUT"
cat "$OUT/device_check.json"
status=0
for name in setup bench pytest_gpu; do
  [[ "${RC[$name]:-1}" == 0 ]] || status=1
done
[[ "${RC[megatron]}" == 0 || "${RC[megatron]}" == skipped ]] || status=1
exit $status
