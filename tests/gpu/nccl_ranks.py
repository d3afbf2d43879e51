"""Two torch.distributed ranks (NCCL) on GPUs 0 and 1, started the way
torchrun starts them, natively or inside a vGPU over both GPUs.

Shared by tests/gpu/test_multi_gpu.py and benchmarks/bench_multi_gpu.py.
The vGPU's blocks are made as the daemon makes them (vgpud.vgpus.blocks), with
the daemon's GPU turn broker running in this process, so no daemon is
needed. NCCL_NVLS_ENABLE=0 is always set: NVLink multicast memory is not
accounted, and the hook refuses cuMulticastCreate in a limited process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "build" / "libvgpu.so"
RANKS = 2
FULL = 100  # a share of 100: no compute limit

# One rank. argv: MODE ARGS...; prints one JSON line.
#   allreduce SIZES ITERS: all-reduce and all-gather correctness, then the
#     bus bandwidth of an all-reduce of each size (bytes, comma list), and
#     what the hook charged this rank's GPU against what NVML says this
#     process holds there (when VGPU_USAGE names a usage block).
#   generate MODEL_DIR TOKENS: greedy generation with the model split over
#     the ranks (transformers' tensor parallelism, tp_plan="auto").
RANK_PROGRAM = r"""
import json, os, sys, time
import torch, torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
out = {"rank": rank}
mode = sys.argv[1]
if mode == "allreduce":
    sizes, iters = [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    x = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(x)
    out["allreduce_ok"] = bool((x == world * (world + 1) / 2).all())
    parts = [torch.empty(1024, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.full((1024,), float(rank), device=device))
    out["allgather_ok"] = all(bool((p == i).all()) for i, p in enumerate(parts))
    out["bandwidth"] = []
    for size in sizes:
        t = torch.ones(size // 4, device=device)
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / iters
        # nccl-tests' bus bandwidth of an all-reduce: algbw * 2 (n - 1) / n
        out["bandwidth"].append({"bytes": size, "seconds": seconds,
                                 "busbw": size / seconds * 2 * (world - 1) / world})
    if os.environ.get("VGPU_USAGE"):
        import pynvml
        sys.path.insert(0, os.environ["VGPUD_ROOT"])
        from vgpud.vgpus.blocks import UsageBlock
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ["NVML_INDEX"]))
        out["nvml_used"] = sum(p.usedGpuMemory or 0
                               for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                               if p.pid == os.getpid())
        usage = UsageBlock.open(os.environ["VGPU_USAGE"], device_count=world)
        out["hooked_used"] = usage.devices()[rank].used
        usage.close()
elif mode == "generate":
    from transformers import AutoModelForCausalLM
    tokens = int(sys.argv[3])
    model = AutoModelForCausalLM.from_pretrained(
        sys.argv[2], tp_plan="auto", torch_dtype=torch.bfloat16)
    prompt = torch.arange(1, 17, device=device).unsqueeze(0)
    t0 = time.perf_counter()
    ids = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    torch.cuda.synchronize()
    out.update(tokens=ids[0].tolist(), seconds=time.perf_counter() - t0)
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out), flush=True)
"""

# A small Llama with random weights, saved where the ranks can load it.
MAKE_MODEL = r"""
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                     num_attention_heads=16, num_key_value_heads=8, vocab_size=32000)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
"""


def gpu_uuids() -> list[str]:
    """The node's GPUs by NVML index (the real NVML, from this process)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [
            pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    """Both GPUs, by UUID as a vGPU recipe names them; NVLS always off."""
    uuids = gpu_uuids()[:RANKS]
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(uuids),
        NCCL_NVLS_ENABLE="0",
        PYTHONUNBUFFERED="1",
        MASTER_ADDR="127.0.0.1",
        WORLD_SIZE=str(RANKS),
        VGPUD_ROOT=str(ROOT),
    )
    return env


@contextmanager
def vgpu(tmp: Path, shares: Sequence[int], memory: int) -> Iterator[dict[str, str]]:
    """A vGPU over GPUs 0 and 1 with `memory` bytes and shares[i] % on GPU
    i, its GPUs entered in a turn broker; yields the env of its processes."""
    from tests.helpers.vgpus import BrokeredVgpus

    vgpus = BrokeredVgpus(tmp)
    try:
        shares_by_gpu = dict(zip(gpu_uuids()[:RANKS], shares, strict=True))
        yield {"LD_PRELOAD": str(HOOK), **vgpus.make("multi-gpu", shares_by_gpu, memory)}
    finally:
        vgpus.close()


def run_ranks(
    args: Sequence[str], extra_env: dict[str, str] | None = None, timeout: float = 600
) -> list[dict[str, Any]]:
    """Run RANK_PROGRAM on both ranks; their JSON answers, by rank. Raises
    with both ranks' stderr if one fails or the pair does not finish (a
    deadlock ends in the timeout)."""
    env = {**base_env(), "MASTER_PORT": str(free_port()), **(extra_env or {})}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_PROGRAM, *args],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "NVML_INDEX": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(RANKS)
    ]
    outs: list[tuple[str, str]] = []
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        detail = "\n".join(
            f"rank {r} rc {p.returncode}:\n{outs[r][1][-3000:]}" for r, p in enumerate(procs)
        )
        raise RuntimeError(f"a rank failed\n{detail}")
    answers = []
    for out, err in outs:
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"a rank printed no answer:\n{err[-3000:]}")
        answers.append(json.loads(lines[-1]))
    return answers


def make_model(directory: Path) -> Path:
    """A random-weight Llama saved in `directory` (CPU, no hook)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    subprocess.run(
        [sys.executable, "-c", MAKE_MODEL, str(directory)], env=env, check=True, timeout=600
    )
    return directory
