"""A client's experience buffer D_train (Fed-SE eq. 6), kept on the client's own disk.

Entries are trajectories as the model saw them: per step the prompt's token ids
and the completion's token ids (the NLL trains on the completion only). The seed
set D_k^0 (expert demonstrations) is stored with round -1; trajectories found by
exploration carry the round that found them. The file is rewritten atomically
after every change, so a ClientApp that is restarted (a new process, or a new
object) reads exactly what the last completed round left, and a round that is
replayed replaces its own earlier entries instead of duplicating them.

The buffer never leaves the client: nothing here is sent to the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fedagent_flwr.agent.play.rollout import Trajectory
from fedagent_flwr.atomic import atomic_write_text

FORMAT_VERSION = 1
SEED_ROUND = -1


@dataclass
class StoredTrajectory:
    task_id: str
    round: int  # SEED_ROUND for D_k^0, else the server round that found it
    won: bool
    steps: list[tuple[list[int], list[int]]]  # (prompt ids, completion ids) per agent step

    @classmethod
    def from_trajectory(cls, traj: Trajectory, server_round: int) -> StoredTrajectory:
        return cls(task_id=str(traj.task.id), round=server_round, won=bool(traj.won),
                   steps=[(list(s.prompt_ids), list(s.completion_ids)) for s in traj.steps])


class ExperienceBuffer:
    """Cumulative per-client trajectory store at `<directory>/buffer.json`."""

    def __init__(self, directory: Path, base_fingerprint: str = "") -> None:
        self.directory = Path(directory)
        self.path = self.directory / "buffer.json"
        self.base_fingerprint = base_fingerprint
        self.entries: list[StoredTrajectory] = []
        if self.path.exists():
            data = json.loads(self.path.read_text())
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"{self.path}: buffer format {data.get('version')!r}, expected {FORMAT_VERSION}")
            stored = data.get("base_fingerprint", "")
            if base_fingerprint and stored and stored != base_fingerprint:
                # Token ids of another model's tokenizer would train on garbage.
                raise ValueError(f"{self.path} was written for another base model (fingerprint {stored[:12]}); "
                                 "use another fedse.buffer-dir or delete it")
            self.entries = [StoredTrajectory(e["task_id"], int(e["round"]), bool(e["won"]), [tuple(s) for s in e["steps"]])
                            for e in data["entries"]]

    # ----- changes (each one is saved at once) ------------------------------------------------
    @property
    def seeded(self) -> bool:
        return any(e.round == SEED_ROUND for e in self.entries)

    def seed(self, trajectories: Iterable[Trajectory | StoredTrajectory]) -> int:
        """Store D_k^0 unless the buffer already holds it (played episodes, or entries read from seed data); returns
        the entries added."""
        if self.seeded:
            return 0
        new = [t if isinstance(t, StoredTrajectory) else StoredTrajectory.from_trajectory(t, SEED_ROUND) for t in trajectories]
        self.entries = new + self.entries
        self.save()
        return len(new)

    def add_round(self, server_round: int, trajectories: Sequence[Trajectory], keep_history: bool = True) -> int:
        """Add round t's kept trajectories: D_t = D_{t-1} u new (keep_history) or D^0 u new (w/o history).

        Entries of this round or later (a replay after a restart) are replaced.
        """
        if server_round < 0:
            raise ValueError(f"server_round must be >= 0, got {server_round}")
        kept = [e for e in self.entries if e.round < server_round and (keep_history or e.round == SEED_ROUND)]
        new = [StoredTrajectory.from_trajectory(t, server_round) for t in trajectories]
        self.entries = kept + new
        self.save()
        return len(new)

    def save(self) -> None:
        data = {"version": FORMAT_VERSION, "base_fingerprint": self.base_fingerprint,
                "entries": [asdict(e) for e in self.entries]}
        atomic_write_text(self.path, json.dumps(data, separators=(",", ":")))

    # ----- reading ---------------------------------------------------------------------------
    def samples(self) -> list[tuple[list[int], list[int]]]:
        """Every stored agent step as a (prompt ids, completion ids) training sample."""
        return [step for e in self.entries for step in e.steps]

    def __len__(self) -> int:
        return len(self.entries)

    def stats(self) -> dict[str, float]:
        return {
            "buffer-trajectories": float(len(self.entries)),
            "buffer-steps": float(sum(len(e.steps) for e in self.entries)),
            "buffer-seed-trajectories": float(sum(e.round == SEED_ROUND for e in self.entries)),
            "buffer-won-fraction": sum(e.won for e in self.entries) / len(self.entries) if self.entries else 0.0,
        }
