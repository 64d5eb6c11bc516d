"""benchmarks/gpu_checks.sh at SHAPE=tiny on a CPU: the folder and files a GPU session leaves, without a GPU."""

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
# the script calls python3: this interpreter, first on the PATH
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "SHAPE": "tiny"}


def _dates() -> set[str]:
    return {datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def test_a_stage_writes_its_log_and_json_into_the_dated_card_folder(tmp_path):
    dates = _dates()
    done = subprocess.run(["bash", "benchmarks/gpu_checks.sh", str(tmp_path), "prefill"], cwd=REPO,
                          capture_output=True, text=True, timeout=180, env=ENV)
    dates |= _dates()  # a run across midnight UTC may take either date
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (session,) = tmp_path.iterdir()
    card = load_script("raw_output").card()  # "cpu" here: the folder is named by the processor
    from fedagent_flwr.agent.engine.cpu_rates import this_processor

    kind = this_processor().slug() if card["name"] == "cpu" else load_script("raw_output").slug(card["name"])
    assert session.name in {f"{d}-{kind}" for d in dates}
    assert sorted(p.name for p in session.iterdir()) == ["card.txt", "prefill.json", "prefill.log"]
    assert session.joinpath("card.txt").read_text().startswith(card["name"])
    log = session.joinpath("prefill.log").read_text()
    assert "] prefill" in log and "rc 0" in log and f"wrote {session / 'prefill.json'}" in log
    record = json.loads(session.joinpath("prefill.json").read_text())
    raw = record["raw_output"]
    assert raw["stage"] == "prefill" and raw["rc"] == 0 and raw["card"] == card
    assert raw["command"][:4] == ["timeout", "90", "python3", "benchmarks/prefill_profile.py"]
    assert raw["environment"]["SHAPE"] == "tiny" and raw["git"]["commit"]
    assert raw["settings"]["arguments"]["shape"] == "tiny" and raw["settings"]["arguments"]["repeats"] == 3
    assert raw["times"]["variants.whole.ms"] > 0 and raw["times"]["variants.shared prefixes.ms"] > 0
    assert record["prompts"] == 16 * 8 and record["variants"]["shared prefixes"]["groups"] == 16


def test_an_unknown_stage_stops_before_anything_runs_or_is_written(tmp_path):
    done = subprocess.run(["bash", "benchmarks/gpu_checks.sh", str(tmp_path), "prefill", "no-such-stage"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 2 and "unknown stage no-such-stage" in done.stdout
    assert list(tmp_path.iterdir()) == []


STAGES = ("tests ranks waits decode decode-compile round-compile prefill update round-static round-hf round-fast round-auto "
          "kernels round-kernels passes round-passes wait-tests levers round-levers profile-fast").split()


def test_every_stages_arguments_parse_as_its_script_parses_them(tmp_path):
    """DRY=1 prints each stage's commands instead of running them: every --variant must parse as update_profile.py
    parses it and every round's --set and --paper-set lists as gpu_round.py parses them (a key set twice is refused),
    with ROUND_SET over them, and the rounds after levers, passes and kernels take a fastest variant. The lent H100 of
    2026-12-05 lost its levers and round-levers stages to a grpo.ppo-micro-batch-size-per-gpu set twice."""
    from fedagent_flwr.simulation import parse_overrides

    session = tmp_path / "results"
    dry = {**ENV, "DRY": "1", "ROUND_SET": "--set grpo.ppo-micro-batch-size-per-gpu=32"}
    folder = subprocess.run(["python3", "benchmarks/raw_output.py", "folder", str(session)], cwd=REPO, capture_output=True,
                            text=True, env=dry, check=True).stdout.strip()
    Path(folder).mkdir(parents=True)
    fastest = {"variant": {"grpo.ppo-micro-batch-size-per-gpu": 32, "grpo.log-prob-micro-batch-size-per-gpu": 64, "engine.logprob-chunk-tokens": 1024,
                           "grpo.group-by-length": True, "engine.training-kernels": "eager"},
               "logprobs_s": 1.0, "update_s": 1.0}
    for name in ("levers", "passes", "kernels"):
        Path(folder, f"{name}.json").write_text(json.dumps({"variants": [fastest]}))
    done = subprocess.run(["bash", "benchmarks/gpu_checks.sh", str(session), *STAGES], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dry)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    commands = {line.split(":", 1)[0][4:]: line.split(": python3 ", 1)[1].split()
                for line in done.stdout.splitlines() if line.startswith("DRY ")}
    parse_variant = load_script("update_profile").parse_variant
    rounds = [name for name, words in commands.items() if "benchmarks/gpu_round.py" in words]
    assert sorted(rounds) == sorted(["round-compile", "round-static", "round-hf", "round-fast", "round-auto",
                                     "round-kernels", "round-passes", "round-levers"])
    for name, words in commands.items():
        pairs = list(zip(words, words[1:]))
        for flag, value in pairs:
            if flag == "--variant":
                parse_variant(value)  # raises on a key set twice
        for flag in ("--set", "--paper-set"):
            values = parse_overrides([value for f, value in pairs if f == flag])
            if name in rounds and flag == "--set":
                assert values["grpo.ppo-micro-batch-size-per-gpu"] == 32, name  # ROUND_SET over every round's own value
    assert parse_overrides([v for f, v in zip(commands["round-auto"], commands["round-auto"][1:]) if f == "--set"])[
        "grpo.tasks-per-epoch"] == 64
    assert {"test_decode.py", "test_ranked_round.py"} <= {Path(w).name for words in commands.values() for w in words}
