#!/bin/bash
# Issue 11: the chain at 30 beside a GEMM at 50 and 40 (s/b + g <= 1): does a turn held long enough give it its share?
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu --format=csv,noheader; python3 -c 'import sys,torch; print(sys.version.split()[0], "torch", torch.__version__)'; git log --oneline -1; } | tee $OUT/env.txt
declare -A V=(
  [A]=""
  [B]="-DTURNLESS_MAX_USE_PPM=0u"
  [C]="-DTURNLESS_MAX_USE_PPM=0u -DBROKER_SLACK_PPM=200000u"
  [D]="-DTURNLESS_MAX_USE_PPM=0u -DBROKER_SLACK_PPM=200000u -DTURN_LINGER_NS=3000000ull"
)
for v in A B C D; do
  rm -rf /tmp/t$v; mkdir /tmp/t$v
  tar --exclude=.git --exclude=.whl --exclude=.diag -cf - . | tar -C /tmp/t$v -xf -
  (cd /tmp/t$v && make -s -j16 lib tools CFLAGS="-O2 -g ${V[$v]}" >/tmp/build-$v.log 2>&1) || { echo "build $v failed"; tail /tmp/build-$v.log; }
done
mkdir -p /tmp/res; echo "built $(date -u +%T)"
start=$SECONDS
for round in 1 2; do
  [ $round = 2 ] && [ $((SECONDS-start)) -gt 240 ] && break
for v in A B C D; do
  echo "== $v round $round $(date -u +%T)"
  (cd /tmp/t$v && timeout 150 python3 benchmarks/bench_inference.py /tmp/res/$v$round --daemon --seconds 5 \
     --workloads chain --shares "" --coloc 30:50,30:40 --neighbour gemm > /tmp/res/$v$round.log 2>&1)
  echo "rc=$?"; grep -E "^\|" /tmp/res/$v$round/inference.md | head -12
done
done
tar czf $OUT/res.tgz -C /tmp res
