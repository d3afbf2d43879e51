"""Hard memory limits under the frameworks people run, on a real GPU.

Each test gives a process a slice, lets the framework allocate until it is
refused, and checks three things: the framework saw the slice as the whole
GPU, it got its ordinary out-of-memory error, and NVML (from outside) never
showed the process above the limit.
"""

from __future__ import annotations

import pytest

from .conftest import GiB, Hooked, MiB

LIMIT = 4 * GiB

TORCH_FILL = r"""
import json, torch
info = torch.cuda.mem_get_info()
blocks, err = [], ""
try:
    while True:
        blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    err = str(e)
print(json.dumps({"free": info[0], "total": info[1], "allocated": len(blocks) * (256 << 20),
                  "error": err}))
"""


@pytest.mark.parametrize(
    "alloc_conf",
    ["", "expandable_segments:True", "backend:cudaMallocAsync"],
    ids=["default", "expandable_segments", "cudaMallocAsync"],
)
def test_torch_stops_at_limit(hooked: Hooked, alloc_conf: str) -> None:
    res = hooked.run(TORCH_FILL, LIMIT, PYTORCH_CUDA_ALLOC_CONF=alloc_conf)
    assert res.rc == 0, res.err
    out = res.json()
    assert out["total"] == LIMIT
    # Each allocator words its out-of-memory error its own way; both must
    # name the slice as the device's capacity.
    error = str(out["error"])
    if alloc_conf == "backend:cudaMallocAsync":
        assert "(out of memory)" in error and "Device limit            : 4.00 GiB" in error
    else:
        assert "CUDA out of memory" in error and "total capacity of 4.00 GiB" in error
    assert 0 < int(out["allocated"]) <= LIMIT  # type: ignore[call-overload]
    assert res.nvml_peak <= LIMIT, f"NVML saw {res.nvml_peak / MiB:.0f} MiB"


def test_torch_graph_memory_nodes(hooked: Hooked) -> None:
    """Allocations captured into a CUDA graph (memory nodes) count too."""
    code = r"""
import json, torch
s = torch.cuda.Stream()
x = torch.ones(64 << 20, device="cuda")
g = torch.cuda.CUDAGraph()
ok, err = 0, ""
with torch.cuda.stream(s):
    with torch.cuda.graph(g, stream=s):
        ys = [x * i for i in range(40)]   # 40 x 256 MiB inside the graph
try:
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ok = 1
except Exception as e:
    err = str(e)
print(json.dumps({"ok": ok, "err": err, "sum": float(ys[3].sum().item()) if ok else 0.0}))
"""
    res = hooked.run(code, 16 * GiB, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    assert res.rc == 0, res.err
    out = res.json()
    assert out["ok"] == 1, out
    assert out["sum"] == 3.0 * (64 << 20)
    assert res.nvml_peak <= 16 * GiB


def test_torch_graph_over_limit_fails_cleanly(hooked: Hooked) -> None:
    code = r"""
import json, torch
x = torch.ones(64 << 20, device="cuda")
g = torch.cuda.CUDAGraph()
err = ""
try:
    with torch.cuda.graph(g):
        ys = [x * i for i in range(40)]
    g.replay(); torch.cuda.synchronize()
except Exception as e:
    err = type(e).__name__ + ": " + str(e)
print(json.dumps({"err": err}))
"""
    res = hooked.run(code, 4 * GiB, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    out = res.json()
    assert "out of memory" in str(out["err"]).lower(), out
    assert res.nvml_peak <= 4 * GiB


def test_jax_preallocation_fits_slice(hooked: Hooked) -> None:
    """JAX preallocates 75 % of what it sees as free: it must see the slice."""
    code = r"""
import json, jax, jax.numpy as jnp
x = jnp.ones((4096, 4096)); y = (x @ x).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print(json.dumps({"limit": stats.get("bytes_limit", 0), "v": float(y[0, 0])}))
"""
    res = hooked.run(code, 8 * GiB)
    assert res.rc == 0, res.err
    out = res.json()
    assert out["v"] == 4096.0
    assert 0 < int(out["limit"]) <= 8 * GiB  # type: ignore[call-overload]
    assert res.nvml_peak <= 8 * GiB


def test_cupy_stops_at_limit(hooked: Hooked) -> None:
    code = r"""
import json, cupy
blocks, err = [], ""
try:
    while True:
        blocks.append(cupy.empty(256 << 20, dtype=cupy.uint8))
except cupy.cuda.memory.OutOfMemoryError as e:
    err = str(e)
free, total = cupy.cuda.runtime.memGetInfo()
print(json.dumps({"total": total, "allocated": len(blocks) * (256 << 20), "error": err}))
"""
    res = hooked.run(code, LIMIT)
    assert res.rc == 0, res.err
    out = res.json()
    assert out["total"] == LIMIT
    assert "Out of memory" in str(out["error"]) or "out of memory" in str(out["error"])
    assert res.nvml_peak <= LIMIT


def test_processes_share_one_budget(hooked: Hooked) -> None:
    """Two processes of one vGPU together stay inside one limit."""
    code = r"""
import json, subprocess, sys, os
child = r'''
import json, sys, torch, time
torch.empty(1, device="cuda")  # the context first: both fit before either fills
print("ready", flush=True)
sys.stdin.readline()
b = []
try:
    while True:
        b.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
print(len(b) * (256 << 20), flush=True)
time.sleep(3)
'''
ps = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True) for _ in range(2)]
for p in ps:
    assert p.stdout.readline().strip() == "ready"
for p in ps:  # both go at once, then wait for both
    p.stdin.write("go\n"); p.stdin.flush()
got = [int(p.communicate()[0].split()[0]) for p in ps]
print(json.dumps({"got": got}))
"""
    res = hooked.run(code, 6 * GiB)
    assert res.rc == 0, res.err
    got = res.json()["got"]
    assert sum(got) <= 6 * GiB  # type: ignore[arg-type]
    assert res.nvml_peak <= 6 * GiB


def test_nvidia_smi_shows_the_slice(hooked: Hooked) -> None:
    """nvidia-smi under the hook reports used / limit of the vGPU."""
    code = r"""
import json, subprocess, torch, os
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
q = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used",
                    "--format=csv,noheader,nounits"], capture_output=True, text=True)
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                       "--format=csv,noheader,nounits"], capture_output=True, text=True)
print(json.dumps({"gpu": q.stdout.strip(), "apps": apps.stdout.strip(), "pid": os.getpid()}))
"""
    res = hooked.run(code, LIMIT)
    assert res.rc == 0, res.err
    out = res.json()
    total, used = (int(v) for v in str(out["gpu"]).split(","))
    assert total == LIMIT // MiB
    assert 1024 <= used <= LIMIT // MiB
    pids = {int(line.split(",")[0]) for line in str(out["apps"]).splitlines() if line}
    assert pids == {out["pid"]}


def test_oversubscription_spills_to_host(hooked: Hooked) -> None:
    """A vGPU promised more than the card has free still gets correct results.

    Another process first holds all but ~3 GiB of the card with ordinary
    allocations (never managed memory); the vGPU then allocates 8 GiB.
    """
    hold = r"""
import torch, sys, time
free, _ = torch.cuda.mem_get_info()
x = torch.empty(free - (3 << 30), dtype=torch.uint8, device="cuda")
print("held", flush=True)
sys.stdin.read()
"""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    holder = subprocess.Popen(
        [sys.executable, "-c", hold],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = r"""
import json, torch
xs = [torch.full((1 << 28,), float(i), device="cuda") for i in range(8)]   # 8 x 1 GiB
sums = [float(x.sum().item()) for x in xs]
print(json.dumps({"sums": sums}))
"""
        res = hooked.run(code, 12 * GiB, CUDA_MEMORY_OVERSUBSCRIBE="true")
        assert res.rc == 0, res.err
        sums = res.json()["sums"]
        assert sums == [float(i) * (1 << 28) for i in range(8)]
    finally:
        holder.kill()
        holder.wait()


def test_sigkill_returns_the_budget(hooked: Hooked) -> None:
    """A process killed -9 while holding most of the vGPU leaves nothing behind."""
    import subprocess
    import sys

    hold = r"""
import torch, sys
x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", flush=True)
sys.stdin.read()
"""
    holder = subprocess.Popen(
        [sys.executable, "-c", hold],
        env=hooked.environ(LIMIT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    res = hooked.run(TORCH_FILL, LIMIT)
    assert res.rc == 0, res.err
    # The killed process's 3 GiB are back: the newcomer fills the slice
    # (less its own context) again.
    assert int(res.json()["allocated"]) >= 3 * GiB  # type: ignore[call-overload]


def test_many_processes_allocating_at_once_never_exceed(hooked: Hooked) -> None:
    """16 processes of one vGPU allocate and free at random for a few seconds;
    NVML, read from outside every 20 ms, never sees them above the limit."""
    code = r"""
import json, subprocess, sys
child = r'''
import random, sys, time, torch
random.seed()
held, refused = [], 0
torch.empty(1, device="cuda")  # the context first (its ~0.5 GiB count too)
print("ready", flush=True)
sys.stdin.readline()  # then all start together
end = time.time() + 6
while time.time() < end:
    if held and random.random() < 0.4:
        held.pop(random.randrange(len(held)))
        torch.cuda.empty_cache()
    else:
        try:
            held.append(torch.empty(random.choice([64, 128, 256, 512]) << 20,
                                    dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            refused += 1
print(refused, flush=True)
'''
ps = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, text=True) for _ in range(16)]
for p in ps:
    assert p.stdout.readline().strip() == "ready"
for p in ps:
    p.stdin.write("go\n"); p.stdin.flush()
refused = [int(p.communicate()[0].split()[0]) for p in ps]
print(json.dumps({"refused": refused, "rcs": [p.returncode for p in ps]}))
"""
    limit = 12 * GiB
    res = hooked.run(code, limit, timeout=300)
    assert res.rc == 0, res.err
    out = res.json()
    assert out["rcs"] == [0] * 16
    assert sum(out["refused"]) > 0  # type: ignore[arg-type]  # the limit was reached
    assert res.nvml_peak <= limit, f"NVML saw {res.nvml_peak / GiB:.2f} GiB"
