"""The agent's own words: held-out episodes as readable text.

Metrics say how often the agent succeeds; only its completions say why it fails (prose instead of the answer
format, a misspelt action, a loop). Each evaluation writes a few episodes in full - per step the observation,
the model's whole completion, the action parsed from it, whether it was valid, and the reward - and the
console shows one step of one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedagent_flwr.agent.play.rollout import Trajectory


def sample_episodes(trajectories: Sequence[Trajectory], k: int) -> list[Trajectory]:
    """Up to k episodes, successes and failures alike: alternately the first won and the first lost not yet taken
    (held-out tasks come in a fixed order, so the same tasks are shown at every evaluation)."""
    won = [t for t in trajectories if t.won]
    lost = [t for t in trajectories if not t.won]
    out: list[Trajectory] = []
    while len(out) < k and (won or lost):
        for pool in (lost, won):
            if pool and len(out) < k:
                out.append(pool.pop(0))
    return out


def format_episode(traj: Trajectory, index: int = 0) -> str:
    task = traj.task
    lines = [f"=== episode {index}: task {task.id} ({task.category}); "
             f"{'success' if traj.won else 'failure'} after {len(traj.steps)} steps, reward {traj.reward:.3f}"]
    for n, step in enumerate(traj.steps, 1):
        lines += [f"--- step {n}", "observation:", _indent(step.observation), "completion:", _indent(step.completion),
                  f"action: {step.action!r}  valid: {'yes' if step.valid else 'no'}  reward: {step.reward:g}"]
    return "\n".join(lines)


def write_transcripts(path: Path, trajectories: Sequence[Trajectory], k: int, header: str = "") -> Path:
    """Write up to k sampled episodes to `path` (atomically); returns it."""
    text = "\n\n".join(format_episode(t, i) for i, t in enumerate(sample_episodes(trajectories, k), 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text((header + "\n\n" if header else "") + text + "\n")
    tmp.replace(path)
    return path


def short_example(trajectories: Sequence[Trajectory], width: int = 160) -> str:
    """One step of one sampled episode in a line: what the model wrote and what became of it."""
    chosen = sample_episodes(trajectories, 1)
    if not chosen or not chosen[0].steps:
        return "(no steps)"
    step = chosen[0].steps[0]
    written = " ".join(step.completion.split())
    if len(written) > width:
        written = written[: width - 3] + "..."
    return f"task {chosen[0].task.id}, step 1 wrote {written!r} -> action {step.action!r} ({'valid' if step.valid else 'invalid'})"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in (text.splitlines() or [""]))
