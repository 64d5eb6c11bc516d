"""Kill a run anywhere, damage its state now and then, resume: the weights end bit-identical to a run never stopped.

Ten trials (python -m pytest -q -m slow tests/integration/test_kill_and_resume.py -s prints the trial table):
each runs the real server loop and ClientApp in one process (tests/federation_driver.py) and kills it with
SIGKILL either at a random moment after a saved round or at a chosen file-system step (a state file write or a
rename: inside a checkpoint); three trials then damage one file of the newest state (truncated, one byte
flipped, deleted), which the resume must notice and fall back from. Each trial resumes until the run is done.
"""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from fedagent_flwr.config import RunConfig
from fedagent_flwr.runs.resume import saved_round

DRIVER = Path(__file__).resolve().parents[1] / "federation_driver.py"
ROUNDS = 4
SMALL = {"num-server-rounds": ROUNDS, "clients-per-round": 2, "num-clients": 3, "grpo.tasks-per-epoch": 1, "grpo.num-generations": 2,
         "eval.tasks": 1, "eval.samples-per-task": 1, "eval.test-freq": 2, "eval.transcripts": 0, "seed": 3}
# (how the run is stopped, damage to the newest state afterwards)
TRIALS = [("time", None), ("time", "truncate"), ("time", None), ("step", None), ("time", "flip"), ("step", None),
          ("time", "delete"), ("step", None), ("time", None), ("step", None)]


def _config(out: Path, name: str, **extra) -> str:
    return json.dumps(RunConfig().to_run_config() | SMALL | {"output-dir": str(out), "run-name": name} | extra)


def _run(config: str, kill_at: int | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(DRIVER), config] + ([str(kill_at)] if kill_at else [])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _kill_after(config: str, run_dir: Path, saved: int, delay: float) -> None:
    """SIGKILL `delay` seconds after the run saved round `saved`."""
    proc = subprocess.Popen([sys.executable, str(DRIVER), config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while (saved_round(run_dir) or 0) < saved and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _damage(run_dir: Path, how: str, rng: random.Random) -> str:
    name = rng.choice(["arrays.safetensors", "server.json", "config.json"])
    path = run_dir / "state" / name
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 3])
    elif how == "flip":
        i = rng.randrange(len(data))
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:])
    else:
        path.unlink()
    return name


def _final_arrays(run_dir: Path) -> dict:
    return load_file(str(run_dir / "state" / "arrays.safetensors"))


@pytest.mark.slow
def test_runs_killed_anywhere_and_resumed_end_bit_identical(tmp_path):
    out = tmp_path / "runs"
    reference = _run(_config(out, "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = _final_arrays(out / "reference")
    rng = random.Random(0)
    table = []
    for trial, (stop, damage) in enumerate(TRIALS):
        name = f"trial-{trial}"
        run_dir = out / name
        if stop == "time":
            # a damaged state needs an older one to fall back to: those trials wait for round 2
            _kill_after(_config(out, name), run_dir, saved=2 if damage else 1, delay=rng.uniform(0.0, 3.0))
            where = "random moment"
        else:
            # steps 1..~20 cover round 0's writes and round 1's state; later ones land in later rounds' saves
            steps = rng.randint(12, 60)
            proc = _run(_config(out, name), kill_at=steps)
            site = [line for line in proc.stderr.splitlines() if line.startswith("[driver] killed in ")]
            where = f"file-system step {steps}: " + (site[0].removeprefix("[driver] killed in ") if site else "?")
            if proc.returncode == 0:  # the run had fewer steps: it finished; nothing to resume
                table.append((trial, where, saved_round(run_dir), "-", "finished before the kill", True))
                assert {k: v.tobytes() for k, v in _final_arrays(run_dir).items()} == {k: v.tobytes() for k, v in want.items()}
                continue
        killed_at = saved_round(run_dir)
        # damage the newest state only where an older one is left to fall back to
        can_damage = damage and (run_dir / "state").exists() and (run_dir / "state.previous").exists()
        damaged = _damage(run_dir, damage, rng) if can_damage else "-"
        if killed_at == ROUNDS and damaged == "-":  # the run ended before the kill: nothing to resume
            table.append((trial, where, killed_at, "-", "finished before the kill", True))
            assert {k: v.tobytes() for k, v in _final_arrays(run_dir).items()} == {k: v.tobytes() for k, v in want.items()}
            continue
        if killed_at is None:  # killed before the first state: the run starts again under a new name
            run_dir = out / f"{name}-again"
            resumed = _run(_config(out, f"{name}-again"))
        else:
            resumed = _run(_config(out, name, resume=True))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        got = _final_arrays(run_dir)
        same = set(got) == set(want) and all(got[k].tobytes() == want[k].tobytes() for k in want)
        fell_back = "resuming from" in resumed.stdout
        table.append((trial, where, killed_at, damaged, "fell back to state.previous" if fell_back else "", same))
        assert same, f"trial {trial}: weights differ after resume"
        if damaged != "-":
            assert fell_back, resumed.stdout[-2000:]
    print("\ntrial | stopped at | last saved round | damaged file | resume | bit-identical")
    for row in table:
        print(" | ".join(str(x) for x in row))
