"""Bad configurations fail at start with a message naming the key, the value and what is allowed;
GPU requests on a machine without one fail clearly; the base model is loaded once per process."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize(
    "override, message",
    [
        # resilience keys, incl. cross-key constraints
        ({"resume": True}, "resume=True"),
        ({"resume": True, "run-name": "r", "strategy": "pavg", "env": "random-mdp"}, "false with strategy='pavg'"),
        ({"resume": True, "run-name": "r", "strategy": "qavg", "env": "random-mdp"}, "false with strategy='qavg'"),
        ({"resume": True, "run-name": "r", "baseline.name": "local"}, "false with baseline.name='local' and baseline.optimizer='keep'"),
        ({"resilience.fault-injection": "explode:partition=0"}, "resilience.fault-injection='explode:partition=0'"),
        ({"resilience.fault-injection": "raise:prob=1.5"}, "resilience.fault-injection='raise:prob=1.5'"),
        ({"resilience.fault-injection": "raise"}, "resilience.fault-injection='raise'"),
        ({"resilience.fault-injection": "raise:partition=4", "num-clients": 4}, "a partition-id below num-clients (4)"),
        ({"resilience.fault-injection": "timeout:prob=0.5", "federation.round-timeout": 3600.0}, "federation.round-timeout=3600.0"),
        # ranges
        ({"federation.round-timeout": 0.0}, "federation.round-timeout=0.0"),
        ({"grpo.max-grad-norm": 0.0}, "grpo.max-grad-norm=0.0"),
        ({"grpo.beta": -0.1}, "grpo.beta=-0.1"),
        ({"rollout.invalid-penalty": -1.0}, "rollout.invalid-penalty=-1.0"),
        ({"eval.temperature": -0.5}, "eval.temperature=-0.5"),
        ({"eval.test-freq": 0}, "eval.test-freq=0"),
        ({"eval.samples-per-task": 0}, "eval.samples-per-task=0"),
        ({"rollout.history-length": -1}, "rollout.history-length=-1"),
        ({"rollout.max-completion-length": -1}, "rollout.max-completion-length=-1"),
        ({"grpo.ppo-micro-batch-size-per-gpu": 0}, "grpo.ppo-micro-batch-size-per-gpu=0"),
        ({"grpo.local-epochs": 0}, "grpo.local-epochs=0"),
        ({"num-clients": -1}, "num-clients=-1"),
        ({"federation.min-replies": 0}, "federation.min-replies=0"),
        ({"model": "   "}, "model='   '"),
        ({"device": "gpu"}, "device='gpu'"),
        # cross-key constraints
        ({"clients-per-round": 3, "federation.min-replies": 4, "num-clients": 5}, "federation.min-replies=4 is not allowed: expected <= clients-per-round (3)"),
        ({"strategy": "qavg"}, "env='gridworld'"),
        ({"strategy": "fedagent-avg", "env": "random-mdp"}, "env='random-mdp'"),
        ({"baseline.name": "local", "baseline.local-client": 3, "num-clients": 3}, "baseline.local-client=3"),
        # numbers that are not finite, or below a sensible minimum (issue: accepted, then failed far away)
        ({"seed": -1}, "seed=-1 is not allowed: expected an integer >= 0"),
        ({"grpo.learning-rate": float("inf")}, "grpo.learning-rate=inf is not allowed: expected a finite number"),
        ({"grpo.learning-rate": float("nan")}, "grpo.learning-rate=nan is not allowed: expected a finite number"),
        ({"grpo.beta": float("inf")}, "grpo.beta=inf is not allowed: expected a finite number"),
        ({"federation.round-timeout": float("inf")}, "federation.round-timeout=inf is not allowed: expected a finite number"),
        ({"privacy.noise-multiplier": float("-inf")}, "privacy.noise-multiplier=-inf"),
        ({"rollout.temperature": 1e-30}, "rollout.temperature=1e-30 is not allowed: expected >= 0.01"),
        ({"rollout.temperature": 0.0}, "rollout.temperature=0.0 is not allowed: expected >= 0.01"),
        ({"eval.temperature": 0.001}, "eval.temperature=0.001 is not allowed: expected 0 (greedy) or >= 0.01"),
        ({"federation.round-timeout": 0.5}, "federation.round-timeout=0.5 is not allowed: expected >= 1 (seconds)"),
        ({"rollout.top-p": 0.0}, "rollout.top-p=0.0"),
        ({"rollout.top-p": 1.5}, "rollout.top-p=1.5"),
        ({"grpo.epsilon": 1.0}, "grpo.epsilon=1.0"),
        ({"grpo.learning-rate": 0.0}, "grpo.learning-rate=0.0"),
        ({"grpo.num-generations": 1}, "grpo.num-generations=1"),
        ({"num-server-rounds": 0}, "num-server-rounds=0"),
        ({"clients-per-round": 0}, "clients-per-round=0"),
        ({"clients-per-round": 5, "num-clients": 4}, "clients-per-round=5 is not allowed: expected <= num-clients (4)"),
        ({"partition.tasks-per-client": 0}, "partition.tasks-per-client=0"),
        ({"rollout.max-steps": -1}, "rollout.max-steps=-1"),
        ({"rollout.generation-batch-size": -1}, "rollout.generation-batch-size=-1 is not allowed: expected an integer >= 1, or 0 = auto"),
        ({"eval.tasks": 1000}, "eval.tasks=1000 is not allowed: expected 0 (all), or per env at most its size (gridworld 48)"),
        ({"eval.tasks": -1}, "eval.tasks=-1"),
        ({"eval.transcripts": -1}, "eval.transcripts=-1"),
        ({"privacy.clipping-norm": 0.0}, "privacy.clipping-norm=0.0"),
        ({"privacy.secagg-shares-fraction": 0.0}, "privacy.secagg-shares-fraction=0.0"),
        ({"fedse.learning-rate": 0.0}, "fedse.learning-rate=0.0"),
        ({"fedse.fraction-train": 1.5}, "fedse.fraction-train=1.5"),
        ({"lora.lora-alpha": 0.0}, "lora.lora-alpha=0.0"),
        ({"fedrl.kappa": 1.5, "strategy": "qavg", "env": "random-mdp"}, "fedrl.kappa=1.5"),
        ({"engine.client-memory-gb": -1.0}, "engine.client-memory-gb=-1.0"),
        # names and choices
        ({"run-name": "it's"}, "run-name=\"it's\" is not allowed"),
        ({"run-name": "a/b"}, "run-name='a/b'"),
        ({"run-name": ".hidden"}, "run-name='.hidden'"),
        ({"run-name": "-x"}, "run-name='-x'"),
        ({"run-name": "has space"}, "run-name='has space'"),
        ({"strategy": "fedavg"}, "strategy='fedavg'"),
        ({"env": "chess"}, "env='chess'"),
        ({"env": "maze,chess"}, "env='maze,chess'"),
        ({"partition.scheme": "random"}, "partition.scheme='random'"),
        ({"precision": "fp16"}, "precision='fp16'"),
        ({"engine.server-device": "tpu"}, "engine.server-device='tpu'"),
        ({"federation.transfer-dtype": "int8"}, "federation.transfer-dtype='int8'"),
        ({"grpo.finetuning": "qlora"}, "grpo.finetuning='qlora'"),
        ({"rollout.reward": "dense"}, "rollout.reward='dense'"),
        ({"rollout.answer-parsing": "loose"}, "rollout.answer-parsing='loose'"),
        ({"privacy.dp-mode": "local"}, "privacy.dp-mode='local'"),
        ({"baseline.name": "oracle"}, "baseline.name='oracle'"),
        ({"tracker": "comet"}, "tracker='comet' is not allowed: expected none | tensorboard | wandb | mlflow"),
        # paths
        ({"model": "/nonexistent/model"}, "model='/nonexistent/model' is not allowed: expected a model folder that exists"),
        ({"model": "./relative-model"}, "model='./relative-model'"),
        ({"model": "org/name/extra"}, "model='org/name/extra'"),
        ({"model": "tiny:chess"}, "model='tiny:chess'"),
        ({"model": "shape:qwen9"}, "model='shape:qwen9'"),
        ({"model": "/nonexistent/model.gguf"}, "model='/nonexistent/model.gguf'"),
        ({"output-dir": "relative/runs"}, "output-dir='relative/runs'"),
        ({"output-dir": str(ROOT / "README.md" / "runs")}, "README.md is a file"),
        # root passes os.access everywhere; /proc takes no new folder from anyone
        ({"output-dir": "/proc/fedagent-flwr/runs"}, "output-dir='/proc/fedagent-flwr/runs' is not allowed"),
        ({"partition.scheme": "hardness"}, "partition.success-labels=''"),
        ({"partition.scheme": "hardness", "partition.success-labels": "/nonexistent/labels.json"}, "an existing file"),
        ({"fedse.buffer-dir": "relative"}, "fedse.buffer-dir='relative'"),
        # cross-key
        ({"privacy.secure-aggregation": True, "clients-per-round": 1}, "clients-per-round=1 is not allowed: expected >= 2"),
        ({"federation.transfer-dtype": "bf16", "privacy.dp-mode": "server-side"}, "federation.transfer-dtype='bf16'"),
        ({"grpo.kl-reference": "initial"}, "grpo.kl-reference='initial'"),
        ({"grpo.log-prob-micro-batch-size-per-gpu": -1}, "grpo.log-prob-micro-batch-size-per-gpu=-1 is not allowed: expected an integer >= 0"),
        ({"engine.shared-prompt-prefix": True, "engine.gradient-checkpointing": "auto"}, "engine.shared-prompt-prefix=True is not allowed: expected false with engine.gradient-checkpointing on"),
        ({"engine.attn-implementation": "flash"}, "engine.attn-implementation='flash' is not allowed: expected sdpa | eager"),
        ({"engine.attn-implementation": "eager", "engine.gradient-checkpointing": True}, "engine.attn-implementation='eager' is not allowed: expected sdpa with engine.gradient-checkpointing on"),
        # a client on N ranks: GRPO strategies, and what has run under FSDP2
        ({"engine.ranks-per-client": 0}, "engine.ranks-per-client=0 is not allowed: expected an integer >= 1"),
        ({"engine.ranks-per-client": 2, "strategy": "fedse-lora"}, "engine.ranks-per-client=2 is not allowed: expected 1 unless the strategy trains with GRPO"),
        ({"engine.ranks-per-client": 2, "engine.training-kernels": "compile"}, "engine.training-kernels='compile' is not allowed: expected eager with engine.ranks-per-client > 1"),
        ({"engine.ranks-per-client": 2, "engine.attn-implementation": "eager"}, "engine.attn-implementation='eager' is not allowed: expected sdpa with engine.ranks-per-client > 1"),
        ({"engine.ranks-per-client": 2, "engine.param-dtype": "bf16", "precision": "bf16-mixed", "grpo.finetuning": "full"}, "engine.param-dtype='bf16' is not allowed: expected fp32 with engine.ranks-per-client > 1"),
        ({"engine.ranks-per-client": 2, "device": "cuda:1"}, "device='cuda:1' is not allowed: expected cpu | cuda | auto with engine.ranks-per-client > 1"),
    ],
)
def test_bad_configurations_fail_with_a_clear_message(override, message):
    with pytest.raises(ValueError) as err:
        preflight(RunConfig.from_run_config(RunConfig().to_run_config() | override))
    text = str(err.value)
    assert message in text and "expected" in text, text
    problems = text.splitlines()[1:] or [text]  # one problem is one line; several get a line each
    assert all("is not allowed: expected" in line for line in problems), text


@pytest.mark.parametrize("content, message", [
    ('{"env": "maze", "labels": ["maze-0"]}', "must map task ids to true/false, found a list"),
    ('{"env": "maze", "labels": "yes"}', "is not a success-label file"),
    ('{"env": "wordle", "labels": {}}', "labels env 'wordle'"),
    ('[1, 2]', "is not a success-label file"),
    ('{"env": "maze", "labels": {"x": true}}', "has no label for"),
    ('not json', "is not a success-label file"),
])
def test_a_malformed_success_label_file_is_refused_up_front(tmp_path, content, message):
    path = tmp_path / "labels.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="partition.success-labels=") as err:
        preflight(RunConfig.from_run_config({"env": "maze", "partition.scheme": "hardness", "partition.success-labels": str(path)}))
    assert message in str(err.value) and "\n" not in str(err.value), err.value


def _refused(flags: list[str], capsys) -> tuple[int, str]:
    """run_simulation's main on `flags` --dry-run in this process (a process of its own costs about 8 s of imports,
    so one case of each test below runs as a process): its exit code and what it wrote to stderr."""
    from fedagent_flwr.simulation import main

    capsys.readouterr()
    try:
        code = main([*flags, "--dry-run"])
    except SystemExit as stop:  # sys.exit("...") prints its message to stderr and exits 1
        code = stop.code
    captured = capsys.readouterr()
    if isinstance(code, str):
        return 1, captured.err + code + "\n"
    assert "flwr run" not in captured.out  # stopped before building the command
    return code, captured.err


def _refused_as_a_process(flags: list[str]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(ROOT / "run_simulation.py"), *flags, "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert "flwr run" not in proc.stdout
    return proc.returncode, proc.stderr


def test_a_refused_config_stops_run_simulation_with_one_line_and_a_non_zero_exit(tmp_path, capsys):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "summary.json").write_text("{}")
    for i, (flags, message) in enumerate((
        (["--seed", "-1"], "seed=-1 is not allowed"),
        (["--grpo.learning-rate", "inf"], "grpo.learning-rate=inf is not allowed"),
        (["--output-dir", str(tmp_path / "runs"), "--run-name", "taken"], "already holds a run; set resume=true"),
        (["--output-dir", str(tmp_path / "runs"), "--run-name", "missing", "--resume", "true"], "names no run"),
    )):
        code, err = _refused_as_a_process(flags) if i == 0 else _refused(flags, capsys)
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs" / "missing").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ({"seed": "1"}, "seed='1' has type str; expected int"),
        ({"resume": "yes"}, "resume='yes' has type str; expected bool"),
        ({"num-server-rounds": 2.5}, "num-server-rounds=2.5 has type float; expected int"),
        ({"resilience.fault-injection": 0}, "resilience.fault-injection=0 has type int; expected str"),
    ],
)
def test_wrong_types_fail_with_the_expected_type(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RunConfig.from_run_config(override)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as err:
        RunConfig.from_run_config({"grpo.num-generations": 1, "rollout.top-p": 0.0, "resume": True})
    assert all(k in str(err.value) for k in ("grpo.num-generations=1", "rollout.top-p=0.0", "resume=True"))


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_gpu_requests_without_a_gpu_fail_before_any_work(capsys):
    from fedagent_flwr.agent.models.pretrained import pick_device

    with pytest.raises(ValueError, match="device='cuda' but no CUDA GPU is visible"):
        pick_device("cuda")
    assert pick_device("auto").type == "cpu"
    for i, (flags, message) in enumerate((
        (["--num-gpus-per-client", "0.5"], "--num-gpus-per-client=0.5 but no CUDA GPU is visible"),
        (["--device", "cuda"], "--device=cuda but no CUDA GPU is visible"),
        (["--device", "cuda:1"], "--device=cuda:1 but no CUDA GPU is visible"),
        (["--engine.ranks-per-client", "2", "--num-gpus-per-client", "1"],
         "--num-gpus-per-client=1 but engine.ranks-per-client=2: each rank computes on a GPU of its own"),
        (["--engine.ranks-per-client", "2", "--num-gpus-per-client", "0.5"],
         "--num-gpus-per-client=0.5 but engine.ranks-per-client=2: each rank computes on a GPU of its own"),
    )):
        code, err = _refused_as_a_process(flags) if i == 0 else _refused(flags, capsys)
        assert code == 2 and message in err, err  # 2, as every other refusal (issue 94: one exited 1)


def test_a_seed_data_file_that_is_not_there_is_refused_before_the_simulation_starts(capsys, tmp_path):
    """fedse.seed-data is read by the clients, on this machine in a simulation: checked whole before Ray starts
    (issue 94: a missing file started the whole run)."""
    missing = tmp_path / "agenttraj.json"
    code, err = _refused(["--strategy", "fedse-lora", "--fedse.seed-data", str(missing)], capsys)
    assert code == 2 and f"fedse.seed-data={str(missing)!r}: no such file" in err, err
    missing.write_text("{not json")
    code, err = _refused(["--strategy", "fedse-lora", "--fedse.seed-data", str(missing)], capsys)
    assert code == 2 and "is not readable JSON" in err, err


def test_what_the_machine_lacks_is_refused_by_run_simulation_before_the_simulation_starts(capsys, tmp_path):
    """The preflight (runs/preflight.py): a warm: model whose base this machine can neither find in its Hugging Face
    cache nor fetch, an unknown environment, a held-out count above the split, a Fed-SE buffer folder it cannot write,
    each in one line with exit 2 (issue 94: the unknown warm: model failed late, inside the simulation)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for flags, message in (
        (["--model", "warm:smollm2-135m", "--rollout.history-length", "2"], "model='warm:smollm2-135m' is not allowed"),
        (["--env", "maze,chess"], "unknown environment 'chess'"),
        (["--eval.tasks", "1000"], "eval.tasks=1000 is not allowed"),
        (["--strategy", "fedse-lora", "--fedse.buffer-dir", str(a_file / "buffers")], "fedse.buffer-dir="),
    ):
        code, err = _refused(flags, capsys)
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_context_limit_that_cannot_hold_a_first_step_is_refused_before_the_simulation_starts(capsys):
    """rollout.max-context-tokens below a first step's prompt (measured with the model's own tokenizer) plus the
    generated tokens is refused in one line naming the length it needs (issue 94: it failed inside the simulation);
    the length it names is accepted, one token less is not."""
    code, err = _refused(["--rollout.max-context-tokens", "60"], capsys)
    assert code == 2 and "rollout.max-context-tokens=60 is not allowed" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    needed = int(re.search(r"at least (\d+)", err).group(1))
    assert 60 < needed
    preflight(RunConfig.from_run_config({"rollout.max-context-tokens": needed}))
    with pytest.raises(ValueError, match=f"at least {needed}"):
        preflight(RunConfig.from_run_config({"rollout.max-context-tokens": needed - 1}))


def test_a_large_federation_says_how_long_it_will_take_to_start(capsys):
    """100,000 simulated SuperNodes sat for minutes without a word (issue 94): the launcher now says, before it
    starts, about how long the SuperNodes will take; a small federation gets no such line."""
    from fedagent_flwr.simulation import main

    for clients, said in ((100_000, "100,000 simulated SuperNodes: about 15 minutes before round 1"), (4, None)):
        capsys.readouterr()
        assert main(["--num-clients", str(clients), "--clients-per-round", "2", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert (said in out) if said else ("simulated SuperNodes" not in out), out


def test_the_base_model_is_loaded_once_per_process_and_reused_across_rounds(tmp_path, monkeypatch):
    """Two rounds, three clients in one worker process and the server in its own: one load each."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedagent_flwr.agent.models import loading as agent_module
    from fedagent_flwr.federation import run_federation
    from loopback_grid import LoopbackGrid

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 0)
    torch.set_num_threads(1)
    loads = []
    real = agent_module.load_model
    monkeypatch.setattr(agent_module, "load_model", lambda *a, **k: loads.append(a) or real(*a, **k))
    agent_module.load_agent.cache_clear()
    run_config = RunConfig().to_run_config() | {
        "num-server-rounds": 2, "clients-per-round": 2, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2, "eval.tasks": 1,
        "eval.samples-per-task": 1, "eval.test-freq": 2, "num-clients": 3, "output-dir": str(tmp_path), "run-name": "cache",
    }
    grid = LoopbackGrid(run_config, 3)
    summary = run_federation(grid, RunConfig.from_run_config(run_config))
    agent_module.load_agent.cache_clear()  # later tests must not inherit weights trained here
    assert len(grid.exchanges) == 3 + 2 * 2  # handshakes + two rounds of two clients
    assert len(loads) == 2  # the server's and the clients' worker's, not one per message or round
    assert summary["failed_replies"] == {}
