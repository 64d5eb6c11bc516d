import tomllib
from pathlib import Path

import pytest
from flwr.common.config import flatten_dict

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.preflight import preflight
from placed import rollout_config

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_defaults_equal_the_dataclass_defaults():
    # Flower flattens the table's dotted keys into the run config's keys as it reads them
    app_config = flatten_dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])
    assert app_config == RunConfig().to_run_config()
    assert RunConfig.from_run_config(app_config) == RunConfig()


def test_every_row_of_the_generated_key_tables_has_as_many_cells_as_its_header():
    """A `|` inside a cell (e.g. an allowed list such as fp32 | bf16) must be escaped, or the row renders shifted."""
    import re

    from fedagent_flwr.experiments.config_files import key_tables, renamed_table

    header = None
    for number, line in enumerate(key_tables() + [""] + renamed_table(), 1):
        cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2 if line.startswith("|") else None
        if cells is None:
            header = None
        elif header is None:
            header = cells
        else:
            assert cells == header, f"generated key table line {number} has {cells} cells under a header of {header}"


@pytest.mark.parametrize(
    "override, message",
    [
        ({"clients-per-round": 5, "num-clients": 4}, "clients-per-round=5"),
        ({"env": "chess"}, "env='chess'"),
        ({"strategy": "fedprox"}, "strategy='fedprox'"),
        ({"grpo.tasks-per-epoch": 0}, "grpo.tasks-per-epoch=0"),
        ({"grpo.num-generations": 1}, "grpo.num-generations=1"),
        ({"num-server-rounds": -1}, "num-server-rounds=-1"),
        ({"grpo.learning-rate": 0.0}, "grpo.learning-rate=0.0"),
        ({"rollout.temperature": 0.0}, "rollout.temperature=0.0"),
        ({"rollout.top-p": 1.5}, "rollout.top-p=1.5"),
        ({"grpo.epsilon": 1.0}, "grpo.epsilon=1.0"),
        ({"model": "tiny:chess"}, "model='tiny:chess'"),
        ({"output-dir": "runs"}, "output-dir='runs'"),
        ({"run-name": "a/b"}, "run-name='a/b'"),
        ({"federation.min-replies": 3}, "federation.min-replies=3"),
        ({"grpo.uniform-groups": "all"}, "grpo.uniform-groups='all'"),
        ({"partition.seed": -2}, "partition.seed=-2"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"partition.scheme": "dirichlet"}, "partition.scheme='dirichlet'"),
        ({"rollout.reward": "points"}, "rollout.reward='points'"),
        ({"rollout.action-matching": "fuzzy"}, "rollout.action-matching='fuzzy'"),
        ({"grpo.loss-aggregation": "sum"}, "grpo.loss-aggregation='sum'"),
        ({"rollout.kernels": "inductor"}, "rollout.kernels='inductor'"),
        ({"rollout.kernels": "compile", "rollout.name": "hf"}, "rollout.kernels='compile' is not allowed: expected eager with rollout.name='hf'"),
    ],
)
def test_bad_values_fail_with_a_message_naming_key_and_allowed_values(override, message):
    with pytest.raises(ValueError) as err:
        preflight(RunConfig.from_run_config(RunConfig().to_run_config() | override))
    assert message in str(err.value) and "expected" in str(err.value)


def test_unknown_keys_and_wrong_types_are_rejected():
    with pytest.raises(ValueError, match="unknown run-config key"):
        RunConfig.from_run_config({"num-rounds": 3})
    with pytest.raises(ValueError, match="expected int"):
        RunConfig.from_run_config({"grpo.num-generations": "8"})
    assert RunConfig.from_run_config({"grpo.learning-rate": 1}).grpo.learning_rate == 1.0  # ints are fine for floats


def test_federation_size_must_match_the_supernodes():
    assert RunConfig().check_federation(4) == 4
    assert RunConfig.from_run_config({"num-clients": 4}).check_federation(4) == 4
    with pytest.raises(ValueError, match="num-supernodes=6"):
        RunConfig.from_run_config({"num-clients": 6}).check_federation(4)
    with pytest.raises(ValueError, match="clients-per-round=3"):
        RunConfig.from_run_config({"clients-per-round": 3}).check_federation(2)


def test_every_key_has_docs():
    for key, f, _ in RunConfig.keys():
        assert f.metadata["doc"] and f.metadata["allowed"], key


def test_max_new_tokens_zero_takes_the_largest_budget_among_the_envs():

    assert rollout_config(RunConfig()).max_new_tokens == 32  # gridworld
    assert rollout_config(RunConfig(env="webshop")).max_new_tokens == 128
    assert rollout_config(RunConfig(env="maze,alfworld")).max_new_tokens == 64
    assert rollout_config(RunConfig.from_run_config({"env": "webshop", "rollout.max-completion-length": 40})).max_new_tokens == 40


@pytest.mark.parametrize("preset", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_preset_file_is_a_valid_run_config(preset):
    """configs/*.toml are what `flwr run . --run-config FILE` reads: every key known, every value allowed."""
    from flwr.common.config import parse_config_args

    from fedagent_flwr.simulation import read_run_config_file

    values = read_run_config_file(str(preset))
    assert values == parse_config_args([str(preset)])  # the same keys and values Flower reads
    try:
        from fedagent_flwr.agent.models.gguf_models import gguf_file

        gguf_file("smollm2-135m-instruct")
    except ValueError:  # the SmolLM2 presets' model needs a package CI does not install: check every other key
        values = values | ({"model": "tiny"} if "smollm2" in str(values.get("model", "")) else {})
    RunConfig.from_run_config(RunConfig().to_run_config() | values)


def test_simulation_reads_a_preset_file_and_flags_override_it(tmp_path, capsys):
    from fedagent_flwr.simulation import main

    preset = tmp_path / "p.toml"
    folder = tmp_path / "it's"  # a model folder whose name needs quoting
    folder.mkdir()
    preset.write_text(f'env = "maze"\nnum-server-rounds = 3\nmodel = "{folder}"\n')
    assert main(["--run-config", str(preset), "--num-server-rounds", "5", "--dry-run"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "num-server-rounds=5" in line and "num-server-rounds=3" not in line and "env=" in line
    from flwr.common.config import parse_config_args
    run_config = line.split("--run-config ", 1)[1]
    import shlex
    assert parse_config_args([shlex.split(run_config)[0]])["model"] == str(folder)  # quotes survive the trip to flwr


@pytest.mark.parametrize("content, expected", [
    (None, "no such file"),
    ("env = [\n", "not valid TOML"),
    ("no-such-key = 1\n", "unknown run-config key(s) ['no-such-key']"),
])
def test_a_bad_run_config_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, content, expected):
    from fedagent_flwr.simulation import main

    path = tmp_path / "preset.toml"
    if content is not None:
        path.write_text(content)
    assert main(["--run-config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--run-config {path}" in err and expected in err


def test_simulation_help_lists_every_key_once_under_its_section():
    """~140 flags are readable only grouped: each run-config key appears, as its flag, in the group of its section."""
    from fedagent_flwr.config import SECTIONS
    from fedagent_flwr.simulation import build_parser

    groups = {g.title: {a.dest for a in g._group_actions} for g in build_parser()._action_groups}
    assert groups["top-level keys"] == {key for key, _, section in RunConfig.keys() if section is None}
    for section in SECTIONS:
        assert groups[f"{section.NAME}.* keys"] == {key for key, _, owner in RunConfig.keys() if owner is section}
    listed = [dest for title, dests in groups.items() if title.endswith(" keys") for dest in dests]
    assert sorted(listed) == sorted(key for key, _, _ in RunConfig.keys())


def test_the_trainer_and_the_rollout_take_their_settings_from_the_run_config_alone():
    """GRPO's trainer reads the grpo section itself (no copy with defaults of its own to disagree); RolloutConfig's
    history comes from the run config too."""
    from fedagent_flwr.agent.play.rollout import RolloutConfig

    run = RunConfig.from_run_config({"grpo.learning-rate": 3e-6, "grpo.tasks-per-epoch": 16, "grpo.mini-batch-size": 32,
                                     "grpo.ppo-micro-batch-size-per-gpu": 8, "rollout.history-length": 2})
    grpo = run.grpo
    assert (grpo.learning_rate, grpo.tasks_per_epoch, grpo.mini_batch_size, grpo.ppo_micro_batch_size_per_gpu) == (3e-6, 16, 32, 8)
    assert rollout_config(run).history_length == 2 and rollout_config(RunConfig()).history_length == 0
    with pytest.raises(TypeError):
        RolloutConfig()  # no silent history length of its own


def test_clients_sharing_a_card_plan_with_their_share_of_it():
    """--num-gpus-per-client below 1 with no engine.client-memory-gb: run_simulation.py gives each client its share of the card,
    so rollout.generation-batch-size=0 and engine.gradient-checkpointing=auto do not size themselves by what happens to be free."""
    from fedagent_flwr.agent.engine.memory import GB
    from fedagent_flwr.simulation import share_of_card

    assert share_of_card(0.5, 0.0, 80 * GB) == 40.0
    assert share_of_card(0.25, 0.0, 81559 * 2**20) == 19.9  # an H100 80GB's 79.6 GiB, rounded down
    assert share_of_card(1.0, 0.0, 80 * GB) == 0.0  # a card of its own: nothing to share
    assert share_of_card(0.0, 0.0, 80 * GB) == 0.0  # no GPU asked for
    assert share_of_card(0.5, 30.0, 80 * GB) == 0.0  # a value given is kept
