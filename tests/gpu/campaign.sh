#!/usr/bin/env bash
# One campaign on a GPU node, for the record in docs/: build the C parts
# with the node's gcc, note the versions, run tests/gpu with the node's
# framework Python, the overhead benchmarks, the daemon against the real
# driver (devices with their SM counts, `vgpuctl doctor`), the pacer's
# co-location script and the demo. Results go under OUTDIR; the compute
# benchmark (benchmarks/bench_compute.py) is long enough to be a run of its own.
#   tests/gpu/campaign.sh OUTDIR
set -uo pipefail
out=${1:?usage: campaign.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/../.."

# vgpud's own dependencies, fetched beforehand by tests/gpu/wheels.sh and
# carried as .whl/ (the node cannot reach PyPI).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/vgpud-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/vgpud-site${PYTHONPATH:+:$PYTHONPATH}
fi

make lib tools >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
{
  date -u +"date: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, jax, cupy; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "jax", jax.__version__, "cupy", cupy.__version__)'
  uname -r
} >"$out/env.txt" 2>&1

# The daemon on the real driver, unprivileged paths: what /v1/devices says
# of the GPU (the SM count comes from the CUDA driver where NVML has none),
# then `vgpuctl doctor` comparing the real libcuda's exports with the hook's.
daemon_check() {
  local dir rc=0
  dir=$(mktemp -d /tmp/vgd.XXXX)
  python3 -m vgpud.daemon --socket "$dir/s" --run-dir "$dir/run" --state-dir "$dir/state" \
    >"$dir/vgpud.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -S "$dir/s" ] && break; sleep 0.1; done
  curl -sf --unix-socket "$dir/s" http://vgpud/v1/devices || rc=1
  echo
  python3 -c 'from vgpud.ctl.main import main; raise SystemExit(main())' \
    --socket "$dir/s" doctor --verbose || rc=1
  kill "$pid"; wait "$pid"
  cat "$dir/vgpud.log"
  rm -rf "$dir"
  return $rc
}

status=0
python3 -m pytest -v -p no:cacheprovider tests/gpu 2>&1 | tee "$out/tests-gpu.log" || status=1
python3 benchmarks/bench_alloc.py --out "$out/alloc.json" >"$out/alloc.log" 2>&1 || status=1
python3 benchmarks/bench_launch.py "$out/launch" >"$out/launch.log" 2>&1 || status=1
daemon_check >"$out/daemon.log" 2>&1 || status=1
SECONDS_EACH=6 bash benchmarks/coloc_pacer.sh >"$out/coloc.log" 2>&1 || status=1
python3 -m demo >"$out/demo.log" 2>&1 || status=1
exit $status
