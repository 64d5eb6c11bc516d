"""What each rank of the multi-rank tests runs (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import torch
import torch.distributed as dist


def tiny_model(lora: bool, tied: bool = False):
    """A 2-layer Qwen2-shaped model over the maze tokenizer's vocabulary, the same weights in every process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import build_maze_tokenizer

    tokenizer = build_maze_tokenizer()
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  max_position_embeddings=512, tie_word_embeddings=tied,
                                  pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights="gaussian"))
    return model, tokenizer


def samples(vocab: int, count: int = 13):
    from fedagent_flwr.agent.training.advantages import StepSample

    rng = np.random.default_rng(5)
    return [StepSample(rng.integers(3, vocab, size=int(rng.integers(3, 20))).tolist(),
                       rng.integers(3, vocab, size=int(rng.integers(1, 9))).tolist(), float(rng.normal()),
                       float(rng.uniform(0.2, 1.0))) for _ in range(count)]


def update(lora: bool, settings: dict, out: str, rank: int = 0, world: int = 1, rendezvous: str = "") -> None:
    """One GRPOTrainer.update of the same samples: on one rank, or on `world` spawned ranks under FSDP2 (gloo, meeting
    at the file `rendezvous` as the launcher's ranks do). Rank 0 writes the full trained weights (and the update's
    statistics) to `out`."""
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    torch.set_num_threads(1)

    from fedagent_flwr.agent.play.rollout import RolloutConfig
    from fedagent_flwr.config import RunConfig
    from placed import grpo_trainer

    from fedagent_flwr.agent.fsdp.ranks import shard
    from copy import deepcopy

    from fedagent_flwr.agent.models.loading import frozen

    model, tokenizer = tiny_model(lora, tied=settings.get("tied", False))
    settings = {k: v for k, v in settings.items() if k != "tied"}
    base = frozen(deepcopy(model)) if not lora and settings.get("grpo.kl-reference") == "base" else None
    if world > 1:
        model = shard(model)
        base = shard(base) if base is not None else None
    cfg = RunConfig.from_run_config({"device": "cpu", "grpo.learning-rate": 1e-2, "grpo.tasks-per-epoch": 1, **settings})
    stats = grpo_trainer(model, tokenizer, cfg, RolloutConfig(history_length=0), base_model=base).update(
        samples(len(tokenizer)), np.random.default_rng(0))
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"weights": full, "stats": stats}, out)
    if world > 1:
        from fedagent_flwr.agent.fsdp.launch import end_rank

        dist.barrier()  # rank 0 has written
        end_rank()


# Targets of agent/fsdp/launch.run_ranks: target(rank, world, tensors, *args) -> (tensors, info) on rank 0.

def echo(rank: int, world: int, tensors: dict, scale: float):
    """Every rank adds its rank to the input; rank 0 returns the sum over ranks, scaled."""
    mine = torch.from_numpy(tensors["x"].copy()) + rank
    dist.all_reduce(mine)
    return {"y": (mine * scale).numpy()}, {"world": world, "pid": os.getpid()}


def say_hello(rank: int, world: int, tensors: dict):
    """Each rank prints a line (a rank's progress lines, as a round prints them) and answers with its pid."""
    print(f"rank {rank} of {world} says hello", flush=True)
    dist.barrier()
    return {}, {"pid": os.getpid()}


def mixed_collectives(rank: int, world: int, tensors: dict):
    """On the `cpu:gloo,cuda:nccl` group: a CPU all_reduce and an all_gather_object (gloo), a CUDA all_reduce (NCCL)."""
    from fedagent_flwr.agent.fsdp.launch import rank_device

    device = rank_device(torch.device("cuda"), rank)
    on_cpu, on_gpu = torch.tensor([rank + 1.0]), torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(on_cpu)
    dist.all_reduce(on_gpu)
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    return {}, {"cpu_sum": float(on_cpu), "cuda_sum": float(on_gpu.cpu()), "objects": objects}


def fail_on_rank_1(rank: int, world: int, tensors: dict, pid_dir: str):
    _write_pid(pid_dir, rank)
    if rank == 1:
        raise ValueError("rank 1 cannot read its shard")
    dist.barrier()  # rank 0 would wait here for ever without the launcher
    return {}, {}


def killed_on_rank_1(rank: int, world: int, tensors: dict, pid_dir: str):
    import signal

    _write_pid(pid_dir, rank)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return {}, {}


def wait_forever(rank: int, world: int, tensors: dict, pid_dir: str):
    """Each rank waits for a message the other never sends: blocked inside gloo, where no Python signal handler runs."""
    _write_pid(pid_dir, rank)
    dist.recv(torch.zeros(1), src=1 - rank)


def _write_pid(pid_dir: str, rank: int) -> None:
    from pathlib import Path

    Path(pid_dir, f"rank-{rank}.pid").write_text(str(os.getpid()))


_ROUNDS_SEEN: list[int] = []  # in a rank's process: what a kept rank remembers between rounds


def count_rounds(rank: int, world: int, tensors: dict, fail_at: int = 0):
    """Each rank counts the rounds its process has answered (1 in a new process); rank 1 raises at round `fail_at`."""
    _ROUNDS_SEEN.append(len(_ROUNDS_SEEN) + 1)
    if rank == 1 and _ROUNDS_SEEN[-1] == fail_at:
        raise ValueError(f"rank 1 fails at round {fail_at}")
    seen = torch.tensor([float(_ROUNDS_SEEN[-1])])
    dist.all_reduce(seen)
    return {"x": tensors["x"] + 1}, {"rounds": float(seen) / world, "pid": os.getpid()}


def held_state(rank: int, world: int, tensors: dict):
    """What a kept rank holds between rounds (methods/ranked_round.py): its KL anchor's whole weights, how many of its
    model's parameters still hold a gradient, and how many whole weights each rank keeps when the model is read out."""
    from fedagent_flwr.agent.training.lora import adapter_to_arrays
    from fedagent_flwr.agent.training.weights import model_to_arrays
    from fedagent_flwr.methods import ranked_round

    from fedagent_flwr.agent.fsdp.ranks import Ranks

    held = ranked_round._HELD[0]
    anchor = {} if held.base is None else {k: v.numpy() for k, v in model_to_arrays(held.base).items()}
    read = adapter_to_arrays if hasattr(held.model, "peft_config") else model_to_arrays  # what the round replies
    kept = Ranks.current().gather({str(rank): len(read(held.model).keys())})  # whole weights, by rank
    return anchor, {"grads": sum(p.grad is not None for p in held.model.parameters()), "kept": kept}


def sharded_load(rank: int, world: int, tensors: dict, source: str, dtype: str, lora: bool, whole_load_fails: bool = False):
    """The model folder or cached hub id `source` loaded sharded (agent/models/sharded_load.py), a LoRA adapter attached
    first where `lora`: rank 0 returns every base weight and buffer gathered whole (as float32); each rank says how many
    bytes of weights it holds itself. `whole_load_fails`: a load of the whole model on a rank raises."""
    from fedagent_flwr.agent.fsdp.ranks import Ranks, whole
    from fedagent_flwr.agent.models import sharded_load as module
    from fedagent_flwr.agent.models.sharded_load import load_sharded
    from fedagent_flwr.agent.models.pretrained import ModelSpec

    if whole_load_fails:
        def loaded_whole(spec, *args, **kwargs):
            raise AssertionError(f"rank {rank} loaded {spec.source} whole")

        module.load_model = loaded_whole

    wrap = None
    if lora:
        from peft import LoraConfig, get_peft_model

        wrap = lambda m: get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model = load_sharded(ModelSpec(source, built_here=True), torch.device("cpu"), getattr(torch, dtype), wrap)
    inner = model.get_base_model() if lora else model
    out = {}
    for name, t in list(inner.state_dict().items()) + list(inner.named_buffers()):
        if ".lora_" not in name:
            out[name.replace(".base_layer.", ".")] = whole(t).detach().float().numpy()
    held = sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in model.parameters())
    everyone = Ranks(rank, world).gather({str(rank): held})
    return (out if rank == 0 else {}), {"held": everyone, "adapter": sum(".lora_" in n for n, _ in model.named_parameters())}


@contextlib.contextmanager
def counted_gathers(peaks: list):
    """Inside: the most weight bytes FSDP2 holds gathered at once on this rank kept in peaks[-1] (append a 0 to start
    another count), by wrapping its param groups' moves between sharded and unsharded."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    gathered = set()

    def size(group) -> int:
        return sum(fp.sharded_param.numel() * fp.sharded_param.element_size() for fp in group.fsdp_params)

    originals = {name: getattr(FSDPParamGroup, name) for name in ("_to_unsharded", "_to_sharded", "_to_sharded_post_forward")}

    def moved(name, into):
        def wrapper(group):
            (gathered.add if into else gathered.discard)(group)
            peaks[-1] = max(peaks[-1], sum(size(g) for g in gathered))
            return originals[name](group)
        return wrapper

    for name in originals:
        setattr(FSDPParamGroup, name, moved(name, name == "_to_unsharded"))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(FSDPParamGroup, name, fn)


def pass_gathers(rank: int, world: int, tensors: dict, lora: bool):
    """The most weight bytes FSDP2 holds gathered at once on this rank, through a no-grad log-prob pass and then a
    training pass with its backward, on the tiny model sharded (agent/fsdp/ranks.py); rank 0 returns them with the
    plan's pass_gathers."""
    from fedagent_flwr.agent.engine.memory import ModelShape, pass_gathers as planned
    from fedagent_flwr.agent.engine.tokens import collate, completion_logprobs
    from fedagent_flwr.agent.fsdp.ranks import shard

    model, _ = tiny_model(lora)
    inner = model.get_base_model() if lora else model
    adapter = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    shape = ModelShape.of(inner.config)
    shard(model, torch.device("cpu"))
    peaks = []
    with counted_gathers(peaks):
        batch = collate([(list(range(3, 23)), list(range(3, 13))) for _ in range(2)], 0)
        peaks.append(0)
        with torch.no_grad():
            completion_logprobs(model, batch, 1.0, 0)
        peaks.append(0)
        logprobs, mask = completion_logprobs(model, batch, 1.0, 0)
        (logprobs * mask).sum().backward()
    return {}, {"peaks": peaks, "planned": planned(shape, shape.parameters * 4, adapter)}


def _decoder_tensors(d) -> list:
    layers = [v for layer in d.layers for v in layer.values() if isinstance(v, torch.Tensor)]
    return [d.embed, d.head, d.norm, d.inv_freq, *layers]


def static_copy(rank: int, world: int, tensors: dict, lora: bool, tied: bool):
    """The static decoder of the tiny model sharded on `world` ranks, its bf16 copy built one FSDP unit gathered at a
    time (decode.pinned, as a rank's rollout builds it), against the decoder of the same model whole in one process:
    whether the copies are equal bit for bit and a prefill's logits too, the most weight bytes gathered at once, and
    the plan's row for it (memory.decode_gathers) beside the whole model's bytes."""
    from copy import deepcopy

    from fedagent_flwr.agent.engine.decode import StaticDecoder, decoder_for, pinned
    from fedagent_flwr.agent.engine.memory import ModelShape, decode_gathers
    from fedagent_flwr.agent.fsdp.ranks import gathered, shard

    model, tokenizer = tiny_model(lora, tied)
    inner = model.get_base_model() if lora else model
    adapter = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    shape = ModelShape.of(inner.config)
    expected = StaticDecoder(deepcopy(model), torch.bfloat16, cuda_graphs=False)
    shard(model, torch.device("cpu"))
    prompts = [list(range(3, 15)), list(range(5, 12))]
    peaks = [0]
    with counted_gathers(peaks), pinned(model, torch.bfloat16, cuda_graphs=False, gathered=gathered):
        built = peaks[-1]
        d = decoder_for(model, torch.bfloat16, cuda_graphs=False)  # inside: the pinned decoder, nothing gathered
        logits = d.start(prompts, tokenizer.pad_token_id, 4)
    return {}, {"peak": built, "after": peaks[-1],
                "same_weights": all(torch.equal(a, b) for a, b in zip(_decoder_tensors(d), _decoder_tensors(expected))),
                "tensors": len(_decoder_tensors(d)),
                "same_logits": torch.equal(logits, expected.start(prompts, tokenizer.pad_token_id, 4)),
                "planned": decode_gathers(shape, shape.parameters * 4, adapter, True)[1],
                "whole": decode_gathers(shape, shape.parameters * 4, adapter, False)[1]}


_HELD_BLOCKS: list = []  # a LoRA adapter block each rank keeps open, as methods/ranked_round.py's ranks do


def fail_holding_lora(rank: int, world: int, tensors: dict):
    """Every rank attaches a LoRA adapter for its life (the block left open), then fails."""
    import contextlib

    from fedagent_flwr.agent.training.lora import attached_lora
    from fedagent_flwr.config import LoRASection

    block = contextlib.ExitStack()
    block.enter_context(attached_lora(tiny_model(lora=False)[0], LoRASection(r=2, target_modules="q_proj")))
    _HELD_BLOCKS.append(block)
    raise ValueError(f"rank {rank} fails holding an adapter")


def freed_blocks_held_mib() -> float:
    """MiB still resident after 39 of 40 blocks of 2 MiB are freed, the newest alive. After a first such block is
    mapped and freed, glibc's own threshold rises to it and serves the rest from its heap, which cannot shrink below
    the live block on top: what the others freed stays resident unless blocks are mapped on their own."""
    def rss() -> float:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) / 1024

    first = torch.ones(1 << 19)
    del first
    before = rss()
    blocks = [torch.ones(1 << 19) for _ in range(40)]
    del blocks[:-1]
    return rss() - before


def freed_blocks_held(rank: int, world: int, tensors: dict):
    """freed_blocks_held_mib on every rank; the largest, on rank 0."""
    held = torch.tensor([freed_blocks_held_mib()])
    dist.all_reduce(held, op=dist.ReduceOp.MAX)
    return {}, {"held_mib": float(held)}
