#!/usr/bin/env bash
# One GPU session's campaign, for the record in docs/: build the C parts
# with the node's gcc, note the versions, run tests/gpu with the node's
# framework Python, then the overhead benchmarks. Results go under OUTDIR.
#   tests/gpu/campaign.sh OUTDIR
set -uo pipefail
out=${1:?usage: campaign.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."

make lib tools >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, jax, cupy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "jax", jax.__version__, "cupy", cupy.__version__)'
  uname -r
} >"$out/env.txt" 2>&1

status=0
python3 -m pytest -v -p no:cacheprovider tests/gpu 2>&1 | tee "$out/tests-gpu.log" || status=1
python3 benchmarks/bench_alloc.py --out "$out/alloc.json" >"$out/alloc.log" 2>&1 || status=1
python3 benchmarks/bench_launch.py "$out/launch" >"$out/launch.log" 2>&1 || status=1
exit $status
