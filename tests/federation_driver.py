"""A whole federated run in one process (the real server loop and ClientApp over a loopback grid), for tests that
kill it: `python tests/federation_driver.py RUN_CONFIG_JSON [KILL_AT_WRITE]`.

With KILL_AT_WRITE = n the process kills itself (SIGKILL, no cleanup) at the n-th file-system step: a write of a
state file or any rename (the state folders' swap, metrics, checkpoints), so a test can stop a run inside a
checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import torch
    from flwr.supercore.task_identity import TaskIdentity
    from loopback_grid import LoopbackGrid

    from fedagent_flwr.config import RunConfig
    from fedagent_flwr.federation import run_federation
    from fedagent_flwr.runs import resume

    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = 1, 0, 0  # as a running ServerApp has
    torch.set_num_threads(1)
    run_config = json.loads(sys.argv[1])
    if len(sys.argv) > 2:
        remaining = [int(sys.argv[2])]

        def counted(fn):
            def step(*args, **kwargs):
                remaining[0] -= 1
                if remaining[0] == 0:
                    where = [Path(a).name for a in args if isinstance(a, (str, os.PathLike))]
                    print(f"[driver] killed in {fn.__name__}({', '.join(where)})", file=sys.stderr, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                return fn(*args, **kwargs)
            return step

        resume._write = counted(resume._write)
        resume.save_file = counted(resume.save_file)
        os.replace = counted(os.replace)  # every rename: the state's, and the run folder's atomic writes
    run_federation(LoopbackGrid(run_config, int(run_config["num-clients"])), RunConfig.from_run_config(run_config))


if __name__ == "__main__":
    main()
