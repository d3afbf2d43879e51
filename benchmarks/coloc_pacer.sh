#!/bin/bash
# coloc_pacer.sh - co-location with the pacer alone (no daemon): standalone
# vgpu-burn tenants started together on device 0, each with its own usage
# block, CUDA_CORE_LIMIT and an 8 GiB CUDA_MEM_LIMIT, sharing one arbiter
# directory. Prints each tenant's work (kernels x kernel time / wall time, in
# % of the GPU) and the arbiter's counters (turns taken, turns skipped for a
# lapsed lease).
# Run from the repository root after `make lib tools`; on the simulator, set
# LD_LIBRARY_PATH=build/sim and VGPU_SIM_STATE first. docs/compute.md.
# HOOK: the hook to test (default build/libvgpu.so), e.g. one built with
#   make lib BUILD=build/hold32 CFLAGS="-O2 -g -DTURN_HOLD_NS=32000000ull"
set -eu
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-5}
HOOK=${HOOK:-$PWD/build/libvgpu.so}

run() { # KERNEL_US "BURN OPTIONS" SHARE...
    local kernel=$1 opts=$2
    shift 2
    local dir i=0 pids=()
    dir=$(mktemp -d)
    for share in "$@"; do
        # shellcheck disable=SC2086  # opts is a list of options
        VGPU_ARBITER_DIR=$dir LD_PRELOAD=$HOOK VGPU_USAGE=$dir/usage$i \
            CUDA_CORE_LIMIT=$share CUDA_MEM_LIMIT=8g ./build/vgpu-burn --json --seconds "$SECONDS_EACH" \
            --kernel-us "$kernel" $opts >"$dir/out$i" &
        pids+=($!)
        i=$((i + 1))
    done
    wait "${pids[@]}"
    python3 - "$dir" "$kernel" "$opts" "$@" <<'PY'
import glob, json, struct, sys

d, kernel, opts, shares = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
work = []
for i in range(len(shares)):
    for line in open(f"{d}/out{i}"):
        r = json.loads(line)
        if r.get("summary"):
            work.append(round(100 * r["kernels"] * kernel / 1e6 / r["wall_s"], 1))
# struct vgpu_arbiter: header (16), next, serving, lease_ns, turns, skips
counters = [struct.unpack_from("<QQ", open(f, "rb").read(), 32) for f in glob.glob(d + "/GPU-*")]
print(f"{kernel} us {opts}: shares {'/'.join(shares)} work {'/'.join(map(str, work))}"
      f" (turns, skips) {counters}")
PY
    rm -rf "$dir"
}

run 20000 "--sync 1" 70
run 20000 "--sync 1" 30 70
run 2000 "--sync 8" 30 70
run 2000 "--sync 1" 30 70
run 20000 "--sync 1" 20 30 50
# A share of 100 is not paced; with a memory limit the hook is active and
# takes turns while the other one paces (docs/compute.md).
run 20000 "--sync 1" 30 100
run 2000 "--sync 8" 30 100
