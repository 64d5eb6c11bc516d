"""Central differential privacy for the LLM strategies: Flower's fixed-clipping wrappers.

`privacy.dp-mode = "server-side"` wraps the strategy in Flower's
DifferentialPrivacyServerSideFixedClipping: the server clips each client's
update (local weights minus the global weights it sent) to L2 norm
`privacy.clipping-norm`, aggregates, and adds Gaussian noise of standard deviation
`privacy.noise-multiplier * privacy.clipping-norm / clients-per-round` to every aggregated
coordinate. `"client-side"` uses DifferentialPrivacyClientSideFixedClipping: the
ClientApp's mod (`clip_when_asked`) clips before anything leaves the client, so
the server never sees an unclipped update; the server still adds the noise.

Two changes to Flower's wrappers. They skip a whole round when any reply carries
an error and assume every reply has the global model's shapes: here the inner
strategy screens the replies first (the same checks it applies without DP), so a
failed client is logged and left out and the round goes on. And their clipping
divides by the update's norm, which raises for a client that returns the weights
unchanged (a GRPO round whose groups all tied does): `clip_update` is the same
FlatClip scaling, min(1, C / norm), with that case kept as it is.
The noise is drawn from NumPy's global generator, which is never seeded here: a
noise sequence anyone can regenerate from a public seed would protect nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MessageType, MetricRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from strategies.transfer import array_view
from fedagent_flwr.config.choices import DP_MODES


def _updates(record: ArrayRecord, reference: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: record[k].numpy().astype(np.float64) - reference[k].numpy().astype(np.float64) for k in record.keys()}


def _norm(updates: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(float(np.sum(u * u)) for u in updates.values())))


def update_norm(record: ArrayRecord, reference: ArrayRecord) -> float:
    """L2 norm, over all arrays, of `record` minus `reference` (what DP clipping bounds).

    One tensor at a time, read in place: every client reports it every round, and holding the whole update in
    float64 would cost 8 bytes a parameter (4 GB for a 0.5B model) on top of the model."""
    squares = 0.0
    for k in record.keys():
        u = array_view(record[k]).astype(np.float64) - array_view(reference[k])
        squares += float(np.dot(u.ravel(), u.ravel()))
    return float(np.sqrt(squares))


def clip_update(record: ArrayRecord, reference: ArrayRecord, clipping_norm: float) -> ArrayRecord:
    """`record` moved back towards `reference` so that the update's L2 norm (over all arrays) is at most the norm."""
    updates = _updates(record, reference)
    norm = _norm(updates)
    if norm <= clipping_norm:
        return record
    scale = clipping_norm / norm
    return ArrayRecord({k: Array(np.ascontiguousarray((reference[k].numpy() + updates[k] * scale).astype(record[k].numpy().dtype)))
                        for k in record.keys()})


class _InnerBookkeeping:
    """The server reads the inner strategy's bookkeeping (sampled clients, failures, metrics) through the wrapper."""

    def __getattr__(self, name: str):
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)


class ServerSideDP(_InnerBookkeeping, DifferentialPrivacyServerSideFixedClipping):
    """Server-side fixed clipping + Gaussian noise (the server sees raw updates, the model does not)."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept = self.strategy.screen_replies(server_round, replies)
        event = self._pop_pending_event(server_round)
        for reply in kept:
            reply.content["arrays"] = clip_update(reply.content.array_records["arrays"], self.current_arrays, self.clipping_norm)
        arrays, metrics = self.strategy.aggregate_train(server_round, kept)
        if arrays is not None:
            arrays = self._add_noise_to_aggregated_arrays(arrays)
            self._compose_release(event)
        return arrays, metrics


class ClientSideDP(_InnerBookkeeping, DifferentialPrivacyClientSideFixedClipping):
    """Client-side fixed clipping (the ClientApp's `clip_when_asked`) + Gaussian noise on the server."""

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept = self.strategy.screen_replies(server_round, replies)
        if not kept:  # nothing to noise: the inner strategy records the round as failed
            return self.strategy.aggregate_train(server_round, [])
        return super().aggregate_train(server_round, kept)


def with_differential_privacy(strategy: Strategy, mode: str, noise_multiplier: float, clipping_norm: float,
                              clients_per_round: int) -> Strategy:
    """`strategy` itself for mode "off", else wrapped in the matching DP wrapper."""
    if mode == "off":
        return strategy
    if mode not in DP_MODES:
        raise ValueError(f"unknown privacy.dp-mode {mode!r}; allowed: {', '.join(DP_MODES)}")
    if not hasattr(strategy, "screen_replies"):
        raise ValueError(f"privacy.dp-mode={mode!r} needs a strategy that screens replies; {type(strategy).__name__} does not")
    wrapper = ServerSideDP if mode == "server-side" else ClientSideDP
    return wrapper(strategy, noise_multiplier, clipping_norm, clients_per_round)


def clip_when_asked(msg: Message, context: Context, call_next) -> Message:
    """ClientApp mod: clips the reply's update to the norm that the server's client-side DP wrapper sent.

    Messages without a norm (handshakes, runs without DP) pass through untouched;
    Flower's `fixedclipping_mod` would refuse them, hence this mod.
    """
    norms = [record[KEY_CLIPPING_NORM] for record in msg.content.config_records.values() if KEY_CLIPPING_NORM in record]
    if msg.metadata.message_type != MessageType.TRAIN or not norms:
        return call_next(msg, context)
    sent = msg.content.array_records["arrays"]
    reply = call_next(msg, context)
    got = None if reply.has_error() else reply.content.array_records.get("arrays")
    # A failed or malformed reply goes out as it is: rejecting it is the server's job.
    if got is not None and set(got.keys()) == set(sent.keys()) and all(got[k].shape == sent[k].shape for k in sent.keys()):
        reply.content["arrays"] = clip_update(got, sent, float(norms[0]))
    return reply
