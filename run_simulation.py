#!/usr/bin/env python
"""Run the Flower app in simulation: every run-config key is a flag; see fedagent_flwr/simulation.py.

    python run_simulation.py --strategy fedagent-avg --env maze --num-clients 4 --clients-per-round 2
    python run_simulation.py --run-config configs/fedagent-cpu.toml --seed 1
"""

import sys

from fedagent_flwr.simulation import main

if __name__ == "__main__":
    sys.exit(main())
