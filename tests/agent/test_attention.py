"""The passes whose shapes change from call to call keep cuDNN's attention out on a GPU (agent/engine/attention.py): on an
H100 cuDNN built a plan per new micro-batch shape, and the update ran 2.6x slower with it (docs/gpu.md)."""

import torch

from fedagent_flwr.agent.engine import attention
from fedagent_flwr.agent.engine.attention import variable_shape_attention


def _backends() -> tuple[bool, bool, bool, bool]:
    b = torch.backends.cuda
    return b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()


def test_on_cuda_the_context_drops_cudnn_alone_and_restores_it(monkeypatch):
    before = _backends()
    assert before == (True, True, True, True)  # torch's defaults
    with variable_shape_attention(torch.device("cuda")):
        assert _backends() == (False, True, True, True)
    assert _backends() == before
    with variable_shape_attention(torch.device("cpu")):  # no cuDNN attention on a CPU: nothing changes
        assert _backends() == before
    monkeypatch.setattr(attention, "AVOID_CUDNN", False)  # the benchmarks' switch, to measure cuDNN against it
    with variable_shape_attention(torch.device("cuda")):
        assert _backends() == before


def test_the_training_passes_the_prefill_and_the_hf_loop_run_inside_it(tiny_lm, maze_tokenizer, monkeypatch):
    """Each pass enters the context with the model's device: the log-prob and update passes (both log-prob paths),
    the static engine's prefill (not its token steps, whose shapes repeat) and the transformers loop."""
    import contextlib

    from fedagent_flwr.agent.engine import decode, sampling, tokens
    from fedagent_flwr.agent.engine.decode import StaticDecoder

    entered: list[str] = []

    @contextlib.contextmanager
    def recording(device):
        entered.append(device.type)
        yield

    for module in (tokens, decode, sampling):
        monkeypatch.setattr(module, "variable_shape_attention", recording)
    batch = tokens.collate([([5, 6, 7], [8, 9]), ([5, 6], [7])], maze_tokenizer.pad_token_id)
    tokens.completion_logprobs(tiny_lm, batch)
    tokens.completion_logprobs(tiny_lm, batch, chunk_tokens=2)
    assert entered == ["cpu", "cpu"]
    decoder = StaticDecoder(tiny_lm)
    decoder.start([[5, 6, 7], [5, 6]], maze_tokenizer.pad_token_id, 3)
    assert entered == ["cpu"] * 3
    decoder.step(torch.tensor([8, 9]))
    assert entered == ["cpu"] * 3  # a token step: the shapes a CUDA graph replays, cuDNN's plan is built once
    sampling.hf_sample_batch(tiny_lm, [[5, 6, 7]], maze_tokenizer.pad_token_id, [], 2, 1.0)
    assert entered == ["cpu"] * 4
