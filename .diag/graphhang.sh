#!/bin/bash
# Does chain-graph start under the hook? On a stall: thread states, then Python stacks (faulthandler on SIGABRT).
set -u
O=${OUT:-/tmp/out}
n=0
for share in 30 10 30 10 60; do
  n=$((n+1)); tag=$n-$share
  rm -f /tmp/u-$tag.usage
  PYTHONFAULTHANDLER=1 LD_PRELOAD=$PWD/build/libvgpu.so VGPU_USAGE=/tmp/u-$tag.usage CUDA_CORE_LIMIT=$share \
    python3 benchmarks/inference_workload.py chain-graph > $O/cg-$tag.out 2> $O/cg-$tag.err &
  pid=$!
  t=0
  while [ $t -lt 45 ] && [ ! -s $O/cg-$tag.out ]; do sleep 1; t=$((t+1)); done
  echo "try $tag: first line after ${t}s, lines $(wc -l < $O/cg-$tag.out)" >> $O/summary.txt
  if [ ! -s $O/cg-$tag.out ]; then
    for tk in /proc/$pid/task/*; do echo "$(basename $tk) $(cat $tk/comm) wchan=$(cat $tk/wchan 2>/dev/null) state=$(cut -d' ' -f3 $tk/stat) sys=$(cat $tk/syscall 2>/dev/null | cut -d' ' -f1-3)"; done >> $O/summary.txt
    grep -E 'VmRSS|Threads' /proc/$pid/status >> $O/summary.txt
    kill -ABRT $pid; sleep 3
  fi
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
done
