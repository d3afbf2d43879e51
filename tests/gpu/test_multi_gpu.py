"""vGPUs over two GPUs on a real node: NCCL, torch.distributed and
tensor parallelism under the hook, and memory shared between processes.

Written on 2026-11-24 and NOT YET RUN: no two-GPU machine was lent that
session. Run on a node with two GPUs (the `device` tool's nvidia-h200-x2):

    make lib tools && GPU_PYTHON=python3 make test-gpu   # or:
    python3 -m pytest tests/gpu/test_multi_gpu.py -v

Needs torch with NCCL (and transformers for the tensor-parallel test).
Tests that need two GPUs skip on fewer; NCCL_NVLS_ENABLE=0 is always set
(tests/gpu/nccl_ranks.py). Each rank sees both GPUs by UUID and drives
GPU `rank`, as torchrun's ranks do; the vGPU spans both, with a share per
GPU. Utilization is read from outside through NVML.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, probe
from tests.helpers.memprobe import hooked as with_hook

from .conftest import GiB, Hooked, MiB
from .nccl_ranks import FULL, RANKS, gpu_uuids, make_model, run_ranks, vgpu

TOLERANCE = 5.0  # points of a GPU
SLACK = 64 * MiB  # NVML's figure may run ahead of the hook's by rounding
SIZES = [1 << 20, 64 << 20, 256 << 20, 1 << 30]


def _gpus() -> int:
    try:
        return len(gpu_uuids())
    except Exception:  # no NVML here: conftest skips everything anyway
        return 0


def _nccl() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch.distributed

    return bool(torch.distributed.is_nccl_available())


two_gpus = pytest.mark.skipif(
    _gpus() < RANKS or not _nccl(), reason="needs 2 GPUs and torch with NCCL"
)


class Utilization(threading.Thread):
    """NVML device utilization of GPUs 0 and 1, sampled every 0.1 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[list[int]] = [[] for _ in range(RANKS)]
        self._done = threading.Event()

    def run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(RANKS)]
        while not self._done.wait(0.1):
            for i, h in enumerate(handles):
                self.samples[i].append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)

    def means(self) -> list[float]:
        """Per GPU, the mean of the samples after the first second (start-up)."""
        return [statistics.fmean(s[10:]) if len(s) > 10 else 0.0 for s in self.samples]

    def __enter__(self) -> Utilization:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join(5)


@two_gpus
@pytest.mark.parametrize("shares", [(30, 60), (FULL, FULL)], ids=["shares-30-60", "no-limit"])
def test_collectives_are_correct_counted_and_paced_per_gpu(
    tmp_path: Path, shares: tuple[int, int]
) -> None:
    with vgpu(tmp_path, shares, 40 * GiB) as env, Utilization() as util:
        ranks = run_ranks(["allreduce", ",".join(map(str, SIZES)), "50"], env)
    for r in ranks:
        assert r["allreduce_ok"] and r["allgather_ok"], r
        # Everything NCCL and torch hold on the rank's GPU (NCCL's buffers
        # through cuMem* VMM included) is charged to that GPU's slice.
        assert r["hooked_used"] >= r["nvml_used"] - SLACK, r
    for gpu, (share, got) in enumerate(zip(shares, util.means(), strict=True)):
        if share < FULL:  # a rank waiting on its peer never pushes a GPU over its share
            assert got <= share + TOLERANCE, f"GPU{gpu} at {got:.1f} % for share {share}"


def busbw(answers: list[dict[str, object]], size: int) -> float:
    """Rank 0's all-reduce bus bandwidth at one size (bytes/s)."""
    rows = answers[0]["bandwidth"]
    assert isinstance(rows, list)
    return float(next(row["busbw"] for row in rows if row["bytes"] == size))


@two_gpus
def test_all_reduce_bandwidth_without_a_compute_limit_is_95_percent_of_native(
    tmp_path: Path,
) -> None:
    """Native and hooked runs alternate, 3 rounds; medians compared for the
    large messages, where NCCL is bandwidth-bound."""
    args = ["allreduce", ",".join(map(str, SIZES)), "50"]
    native: list[list[dict[str, object]]] = []
    under_hook: list[list[dict[str, object]]] = []
    for n in range(3):
        native.append(run_ranks(args))
        with vgpu(tmp_path / f"round{n}", (FULL, FULL), 40 * GiB) as env:
            under_hook.append(run_ranks(args, env))
    for size in SIZES[2:]:
        base = statistics.median(busbw(a, size) for a in native)
        got = statistics.median(busbw(a, size) for a in under_hook)
        assert got >= 0.95 * base, f"{size} bytes: {got / 1e9:.1f} GB/s vs native {base / 1e9:.1f}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers")
    yield make_model(tmp_path_factory.mktemp("llama"))


@two_gpus
def test_tensor_parallel_generation_at_share_50(tmp_path: Path, model_dir: Path) -> None:
    """A model split over both GPUs (random weights) generates the same
    tokens in a vGPU at share 50 on each GPU as natively, and neither GPU
    passes its share."""
    args = ["generate", str(model_dir), "64"]
    native = run_ranks(args)
    with vgpu(tmp_path, (50, 50), 40 * GiB) as env, Utilization() as util:
        paced = run_ranks(args, env)
    assert paced[0]["tokens"] == paced[1]["tokens"] == native[0]["tokens"]
    assert len(paced[0]["tokens"]) == 16 + 64
    for gpu, got in enumerate(util.means()):
        assert got <= 50 + TOLERANCE, f"GPU{gpu} at {got:.1f} %"


def test_the_hook_never_hands_out_nvlink_multicast(hooked: Hooked) -> None:
    """cuMulticastCreate in a limited process: refused by the hook, before
    the driver (NCCL's NVLS would bind memory the hook does not count)."""
    code = r"""
import ctypes, json
class Prop(ctypes.Structure):
    _fields_ = [("numDevices", ctypes.c_uint), ("size", ctypes.c_size_t),
                ("handleTypes", ctypes.c_ulonglong), ("flags", ctypes.c_ulonglong)]
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
handle = ctypes.c_ulonglong()
prop = Prop(1, 2 << 20, 1, 0)
print(json.dumps({"rc": cu.cuMulticastCreate(ctypes.byref(handle), ctypes.byref(prop))}))
"""
    result = hooked.run(code, limit=4 * GiB)
    assert result.json()["rc"] == 801, result.err  # CUDA_ERROR_NOT_SUPPORTED
    assert "cuMulticastCreate refused" in result.err


def test_ipc_memory_is_charged_once_to_its_exporter(tmp_path: Path) -> None:
    """On one real GPU: an IPC allocation opened by a process of another
    vGPU is not charged there, even after the importer's overhead is
    measured again (a new context: NVML's figure for the importer minus what
    it tracks); the exporter's charge outlives its free. Also says what
    NVML shows for each process, which docs/hook.md wants to know."""

    def env(name: str) -> dict[str, str]:
        return with_hook(dict(os.environ), CUDA_MEM_LIMIT="4g", VGPU_USAGE=str(tmp_path / name))

    from vgpud.vgpus.blocks import UsageBlock

    def used(name: str) -> int:
        usage = UsageBlock.open(tmp_path / name)
        try:
            return usage.devices()[0].used
        finally:
            usage.close()

    exporter = InteractiveProbe(
        env("a"), ["alloc:alloc:1g", "fill:7", "ipc-export", "wait", "free", "nvml", "wait"]
    )
    try:
        lines = exporter.until_wait()
        handle = next(line for line in lines if line["op"] == "ipc-export")["handle"]
        importer = probe(env("b"), f"ipc-open:{handle}", "ctx:cuCtxCreate_v2", "nvml")
        assert importer.ops("ipc-open")[0]["first"] == 7, importer.stderr
        nvml = importer.ops("nvml")[0]
        assert used("b") < 1 * GiB, f"the importer was charged: NVML said {nvml}"
        assert used("a") >= 1 * GiB
        exporter.resume()
        exporter.until_wait()
        assert used("a") >= 1 * GiB  # held past its free while the exporter lives
    finally:
        exporter.resume()
        exporter.finish()
