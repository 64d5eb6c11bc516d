"""Two quick-start jobs at once: each has a SuperLink of its own, and stopping one (Ctrl-C, or a timeout's
SIGTERM) leaves no process of it behind and does not touch the other."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedagent_flwr.deployment import free_port
from fedagent_flwr.simulation import processes_of, stop, with_descendants

ROOT = Path(__file__).resolve().parents[2]
ENV = os.environ | {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_TELEMETRY_ENABLED": "0",
                    "RAY_AUTH_MODE": "disabled"}


@contextlib.contextmanager
def sigint_not_ignored():
    """Children started inside get SIGINT's default action. A shell without job control (`pytest ... &` in a script,
    nohup) starts its background commands with SIGINT ignored, and the ignore is inherited through exec: the jobs
    below would then shrug off the Ctrl-C this test sends and it would fail after 120 s (stop 41, twice). The test
    plays jobs started from an interactive shell, where Ctrl-C is live. A handler set here (not SIG_IGN) is reset
    to the default by exec."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Job:
    """`run_simulation.py` in a session of its own (as a job started from its own shell), its output collected."""

    def __init__(self, tmp_path: Path, name: str, rounds: int, env: dict[str, str] | None = None):
        cmd = [sys.executable, str(ROOT / "run_simulation.py"), "--num-clients", "2", "--clients-per-round", "1",
               "--num-server-rounds", str(rounds), "--grpo.tasks-per-epoch", "1", "--grpo.num-generations", "2", "--eval.tasks", "2",
               "--eval.samples-per-task", "1", "--eval.test-freq", "1", "--output-dir", str(tmp_path / name / "runs"),
               "--run-name", name]
        (tmp_path / name).mkdir()
        with sigint_not_ignored():
            self.proc = subprocess.Popen(cmd, cwd=tmp_path / name, env=ENV | (env or {}), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.env, self.lines = env or {}, []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        self.summary = tmp_path / name / "runs" / name / "summary.json"

    def wait_for(self, text: str, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in list(self.lines)):
            assert self.proc.poll() is None and time.time() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.5)

    def flwr_home(self) -> str:
        if "FLWR_HOME" in self.env:
            return self.env["FLWR_HOME"]
        line = next(line for line in self.lines if line.startswith("[run_simulation] a local SuperLink"))
        return line.split("FLWR_HOME=", 1)[1].split(")", 1)[0]

    def stopped_cleanly(self) -> None:
        """Exited within two minutes, and nothing started under its FLWR_HOME is alive (SuperLink, simulation, Ray).
        Two minutes, not one: with three Flower jobs on two cores a clean shutdown once took over 60 s (stop 22)."""
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError("still running 120 s after it was stopped:\n" + "".join(self.lines)[-3000:]) from None
        home = self.flwr_home()
        assert processes_of(home) == set(), "".join(self.lines)[-3000:]
        assert "FLWR_HOME" in self.env or not Path(home).exists()  # a home it was given is the caller's to keep


@pytest.mark.slow  # two whole jobs side by side: about 3 minutes, the default run's largest share (pytest -m slow)
def test_two_jobs_at_once_and_stopping_one_leaves_nothing_behind_and_the_other_finishes(tmp_path):
    # All three start together, so the kept job is still mid-run when the other two are stopped.
    jobs = [Job(tmp_path, "kept", rounds=30), Job(tmp_path, "ctrl-c", rounds=50), Job(tmp_path, "timeout", rounds=50)]
    kept, interrupted, timed_out = jobs
    try:
        interrupted.wait_for("[fedagent] round 0")  # Ray, the SuperLink and the ServerApp are all up
        os.killpg(interrupted.proc.pid, signal.SIGINT)  # what Ctrl-C in its shell sends: the whole foreground group
        timed_out.wait_for("[fedagent] round 0")
        timed_out.proc.send_signal(signal.SIGTERM)  # what `timeout` sends: to run_simulation.py alone
        interrupted.stopped_cleanly()
        timed_out.stopped_cleanly()
        assert kept.proc.poll() is None, "the kept job ended before both others were stopped: nothing was shown"
        assert kept.proc.wait(timeout=900) == 0, "".join(kept.lines)[-3000:]
    finally:
        for job in jobs:  # a failed test must not leave its runs behind either
            if job.proc.poll() is None:
                os.killpg(job.proc.pid, signal.SIGKILL)
            with contextlib.suppress(StopIteration):
                stop(processes_of(job.flwr_home()))
    assert kept.summary.exists() and not interrupted.summary.exists()
    ports = {line.split(" on port ", 1)[1].split()[0] for job in (kept, interrupted, timed_out) for line in job.lines
             if line.startswith("[run_simulation] a local SuperLink")}
    assert len(ports) == 3 and "39091" not in ports  # three SuperLinks, none on the shared default port
    kept.stopped_cleanly()


def test_a_job_on_a_superlink_home_and_ports_it_was_given_leaves_nothing_behind_when_stopped(tmp_path):
    """The protocols give each run its FLWR_HOME and ports. Stopping such a run once left the SuperLink's children
    running (its SuperExec, flwr-simulation and Ray sit in process groups of their own): two idle Ray actors holding
    a model each, found by hand after a stopped Table 1 protocol."""
    env = {"FLWR_HOME": str(tmp_path / "home"), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
    job = Job(tmp_path, "given", rounds=50, env=env)
    try:
        job.wait_for("[fedagent] round 0")  # flwr-simulation and Ray are up under the SuperLink
        job.proc.send_signal(signal.SIGTERM)
        job.stopped_cleanly()
        # one line says so, with the shell's code for a SIGTERM, and no traceback (issue 94)
        assert job.proc.returncode == 128 + signal.SIGTERM
        said = "".join(job.lines)
        assert "[run_simulation] stopped by SIGTERM" in said and "Traceback" not in said, said[-3000:]
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
        stop(processes_of(env["FLWR_HOME"]))


def test_with_descendants_reaches_a_grandchild_in_a_session_of_its_own():
    # As the SuperLink's SuperExec does: a child that starts a new session (its own process group), then a grandchild.
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            "start_new_session=True); print('up', flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "up"
        tree = with_descendants({parent.pid})
        assert parent.pid in tree and len(tree) == 2  # the parent and the grandchild in its own session
        grandchild = (tree - {parent.pid}).pop()
        assert os.getpgid(grandchild) != os.getpgid(parent.pid)
        stop(tree)
        assert parent.wait(timeout=10) == -signal.SIGTERM
        with contextlib.suppress(FileNotFoundError):  # gone, or a zombie where PID 1 does not reap orphans
            assert Path(f"/proc/{grandchild}/stat").read_text().split(") ", 1)[1].startswith("Z")
    finally:
        parent.kill()
        parent.stdout.close()
