#!/bin/bash
# As built: a chain whose share binds (15, 20) beside a GEMM at 50: does it take turns and starve?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
date -u; make -s -j16 lib tools >/tmp/build.log 2>&1 || { tail /tmp/build.log; exit 1; }
timeout 200 python3 benchmarks/bench_inference.py /tmp/res/A --daemon --seconds 5 --workloads chain --shares "" --coloc 15:50,20:50,20:40 --neighbour gemm > /tmp/res/A.log 2>&1
echo rc=$?; grep -E "^\|" /tmp/res/A/inference.md
tar czf $OUT/res.tgz -C /tmp res
