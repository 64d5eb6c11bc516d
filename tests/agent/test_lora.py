"""A LoRA adapter's initialisation: reproducible from its seed, and invisible to the caller's random streams."""

from __future__ import annotations

import torch

from fedagent_flwr.agent.training.lora import adapter_to_arrays, attached_lora
from fedagent_flwr.config import LoRASection


def _initial_adapter(model, seed: int) -> dict[str, torch.Tensor]:
    with attached_lora(model, LoRASection(r=2, target_modules="q_proj,v_proj"), seed=seed) as peft_model:
        return adapter_to_arrays(peft_model).to_torch_state_dict()


def test_attaching_an_adapter_reseeds_no_device_generator(tiny_lm, monkeypatch):
    """Fed-SE seeds a client's exploration before it attaches the adapter. Seeding CUDA (or any accelerator) while
    attaching would put every client of every round on the stream `seed` starts, and fork_rng(devices=[]) restores
    only the CPU's: so no accelerator may be seeded at all, checked here without a GPU by spying on the calls."""
    seeded: list[str] = []
    for module, name in ((torch.cuda, "manual_seed_all"), (torch.cuda, "manual_seed"), (torch.mps, "manual_seed"),
                         (torch.xpu, "manual_seed_all"), (torch.mtia, "manual_seed_all")):
        monkeypatch.setattr(module, name, lambda seed, _n=f"{module.__name__}.{name}": seeded.append(_n))
    _initial_adapter(tiny_lm, seed=3)
    assert seeded == []


def test_attaching_an_adapter_leaves_the_cpu_stream_where_it_was(tiny_lm):
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    _initial_adapter(tiny_lm, seed=3)
    assert torch.equal(torch.rand(4), expected)


def test_the_initial_adapter_is_a_function_of_its_seed_alone(tiny_lm):
    torch.manual_seed(1)
    first = _initial_adapter(tiny_lm, seed=5)
    torch.manual_seed(2)  # a different caller state must not change it
    again = _initial_adapter(tiny_lm, seed=5)
    other = _initial_adapter(tiny_lm, seed=6)
    a_keys = [k for k in first if "lora_A" in k]
    assert a_keys and all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in a_keys)
    assert all(not first[k].any() for k in first if "lora_B" in k)  # B = 0: the run starts at the base model
