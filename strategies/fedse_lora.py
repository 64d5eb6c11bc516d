"""FedSE-LoRA: Fed-SE's server (Algorithm 1 and eq. 8 of the Fed-SE paper).

The global model is a LoRA adapter on a frozen base. Every round the server
sends it to all clients (or a seeded sample of them), each client returns its
locally fine-tuned adapter, and the server replaces the global adapter by an
aggregate; every client restarts the next round from it (re-anchoring, eq. 9).

Aggregations (pure functions below, no Flower needed):
- `mean`: unweighted average of each A and each B matrix (eq. 8).
- `weighted`: the same, weighted by each client's successes this round (the
  paper's "weighted averaging" ablation); uniform if nobody succeeded.
- `exact`: averaging A and B separately is not the average of the updates B·A.
  The mean of the K products is exactly [B_1 .. B_K]/K · [A_1; ..; A_K] (rank
  <= K·r); it is re-factorised to rank r by truncated SVD and the truncation's
  relative Frobenius error is reported.
Whatever the mode, the error of the factor-wise mean against the exact mean of
products is reported too, so the two can be compared on real adapters.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from fedagent_flwr.config.choices import FEDSE_AGGREGATIONS
from strategies.fedagent_avg import FedAgentAvg

log = logging.getLogger(__name__)

SUCCESS_METRIC = "fedse/new-successes"  # the client metric `weighted` reads
RUN_KEY = "fedse-run-key"  # train-config entry naming the clients' buffer folders


def lora_pairs(keys: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Module prefix -> (A key, B key) for every LoRA module among the keys."""
    keys = set(keys)
    pairs = {}
    for key in keys:
        if ".lora_A." in key:
            prefix, _, suffix = key.partition(".lora_A.")
            b_key = f"{prefix}.lora_B.{suffix}"
            if b_key not in keys:
                raise ValueError(f"LoRA key {key!r} has no matching {b_key!r}")
            pairs[prefix] = (key, b_key)
    return pairs


def _normalised(weights: Sequence[float] | None, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or (w < 0).any() or not np.isfinite(w).all():
        raise ValueError(f"weights must be {n} finite non-negative numbers, got {list(weights)}")
    if w.sum() == 0:
        return np.full(n, 1.0 / n)  # nobody has a claim: fall back to the plain mean
    return w / w.sum()


def average_factors(adapters: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """(Weighted) mean of every tensor, A and B separately (eq. 8); computed in float64."""
    if not adapters:
        raise ValueError("need at least one adapter")
    w = _normalised(weights, len(adapters))
    out = {}
    for key, ref in adapters[0].items():
        stack = np.stack([np.asarray(a[key], dtype=np.float64) for a in adapters])
        if stack.shape[1:] != ref.shape:
            raise ValueError(f"tensor {key!r}: shapes differ across adapters")
        out[key] = np.tensordot(w, stack, axes=1).astype(ref.dtype)
    return out


def mean_of_products(a_list: Sequence[np.ndarray], b_list: Sequence[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """sum_k w_k B_k A_k, the exact average update of one module (out x in)."""
    return sum(w * (b.astype(np.float64) @ a.astype(np.float64)) for w, a, b in zip(weights, a_list, b_list))


def refactorise(a_list: Sequence[np.ndarray], b_list: Sequence[np.ndarray], weights: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Rank-r factors (A', B') of sum_k w_k B_k A_k, and the truncation's relative Frobenius error.

    The stacked factors B_s = [w_1 B_1 .. w_K B_K] (out x Kr) and A_s = [A_1; ..; A_K]
    (Kr x in) give the mean update exactly as B_s A_s. Thin QR of both reduces its
    SVD to one of a Kr x Kr core, so the out x in matrix is never decomposed (this
    matters for 4096 x 4096 projections). A' = V_r^T keeps orthonormal rows and
    B' = U_r S_r carries the scale: splitting sqrt(S) into both would make A' zero
    wherever the update has rank < r (e.g. after a round from B = 0), and LoRA
    cannot leave A = B = 0 (both gradients vanish).
    """
    b_stack = np.concatenate([w * b.astype(np.float64) for w, b in zip(weights, b_list)], axis=1)
    a_stack = np.concatenate([a.astype(np.float64) for a in a_list], axis=0)
    q_b, r_b = np.linalg.qr(b_stack)
    q_a, r_a = np.linalg.qr(a_stack.T)
    u, s, vt = np.linalg.svd(r_b @ r_a.T)
    u, v = q_b @ u, q_a @ vt.T
    if v.shape[1] < rank:  # fewer input features than r: nothing to truncate
        raise ValueError(f"rank {rank} exceeds the module's input size {v.shape[0]}")
    total = float(np.sum(s**2))
    error = float(np.sqrt(np.sum(s[rank:] ** 2) / total)) if total > 0 else 0.0
    if u.shape[1] < rank:  # Kr < r cannot happen for K >= 1; kept for safety of the slices
        raise ValueError("stacked rank is smaller than the adapter rank")
    new_b = u[:, :rank] * s[:rank]
    new_a = v[:, :rank].T
    return new_a.astype(a_list[0].dtype), new_b.astype(b_list[0].dtype), error


def factor_mean_error(a_list: Sequence[np.ndarray], b_list: Sequence[np.ndarray], weights: np.ndarray) -> tuple[float, float]:
    """||mean(B)·mean(A) - mean(B·A)||_F and ||mean(B·A)||_F for one module."""
    exact = mean_of_products(a_list, b_list, weights)
    a_bar = sum(w * a.astype(np.float64) for w, a in zip(weights, a_list))
    b_bar = sum(w * b.astype(np.float64) for w, b in zip(weights, b_list))
    return float(np.linalg.norm(b_bar @ a_bar - exact)), float(np.linalg.norm(exact))


def aggregate_adapters(
    adapters: Sequence[Mapping[str, np.ndarray]],
    mode: str = "mean",
    successes: Sequence[float] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Aggregate LoRA adapters (dicts of numpy arrays with PEFT key names); returns (adapter, metrics).

    metrics: `agg/factor-mean-rel-error` (relative Frobenius error of the factor-wise
    mean's product against the exact mean of products, over all modules) always;
    `agg/svd-rank-r-rel-error` (the truncation error, over all modules) for `exact`.
    """
    if mode not in FEDSE_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {FEDSE_AGGREGATIONS}, got {mode!r}")
    if not adapters:
        raise ValueError("need at least one adapter")
    if mode == "weighted" and successes is None:
        raise ValueError("weighted aggregation needs each client's number of successes")
    weights = _normalised(successes if mode == "weighted" else None, len(adapters))
    pairs = lora_pairs(adapters[0].keys())
    err_sq = norm_sq = 0.0
    for a_key, b_key in pairs.values():
        e, n = factor_mean_error([x[a_key] for x in adapters], [x[b_key] for x in adapters], weights)
        err_sq, norm_sq = err_sq + e**2, norm_sq + n**2
    metrics = {"agg/factor-mean-rel-error": float(np.sqrt(err_sq / norm_sq)) if norm_sq > 0 else 0.0}
    out = average_factors(adapters, weights)
    if mode == "exact":
        trunc_sq = 0.0
        for a_key, b_key in pairs.values():
            a_list, b_list = [x[a_key] for x in adapters], [x[b_key] for x in adapters]
            rank = a_list[0].shape[0]
            new_a, new_b, rel = refactorise(a_list, b_list, weights, rank)
            out[a_key], out[b_key] = new_a, new_b
            trunc_sq += (rel**2) * float(np.linalg.norm(mean_of_products(a_list, b_list, weights)) ** 2)
        metrics["agg/svd-rank-r-rel-error"] = float(np.sqrt(trunc_sq / norm_sq)) if norm_sq > 0 else 0.0
    return out, metrics


def clients_for_fraction(num_clients: int, fraction: float) -> int:
    """Clients per round for a sampled fraction: round(fraction x K), at least 1."""
    if not 0 < fraction <= 1:
        raise ValueError(f"client fraction must be in (0, 1], got {fraction}")
    return max(1, int(round(fraction * num_clients)))


class FedSELoRA(FedAgentAvg):
    """FedAgentAvg's seeded sampling and reply checks, with LoRA-aware aggregation."""

    def __init__(
        self,
        node_of_partition: Mapping[int, int],
        clients_per_round: int | None = None,
        seed: int = 0,
        min_replies: int = 1,
        aggregation: str = "mean",
        run_key: str | None = None,
        transfer_dtype: str = "fp32",
    ) -> None:
        if aggregation not in FEDSE_AGGREGATIONS:
            raise ValueError(f"fedse.aggregation={aggregation!r} is not allowed: expected one of {', '.join(FEDSE_AGGREGATIONS)}")
        k = len(node_of_partition)
        super().__init__(node_of_partition, clients_per_round or k, seed, min(min_replies, clients_per_round or k), transfer_dtype)
        self.aggregation = aggregation
        # Names the clients' buffer folders. Fresh for every new run; a resumed run restores it with
        # the rest of the strategy's state (fedagent_flwr/runs/resume.py), so clients find the buffers they grew.
        self.run_key = run_key or uuid.uuid4().hex[:12]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if not lora_pairs(arrays.keys()):
            raise ValueError("FedSE-LoRA's global model must be a LoRA adapter (keys with lora_A / lora_B)")
        config = ConfigRecord(dict(config))
        config[RUN_KEY] = self.run_key  # the clients' buffer folders
        return super().configure_train(server_round, arrays, config, grid)

    def check_params(self, arrays: ArrayRecord, metrics: MetricRecord) -> None:
        if self.aggregation == "weighted" and SUCCESS_METRIC not in metrics:
            raise ValueError(f"weighted aggregation needs the metric {SUCCESS_METRIC!r}")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good, metrics, merged = self.collect_replies(server_round, replies)
        if not self.enough_replies(server_round, good):
            return None, merged
        adapters = [{k: r[k].numpy() for k in r.keys()} for r in good]
        successes = [float(m[SUCCESS_METRIC]) for m in metrics] if self.aggregation == "weighted" else None
        aggregated, agg_metrics = aggregate_adapters(adapters, self.aggregation, successes)
        merged.update(agg_metrics)
        out = ArrayRecord()
        for key in self._global.keys():  # keep the global record's key order
            out[key] = Array(np.ascontiguousarray(aggregated[key]))
        return out, merged

    def summary(self) -> None:
        log.info("FedSE-LoRA: K=%d clients, M=%d per round, aggregation=%s", self.num_clients, self.clients_per_round, self.aggregation)
