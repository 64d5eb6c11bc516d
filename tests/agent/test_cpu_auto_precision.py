"""precision = 'auto' on a CPU: decided from this processor's measured fp32 and bf16 matmul rates (issue 93).

The decisions run against a mocked probe (MatmulRates made up here), so they hold on any processor; the probe itself
is checked for what it returns and how it is cached, never for how fast it is."""

import json
from dataclasses import replace

import pytest
import torch

from fedagent_flwr.agent.engine import cpu_rates
from fedagent_flwr.agent.engine.cpu_rates import MatmulRates, Processor, cached_rates, this_processor
from fedagent_flwr.agent.engine.placement import Machine, place, resolve_precision
from fedagent_flwr.config import RunConfig
from fedagent_flwr.methods import placement as run_placement

CPU = Machine(cuda=False)


def rates(bf16: float, fp32: float = 100.0) -> MatmulRates:
    return MatmulRates(fp32=fp32, bf16=bf16, rows=2048, hidden=576, intermediate=1536, threads=1,
                       processor="Test CPU (avx2)", seconds=0.1)


AMX, AVX2 = rates(bf16=700.0), rates(bf16=1.2, fp32=130.0)  # issue 93's figures: a Xeon with AMX, an EPYC with AVX2


def test_auto_takes_bf16_base_only_where_bf16_is_clearly_faster_and_an_adapter_alone_trains():
    assert resolve_precision("auto", False, adapter_only=True, cpu_rates=AMX)[0] == "bf16-base"
    assert resolve_precision("auto", False, adapter_only=True, cpu_rates=AVX2)[0] == "fp32"
    assert resolve_precision("auto", False, adapter_only=True, cpu_rates=rates(bf16=120.0))[0] == "fp32"  # 1.2x: not clearly
    assert resolve_precision("auto", False, adapter_only=True, cpu_rates=rates(bf16=125.0))[0] == "bf16-base"
    assert resolve_precision("auto", False, adapter_only=False, cpu_rates=AMX)[0] == "fp32"  # full weights train
    assert resolve_precision("auto", True, adapter_only=True, cpu_rates=AMX)[0] == "bf16-mixed"  # CUDA: as before


def test_a_precision_the_user_set_is_kept_and_warned_about_where_it_runs_over_2x_slower():
    kept, why = resolve_precision("bf16-base", False, adapter_only=True, cpu_rates=AVX2)
    assert kept == "bf16-base" and "WARNING" in why and "108.3x slower" in why and "fp32" in why
    kept, why = resolve_precision("fp32", False, adapter_only=True, cpu_rates=AMX)
    assert kept == "fp32" and "WARNING" in why and "7.0x slower" in why and "bf16-base" in why
    kept, why = resolve_precision("fp32", False, adapter_only=True, cpu_rates=rates(bf16=190.0))  # 1.9x: no warning
    assert kept == "fp32" and "WARNING" not in why


def test_the_start_up_line_gives_the_choice_and_both_rates():
    line = place(precision="auto", machine=CPU, adapter_only=True, cpu_rates=AMX).summary()
    assert "precision bf16-base (auto: bf16 is faster here, bf16 700.0 GFLOP/s against fp32 100.0 (7.00x)" in line
    assert "Test CPU (avx2), 2048x576x1536 on 1 thread" in line
    assert "precision fp32 (auto: bf16 is not 1.25x faster here, bf16 1.2 GFLOP/s against fp32 130.0" in place(
        precision="auto", machine=CPU, adapter_only=True, cpu_rates=AVX2).summary()


@pytest.fixture()
def probe(monkeypatch):
    """A mocked probe for methods/placement.py: the rates it answers, and the shapes it was asked for."""
    asked = []
    state = {"rates": AMX}

    def fake(cfg, shape=None):
        asked.append(cfg.model)
        return state["rates"]

    monkeypatch.setattr(run_placement, "run_cpu_rates", fake)
    return state, asked


def lora_run(**kw) -> RunConfig:
    return RunConfig.from_run_config({"device": "cpu", "grpo.finetuning": "lora", "strategy": "fedagent-avg"} | kw)


def test_a_lora_run_resolves_by_the_probe_and_loads_its_base_to_match(probe):
    state, asked = probe
    client = run_placement.place_run(lora_run(), "client")
    assert client.precision == "bf16-base" and "700.0 GFLOP/s" in client.precision_note
    assert run_placement.place_run(lora_run(), "server").precision == "bf16-base"  # the server holds the clients' base
    assert run_placement.run_base_dtype(lora_run()) == torch.bfloat16
    state["rates"] = AVX2
    assert run_placement.place_run(lora_run(), "client").precision == "fp32"
    assert run_placement.place_run(lora_run(), "server").precision == "fp32"
    assert run_placement.run_base_dtype(lora_run()) == torch.float32
    assert run_placement.place_run(lora_run(precision="bf16-base"), "client").precision == "bf16-base"  # kept
    assert "WARNING" in run_placement.place_run(lora_run(precision="bf16-base"), "client").precision_note
    assert asked


def test_a_full_fine_tune_under_auto_measures_nothing_and_stays_fp32(probe):
    """The tiny default job (grpo.finetuning='full', precision='auto'): fp32 as before, no probe asked."""
    _, asked = probe
    cfg = RunConfig(device="cpu")
    assert cfg.grpo.finetuning == "full" and run_placement.place_run(cfg, "client").precision == "fp32"
    assert run_placement.run_base_dtype(cfg) == torch.float32
    assert not asked


def test_a_server_on_cpu_holds_an_fp32_base_where_the_clients_run_on_cuda(probe):
    cuda = Machine(cuda=True)
    cfg = lora_run(**{"engine.server-device": "cpu", "device": "auto"})
    assert run_placement.place_run(cfg, "client", cuda).precision == "bf16-mixed"
    assert run_placement.place_run(cfg, "server", cuda).precision == "fp32"  # not bf16-base: the clients' base is fp32
    assert run_placement.run_base_dtype(cfg, cuda) == torch.float32


def test_under_device_auto_the_processor_does_not_decide(probe):
    """device='auto' on a machine without a GPU: the server cannot know whether a deployment's clients have GPUs
    (whose base is fp32), so auto stays fp32, as before the probe; device='cpu' states it and lets the probe decide."""
    _, asked = probe
    cfg = lora_run(device="auto")
    assert run_placement.place_run(cfg, "client", CPU).precision == "fp32"
    assert run_placement.place_run(cfg, "server", CPU).precision == "fp32"
    assert run_placement.run_base_dtype(cfg, CPU) == torch.float32 and not asked
    assert run_placement.place_run(lora_run(device="cpu"), "client", CPU).precision == "bf16-base"


def test_this_processor_reads_its_name_and_bf16_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC Test\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 xsave\n")
    assert this_processor(info) == Processor("AMD EPYC Test", "avx512_bf16 avx512f avx2")


def test_the_probe_measures_once_per_processor_and_shape_and_every_process_takes_the_first(tmp_path, monkeypatch):
    measured = []

    def fake_measure(hidden, intermediate, processor=None, max_rows=2048):
        measured.append((hidden, intermediate))
        return replace(AMX, hidden=hidden, intermediate=intermediate, fp32=100.0 + len(measured))

    monkeypatch.setattr(cpu_rates, "measure", fake_measure)
    amd, amx = Processor("AMD EPYC", "avx2"), Processor("Xeon", "amx_bf16 amx_tile avx512_bf16 avx512f avx2")
    first = cached_rates(576, 1536, tmp_path, amd)
    assert cached_rates(576, 1536, tmp_path, amd) == first and len(measured) == 1  # read back, not measured again
    assert cached_rates(576, 1536, tmp_path, amx).fp32 == 102.0  # another processor: measured
    assert cached_rates(64, 256, tmp_path, amd).fp32 == 103.0  # another shape: measured
    assert len(json.loads((tmp_path / cpu_rates.CACHE_FILE).read_text())) == 3
    (tmp_path / cpu_rates.CACHE_FILE).write_text("{not json")  # a damaged file is measured again, never trusted
    assert cached_rates(576, 1536, tmp_path, amd).fp32 == 104.0

    # a second process that measured at the same time takes the entry the first wrote
    def racing_measure(hidden, intermediate, processor=None, max_rows=2048):
        cpu_rates.write_json_atomic(tmp_path / "race" / cpu_rates.CACHE_FILE,
                                    {cpu_rates.cache_key(amd, hidden, intermediate): cpu_rates.asdict(first)})
        return replace(first, fp32=999.0)

    monkeypatch.setattr(cpu_rates, "measure", racing_measure)
    assert cached_rates(576, 1536, tmp_path / "race", amd) == first


def test_the_probe_returns_rates_of_the_shape_it_timed():
    got = cpu_rates.measure(64, 256, Processor("Test CPU", ""), max_rows=64)
    assert got.hidden == 64 and got.intermediate == 256 and 16 <= got.rows <= 64
    threads = torch.get_num_threads()
    assert got.fp32 > 0 and got.bf16 > 0 and got.threads == 1 and torch.get_num_threads() == threads  # restored
    assert got.processor == "Test CPU (ISA flags unknown)"


def test_where_bf16_crawls_the_probe_times_both_at_few_rows(monkeypatch):
    """An AVX2-like processor (bf16 at 1.2 GFLOP/s, fp32 at 130): the rows stop growing at bf16's pace, so the probe
    spends about one slow call, and the rates come out as the kernels ran."""
    calls = []

    def fake_call(rows, hidden, intermediate, dtype):
        rate = 130e9 if dtype == torch.float32 else 1.2e9
        calls.append((rows, dtype))
        return 2 * rows * hidden * intermediate / rate

    monkeypatch.setattr(cpu_rates, "_seconds_per_call", fake_call)
    got = cpu_rates.measure(576, 1536, Processor("AVX2 CPU", "avx2"))
    assert got.rows == 16 and {r for r, _ in calls} == {16}  # one bf16 call of 16 rows takes 24 ms: 4x would not fit
    assert got.fp32 == pytest.approx(130.0) and got.bf16 == pytest.approx(1.2)
    calls.clear()
    monkeypatch.setattr(cpu_rates, "_seconds_per_call",
                        lambda rows, h, i, dtype: 2 * rows * h * i / (100e9 if dtype == torch.float32 else 270e9))
    # fp32 at 100 GFLOP/s the slower: 1024 rows take 18 ms, 4096 would take 72 (over the 50 ms bound)
    assert cpu_rates.measure(576, 1536, Processor("AVX-512 CPU", "avx512_bf16")).rows == 1024


def test_the_probe_reads_a_models_shape_without_building_it(monkeypatch):
    """A tiny model, a shape, warm:<base> and an adapter's base give their dims from their recipes: a placement made
    before the model exists (a benchmark's, a run's before its load) builds nothing."""
    from fedagent_flwr.agent.engine.memory import SHAPES
    from fedagent_flwr.agent.models import pretrained
    from fedagent_flwr.agent.models.tiny_model import default_recipe

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built to read its shape")

    monkeypatch.setattr(pretrained, "ensure_tiny_model", no_build)
    monkeypatch.setattr(pretrained, "ensure_shaped_model", no_build)
    monkeypatch.setattr(pretrained, "ensure_warm_model", no_build)
    recipe = default_recipe("gridworld")
    assert pretrained.model_dims("tiny", "gridworld") == (recipe.hidden_size, recipe.intermediate_size)
    assert pretrained.model_dims("shape:qwen2.5-7b", "gridworld") == (SHAPES["qwen2.5-7b"]["hidden_size"],
                                                                      SHAPES["qwen2.5-7b"]["intermediate_size"])
    monkeypatch.setattr(pretrained, "resolve_model", no_build)
    monkeypatch.setattr(pretrained, "model_dims", lambda name, env, real=pretrained.model_dims: (
        (576, 1536) if name == "smollm2-135m-instruct" else real(name, env)))
    assert pretrained.model_dims("warm:smollm2-135m-instruct", "gridworld") == (576, 1536)


def test_the_evaluation_command_plays_a_lora_checkpoint_in_the_precision_its_run_took(tmp_path, monkeypatch, capsys,
                                                                                       tiny_lm, maze_tokenizer):
    """`python -m fedagent_flwr.evaluation --model <adapter folder>`: auto resolves as the LoRA run did on this
    processor (bf16-base where the probe finds bf16 clearly faster: the base loads in bf16, the adapter merged into
    it), and says so on stderr; a plain model stays fp32."""
    from peft import LoraConfig, get_peft_model

    from fedagent_flwr.agent.models import loading
    from fedagent_flwr.agent.models import pretrained as models
    from fedagent_flwr.agent.training.lora import save_adapter
    from fedagent_flwr.experiments import evaluate

    monkeypatch.setenv("FEDAGENT_CACHE", str(tmp_path / "cache"))
    base_folder = tmp_path / "base"
    tiny_lm.save_pretrained(base_folder)
    maze_tokenizer.save_pretrained(base_folder)
    monkeypatch.setattr(models, "ensure_tiny_model", lambda env: base_folder)  # "tiny:maze" is this folder
    peft_model = get_peft_model(models.load_model(models.ModelSpec(str(base_folder), True), torch.device("cpu")),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    save_adapter(peft_model, tmp_path / "round-0003", maze_tokenizer, base_model="tiny:maze")
    monkeypatch.setattr(run_placement, "model_rates", lambda model, env: AMX)  # a processor where bf16 is faster
    loaded = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda spec, dev, dtype: loaded.append(dtype) or real(spec, dev, dtype))
    loading.load_agent.cache_clear()
    argv = ["--env", "maze", "--tasks", "1", "--samples-per-task", "1", "--device", "cpu"]
    try:
        assert evaluate.main(["--model", str(tmp_path / "round-0003"), *argv]) == 0
        assert loaded == [torch.bfloat16] and "precision bf16-base (auto: bf16 is faster here" in capsys.readouterr().err
        assert evaluate.main(["--model", str(base_folder), *argv]) == 0  # a plain model: what a full fine-tune took
        assert loaded[-1] == torch.float32 and "precision fp32" in capsys.readouterr().err
    finally:
        loading.load_agent.cache_clear()


def test_a_node_whose_base_loaded_in_another_dtype_is_refused_at_the_handshake_naming_precision(run_identity):
    """Nodes on processors that resolve auto apart (bf16-base on one, fp32 on another) hold different base weights:
    the handshake stops the run before round 1 and says what to set."""
    from types import SimpleNamespace

    from fedagent_flwr.federation import handshake

    def reply(node, pid, fingerprint):
        info = {"partition-id": pid, "fingerprint": fingerprint}
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node), has_error=lambda: False,
                               content=SimpleNamespace(config_records={"info": info}))

    grid = SimpleNamespace(send_and_receive=lambda messages, timeout: [reply(7, 0, "fp32-base"), reply(8, 1, "bf16-base")])
    with pytest.raises(RuntimeError, match="node 8 .partition 1. holds different base weights") as err:
        handshake(grid, [7, 8], "fp32-base", timeout=5)
    assert "a federation of different processors sets precision" in str(err.value)
    assert "node 7" not in str(err.value)
