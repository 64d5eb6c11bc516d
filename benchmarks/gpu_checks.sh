#!/bin/bash
# The GPU checks of issue 35 in the order they matter, each bounded in time, each result saved:
#   bash benchmarks/gpu_checks.sh [OUT_FOLDER]        (default: gpu-checks/ in the current folder)
# 1. the static engine's CUDA graphs against the transformers loop and against eager (tests/agent/test_decode.py -k cuda)
# 2. decode_profile: ms per token step of each engine, the numerical gaps, an operator table over 8 steps
# 3. one client epoch on the 1.5B shape with each engine (gpu_round.py), both in this one call so they compare
# Seen on an H100 (2026-11-27): a gpu_round call took about 130 s with the static engine and 200 s with hf.
set -u
OUT=${1:-gpu-checks}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/benchmarks
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$OUT/card.txt"
stamp "cuda tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/agent/test_decode.py -k cuda 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
stamp "decode_profile"
timeout 150 python3 benchmarks/decode_profile.py --shape 1.5b --json > "$OUT/decode_profile.json" 2> "$OUT/decode_profile.err"
echo "rc $?"; grep -v "USDT\|profiler_st" "$OUT/decode_profile.err" | tail -6
ROUND="--shape 1.5b --set tasks-per-epoch=16 --set group-size=8 --paper-round --paper-set tasks-per-epoch=64 --paper-set max-steps=15 --paper-set max-new-tokens=128 --json"
for engine in static hf; do
  stamp "gpu_round $engine"
  timeout 240 python3 benchmarks/gpu_round.py $ROUND --decode-engine $engine > "$OUT/round_$engine.json" 2> "$OUT/round_$engine.err"
  echo "rc $?"; tail -3 "$OUT/round_$engine.err"; cut -c1-700 "$OUT/round_$engine.json"
done
stamp done
