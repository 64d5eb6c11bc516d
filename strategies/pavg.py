"""PAvg (Jin et al., Algorithm 2): average policies after E local policy-gradient steps.

variant "soft" (SoftPAvg): softmax policies; clients ascend the logits and the
server averages logit tables. variant "proj" (ProjPAvg): tables are policies,
pi(.|s) on the probability simplex; clients take projected gradient steps, and
the server averages the tables. An average of simplex points is on the simplex,
so the global table stays a policy as long as every reply is one: a reply whose
rows are not probability distributions is rejected. Deep (DDPGAvg): the same round
with actor and critic weights, each client training E episodes of DDPG; a
personalised client's environment embedding never appears in a reply.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ArrayRecord, MetricRecord

from strategies.fedrl_avg import FedRLAvg, reject_private_arrays

VARIANTS = {"soft": "softpavg", "proj": "projpavg"}
SIMPLEX_TOL = 1e-9


class PAvg(FedRLAvg):
    """Averages policy tables (soft: logits; proj: simplex rows) after E local steps; E = inf is the baseline."""

    def __init__(self, node_of_partition: Mapping[int, int], local_steps: int | None, variant: str = "soft", **kwargs) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"PAvg variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        self.variant = variant
        self.algorithm = VARIANTS[variant]
        super().__init__(node_of_partition, local_steps, **kwargs)

    def check_params(self, arrays: ArrayRecord, metrics: MetricRecord) -> None:
        reject_private_arrays(arrays)  # deep PAvg (DDPGAvg): actor and critic weights only
        if self.variant != "proj":
            return
        for key in arrays.keys():
            table = arrays[key].numpy()
            if table.min() < -SIMPLEX_TOL or np.abs(table.sum(-1) - 1.0).max() > SIMPLEX_TOL:
                raise ValueError(f"ProjPAvg table {key!r} has rows off the probability simplex")
