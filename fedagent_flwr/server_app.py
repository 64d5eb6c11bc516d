"""ServerApp: parse the run config once and check what it needs of this machine (bad input fails before any work),
then run the federation."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedagent_flwr.config import RunConfig
from fedagent_flwr.federation import run_federation
from fedagent_flwr.runs.preflight import preflight

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = RunConfig.from_run_config(dict(context.run_config))  # fails fast on bad input
    preflight(cfg, "server")
    run_federation(grid, cfg, context)
