#!/usr/bin/env bash
# usage: g3.sh OUTDIR — the calibrated test twice, then chain beside GEMM at feasible shares
set -uo pipefail
out=$1; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vgpud-site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/vgpud-site${PYTHONPATH:+:$PYTHONPATH}
make lib tools >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import sys,torch;print(sys.version.split()[0], torch.__version__)'; git log --oneline -1; } > "$out/env.txt" 2>&1
for i in 1 2; do
  python3 -m pytest -v -p no:cacheprovider tests/gpu/test_inference_shares.py -k calibrated 2>&1 | tail -25 > "$out/calibrated-$i.log"
  grep -E "PASSED|FAILED|Error:" "$out/calibrated-$i.log" | cut -c1-400
done
timeout 200 python3 benchmarks/bench_inference.py --daemon --seconds 5 --workloads chain --shares "" --coloc 30:50,30:40 --neighbour gemm "$out/coloc" > "$out/coloc.log" 2>&1
tail -25 "$out/coloc.log"
