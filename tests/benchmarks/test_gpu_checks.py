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
    card = load_script("raw_output").card()  # "cpu" here
    assert session.name in {f"{d}-{load_script('raw_output').slug(card['name'])}" for d in dates}
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
