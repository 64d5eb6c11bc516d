"""The run config's dotted sections and the flat names they replaced (config/renames.py): an old name is refused in one
line that names its new key, wherever a run config comes in; a run saved under the old names still resumes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedagent_flwr import simulation
from fedagent_flwr.agent.play.rollout import RolloutConfig
from fedagent_flwr.agent.training.grpo import GRPOTrainer
from fedagent_flwr.config import RENAMED, SECTIONS, ConfigError, RunConfig, current_keys
from fedagent_flwr.methods.placement import place_run
from fedagent_flwr.runs.resume import load_state, save_state
from strategies import FedAgentAvg


def test_every_old_name_maps_to_a_key_of_a_section_and_no_old_name_is_a_key():
    keys = {key: section for key, _, section in RunConfig.keys()}
    added_since = {"eval.save-total-limit"}  # keys that had no flat name before the sections
    assert set(RENAMED.values()) == {key for key, section in keys.items() if section is not None} - added_since
    assert not set(RENAMED) & set(keys)
    for section in SECTIONS:  # a section's name is no top-level key: TOML could not hold both
        assert section.NAME not in keys


def test_an_old_name_is_refused_in_one_line_naming_its_new_key():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"group-size": 8})
    assert str(err.value) == ("invalid run config: group-size is a key's old name: write grpo.num-generations "
                              "(docs/renamed-keys.md lists every renamed key)")
    with pytest.raises(ValueError, match=r"^--set 'kl-beta=0\.1': kl-beta is a key's old name: write grpo\.beta$"):
        simulation.parse_overrides(["kl-beta=0.1"])
    assert RunConfig.from_run_config({"grpo.num-generations": 4}).grpo.num_generations == 4


@pytest.mark.parametrize("argv, new", [
    (["--group-size", "8"], "--grpo.num-generations"),
    (["--lora-rank=4"], "--lora.r"),
    (["--partition", "coverage"], "--partition.scheme"),
])
def test_run_simulation_refuses_an_old_flag_with_exit_2_naming_the_new_one(argv, new, capsys):
    assert simulation.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"write {new} " in err, err


def test_a_run_config_file_with_an_old_name_is_refused_naming_the_new_key(tmp_path, capsys):
    preset = tmp_path / "old.toml"
    preset.write_text('env = "maze"\neval-every = 2\n')
    assert simulation.main(["--run-config", str(preset), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval-every is a key's old name: write eval.test-freq" in err, err


def test_a_section_reads_the_same_as_a_toml_table_or_as_dotted_keys(tmp_path):
    dotted, table = tmp_path / "dotted.toml", tmp_path / "table.toml"
    dotted.write_text('env = "maze"\ngrpo.num-generations = 4\ngrpo.beta = 0.0\nlora.r = 2\n')
    table.write_text('env = "maze"\n\n[grpo]\nnum-generations = 4\nbeta = 0.0\n\n[lora]\nr = 2\n')
    read = [RunConfig.from_run_config(simulation.read_run_config_file(str(p))) for p in (dotted, table)]
    assert read[0] == read[1] and read[0].grpo.num_generations == 4 and read[0].lora.r == 2


def test_a_run_saved_under_the_old_names_resumes(tmp_path, run_identity):
    """A run folder written before the renames keeps its old names in its saved config: read as named now."""
    config = RunConfig(run_name="x").to_run_config()
    old = {old: config[new] for old, new in RENAMED.items()} | {k: v for k, v in config.items() if k not in RENAMED.values()}
    assert current_keys(old) == config
    save_state(tmp_path, old, 2, ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))}), FedAgentAvg({0: 1}, clients_per_round=1), [], {})
    assert load_state(tmp_path, config).server_round == 2
    with pytest.raises(ValueError, match="grpo.num-generations: saved 8 vs now 4"):
        load_state(tmp_path, config | {"grpo.num-generations": 4})


def test_the_trainer_takes_the_grpo_section_itself(tiny_lm, maze_tokenizer):
    cfg = RunConfig.from_run_config({"device": "cpu", "grpo.beta": 0.0})
    trainer = GRPOTrainer(tiny_lm, maze_tokenizer, cfg.grpo, RolloutConfig(history_length=0), engine=cfg.engine,
                          placement=place_run(cfg))
    assert trainer.config is cfg.grpo
    with pytest.raises(ValueError, match="kl_reference='auto': expected a resolved one"):
        GRPOTrainer(tiny_lm, maze_tokenizer, cfg.grpo, RolloutConfig(history_length=0), engine=cfg.engine,
                    placement=replace(place_run(cfg), kl_reference="auto"))
