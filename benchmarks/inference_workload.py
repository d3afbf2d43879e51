"""Inference-shaped GPU work for the compute benchmarks and tests/gpu: each
workload runs until killed and prints, every 0.25 s, one JSON line
{"t": wall time, "units": units done so far, "unit": what a unit is}.

Workloads (launch-bound inference shapes; PyTorch, random weights, nothing downloaded):
- chain:       batch-1 decode shape: 32 matvecs with 4096x4096 bf16 weights,
               launched one by one; a unit is one pass (a "token"), read
               back to the CPU as a decoder does;
- chain-graph: the same chain captured once as a CUDA graph and replayed;
- adds:        1M-element in-place adds, 1000 per synchronisation; a unit
               is one add;
- hf-b1, hf-b8: a Hugging Face transformers Llama decoder built from a
               config (random weights), greedy generation in eager mode at
               batch 1 or 8; a unit is a generated token (per sequence);
- hf-b1-graph, hf-b8-graph: the same decoder's greedy step captured once
               as a CUDA graph and replayed token after token: a forward over
               a fixed 48-token window (no KV cache, so every shape is
               static), the argmax at the last position written after it;
- phases:      the chain's shape, switching every 3 s between decode
               (the chain) and prefill (each matvec a 1024-column matmul,
               kernels ~15x longer, still launched one by one): how long a
               tenant whose kernels grow is charged at its old cost; a unit
               is one pass of either kind;
- gemm:        the GPU-bound neighbour: 8192x8192 bf16 matmuls, 8 per
               synchronisation; a unit is one matmul. Unlike vgpu-burn's
               clock-timed spin kernels, its units are work done, so they
               stay true when the GPU time-slices it with another context.

SIGUSR1 pauses a workload between two units (each ends in a synchronisation,
so nothing of it is left on the GPU) and the next resumes it; it reports its
progress at each pause and resume, marked "state": "paused" or "resumed". A
paused workload keeps its context, as an idle server does:
benchmarks/bench_hook_cost.py alternates tenants this way.

  python benchmarks/inference_workload.py WORKLOAD
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

REPORT_EVERY_S = 0.25


def chain_pass(columns: int) -> Callable[[], torch.Tensor]:
    """One pass of the decode chain over `columns` tokens at once: 32
    matmuls with 4096x4096 bf16 weights, launched one by one."""
    weights = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(32)]
    x = torch.randn(4096, columns, device="cuda", dtype=torch.bfloat16)

    def passes() -> torch.Tensor:
        y = x
        for w in weights:
            y = w @ y
        return y

    return passes


def chain(graph: bool) -> Callable[[], int]:
    passes = chain_pass(1)

    def token() -> int:
        passes()[0, 0].item()  # the CPU reads each token back, as a decoder does
        return 1

    if not graph:
        return token
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        passes()  # warm up outside the capture (cuBLAS picks its kernels)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = passes()

    def replay() -> int:
        g.replay()
        out[0, 0].item()
        return 1

    return replay


PHASE_S = 3.0
PREFILL_COLUMNS = 1024


def phases() -> Callable[[], int]:
    decode, prefill = chain_pass(1), chain_pass(PREFILL_COLUMNS)

    def one() -> int:
        in_prefill = int(time.monotonic() / PHASE_S) % 2
        (prefill if in_prefill else decode)()[0, 0].item()
        return 1

    return one


def adds() -> Callable[[], int]:
    a = torch.zeros(1 << 20, device="cuda")

    def thousand() -> int:
        for _ in range(1000):
            a.add_(1.0)
        torch.cuda.synchronize()
        return 1000

    return thousand


def decoder() -> tuple[Any, Any]:
    """The transformers Llama decoder of the hf-* workloads (random weights)
    and its config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval(), config


PROMPT = 32
NEW_TOKENS = 16  # a step of about 0.4 s natively in eager mode: several reports per window


def hf(batch: int) -> Callable[[], int]:
    model, config = decoder()
    prompt = torch.randint(0, config.vocab_size, (batch, PROMPT), device="cuda")

    def generate() -> int:
        with torch.no_grad():
            model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        return NEW_TOKENS

    return generate


def hf_graph(batch: int) -> Callable[[], int]:
    """Greedy decode with the step captured once as a CUDA graph and replayed
    token after token. The step is the decoder's forward over a fixed window
    of PROMPT + NEW_TOKENS tokens (no KV cache: every shape is static, and
    the causal mask keeps the tokens past the last one out of its logits),
    then the argmax at the last position written after it; the position
    lives on the GPU, so the graph moves it on by itself."""
    model, config = decoder()
    window = torch.randint(0, config.vocab_size, (batch, PROMPT + NEW_TOKENS), device="cuda")
    prompt = window[:, :PROMPT].clone()
    last = torch.tensor([PROMPT - 1], device="cuda")  # the last token's position

    def step() -> None:
        logits = model(input_ids=window, use_cache=False).logits
        token = logits.index_select(1, last).argmax(-1)
        window.index_copy_(1, last + 1, token)
        last.add_(1)

    def restart() -> None:
        window[:, :PROMPT].copy_(prompt)
        last.fill_(PROMPT - 1)

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up outside the capture
                restart()
                step()
        torch.cuda.current_stream().wait_stream(side)
        restart()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

    def generate() -> int:
        restart()
        for _ in range(NEW_TOKENS):
            graph.replay()
        window[0, -1].item()  # the CPU reads the tokens back, as a decoder does
        return NEW_TOKENS

    return generate


def gemm() -> Callable[[], int]:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)

    def eight() -> int:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        return 8

    return eight


WORKLOADS: dict[str, Callable[[], Callable[[], int]]] = {
    "chain": lambda: chain(graph=False),
    "chain-graph": lambda: chain(graph=True),
    "adds": adds,
    "hf-b1": lambda: hf(1),
    "hf-b8": lambda: hf(8),
    "hf-b1-graph": lambda: hf_graph(1),
    "hf-b8-graph": lambda: hf_graph(8),
    "phases": phases,
    "gemm": gemm,
}
UNITS = {name: "token" for name in WORKLOADS} | {"adds": "add", "gemm": "matmul", "phases": "pass"}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in WORKLOADS:
        print(f"usage: inference_workload.py {{{','.join(WORKLOADS)}}}", file=sys.stderr)
        return 2
    name = argv[0]
    step = WORKLOADS[name]()
    step()  # warm-up: kernels chosen, caches filled
    torch.cuda.synchronize()
    toggled = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: toggled.set())
    # Stopped through exit(), not by the signal: the hook's exit handlers
    # run (its last batches counted, its tally written: VGPU_BATCH_STATS).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    units, last = 0, 0.0

    def report(**state: str) -> None:
        nonlocal last
        last = time.time()
        print(json.dumps({"t": last, "units": units, "unit": UNITS[name], **state}), flush=True)

    while True:
        units += step()
        if toggled.is_set():
            toggled.clear()
            report(state="paused")  # the units done until now
            toggled.wait()
            toggled.clear()
            report(state="resumed")
        elif time.time() - last >= REPORT_EVERY_S:
            report()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
