"""Plain progress lines for a long loop: "name: 12/32 episodes (37%), 1:05 elapsed, 1:50 left".

Plain lines, not a tqdm bar: carriage returns garble a log that Flower or Ray streams line by line. A loop shorter
than `after_seconds` prints nothing, so fast runs (the tiny default job, the tests) keep their output as it was."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def clock(seconds: float) -> str:
    """Seconds below a minute ("4.2 s"), else m:ss, or h:mm:ss from an hour on."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ProgressLines:
    """Says how far a loop of `total` items has come, once `after_seconds` have passed and then at most every
    `every_seconds`. The time left assumes the items left cost what the finished ones did on average; for items
    played side by side in steps (a batch of episodes, which mostly end together), pass the step and the most steps
    an item may take: the time left is then at most the steps left at the mean step's cost so far (a step costs less
    as items finish)."""

    def __init__(self, name: str, unit: str = "episodes", after_seconds: float = 60.0, every_seconds: float = 60.0,
                 say: Callable[[str], None] = _stderr, now: Callable[[], float] = time.perf_counter) -> None:
        self.name, self.unit, self.after, self.every, self.say, self.now = name, unit, after_seconds, every_seconds, say, now
        self.started = self.last_said = now()

    def update(self, done: int, total: int, step: int | None = None, max_steps: int | None = None) -> None:
        now = self.now()
        elapsed = now - self.started
        if elapsed < self.after or now - self.last_said < self.every or done >= total:
            return
        if step is not None and max_steps is not None and 0 < step < max_steps:
            left = f"at most {clock(elapsed / step * (max_steps - step))} left"
            where = f"step {step} of at most {max_steps}, {done}/{total} {self.unit} done"
        elif done > 0:
            left = f"about {clock(elapsed / done * (total - done))} left"
            where = f"{done}/{total} {self.unit} ({100 * done // total}%)"
        else:
            return
        self.last_said = now
        self.say(f"[fedagent] {self.name}: {where}, {clock(elapsed)} elapsed, {left}")
