"""The last thing a client's reply passes before it leaves the SuperNode: a Flower mod that lets out only what
the protocol needs.

- The handshake: one config record `info` with the partition-id, the number of partitions and a SHA-256.
- A training reply: the arrays the server sent, under the same names (no extra tensor can carry token ids),
  and metric keys from a fixed allow-list. A metric key whose variable part names a task category or an
  environment must name one of the run's environments' own (from the environment code, not from the data).
  Other metric keys are dropped; a reply with unexpected records or arrays is blocked whole.
- A failure: an error code and the exception's class name. The traceback (paths, process id, addresses, the
  text of whatever failed) is printed on the client's own log and never sent.

SecAgg+ protocol messages pass untouched: their content is Flower's own protocol (masked vectors, key shares).
"""

from __future__ import annotations

import functools
import re
import sys
import traceback
from collections.abc import Callable

from flwr.app import Context, Error, Message, MessageType, MetricRecord, RecordDict

from envs import env_names, make_env
from fedagent_flwr.privacy.secure_aggregation import is_secure_fit

# Error codes of the replies this filter writes (Flower's own codes are below 100).
CLIENT_FAILED = 101
REPLY_BLOCKED = 102

HANDSHAKE_KEYS = frozenset({"partition-id", "num-partitions", "fingerprint"})
CLIENT_METRICS = frozenset({
    # episodes played (agent/evaluation.summarize)
    "success_rate", "mean_reward", "mean_env_return", "mean_steps", "invalid_action_rate", "episodes", "mean_score",
    "success_rate/mean_over_envs",
    # GRPO (agent/training/grpo.py, methods/fedagent.py)
    "loss", "kl", "clip_frac", "grad_norm", "optimizer_steps", "train_samples", "tokens", "generated_tokens",
    "rollout_seconds", "seconds", "update_norm", "informative_groups",
    "outcome_groups", "checkpointed_layers", "repeated_states", "rollout_logprob_gap", "rollout_logprob_gap_signed",
    "rollout_logprob_gap_max", "rollout_logprob_gap_over_001", "first_step_clip_frac",
    # Fed-SE (agent/self_evolution.py, agent/training/experience.py)
    "fedse/seeded-demos", "fedse/seed-steps-left-out", "fedse/kept-trajectories", "fedse/new-successes", "fedse/loss-first", "fedse/train-samples",
    "fedse/sft-steps",
    "fedse/buffer-seed-trajectories", "fedse/buffer-steps", "fedse/buffer-trajectories", "fedse/buffer-won-fraction",
    # QAvg / PAvg (methods/fedrl)
    "local-steps", "local-value", "start-objective",
})
PER_CATEGORY = ("success_rate/", "mean_score/")
# agent/play/multi_env.py's per-environment keys (written out: privacy sits below agent in the layers; the privacy
# test runs every strategy and fails on a key missing here)
PER_ENV = ("success_rate/env/", "invalid_action_rate/env/", "episodes/env/")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NUMERIC = re.compile(r"(b?float|u?int)(8|16|32|64)")  # bf16 travels as uint16 bits (strategies/transfer.py)


@functools.cache
def _names_of(env: str) -> tuple[frozenset[str], frozenset[str]]:
    """(task categories, environment names) of a run's env spec; empty for the RL tables and networks."""
    try:
        names = env_names(env)
    except ValueError:
        return frozenset(), frozenset()
    categories = set()
    for name in names:
        categories |= {t.category for t in make_env(name).tasks()}
    return frozenset(categories), frozenset(names)


def allowed_metric(key: str, env: str) -> bool:
    if key in CLIENT_METRICS:
        return True
    categories, envs = _names_of(env)
    for prefix in PER_ENV:
        if key.startswith(prefix):
            return key[len(prefix):] in envs
    return any(key.startswith(p) and key[len(p):] in categories for p in PER_CATEGORY)


def filter_reply(sent: Message, reply: Message, env: str) -> Message:
    """`reply` with disallowed metric keys removed, or an error reply when it carries anything else it should not."""
    if reply.has_error():
        return failure(sent, reply.error.code, f"client failed (error code {reply.error.code})")
    content = reply.content
    if sent.metadata.message_type == MessageType.QUERY:
        info = content.config_records.get("info")
        ok = (set(content.keys()) == {"info"} and info is not None and set(info.keys()) == HANDSHAKE_KEYS
              and _SHA256.fullmatch(str(info["fingerprint"])) is not None)
        return reply if ok else failure(sent, REPLY_BLOCKED, "reply blocked: the handshake carries more than its info")
    expected = sent.content.array_records.get("arrays")
    got = content.array_records.get("arrays")
    if (content.config_records or set(content.array_records) != {"arrays"} or expected is None
            or list(got.keys()) != list(expected.keys())):
        return failure(sent, REPLY_BLOCKED, "reply blocked: records or arrays other than the weights sent")
    for key in expected:
        a, b = got[key], expected[key]
        if tuple(a.shape) != tuple(b.shape) or _NUMERIC.fullmatch(a.dtype) is None:
            return failure(sent, REPLY_BLOCKED, "reply blocked: an array of another shape or kind than the weights sent")
    records = RecordDict({"arrays": got})
    for name, record in content.metric_records.items():
        records[name] = MetricRecord({k: v for k, v in record.items() if allowed_metric(k, env)})
    return Message(records, reply_to=sent)


def failure(sent: Message, code: int, reason: str) -> Message:
    return Message(Error(code=code, reason=reason), reply_to=sent)


def reply_filter(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """ClientApp mod (outermost): every reply, and every exception, goes through `filter_reply` / `failure`."""
    try:
        reply = call_next(msg, context)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a code; the details stay in this log
        traceback.print_exc(file=sys.stderr)
        return failure(msg, CLIENT_FAILED, f"client failed: {type(exc).__name__}")
    if is_secure_fit(msg) and not reply.has_error():
        return reply
    return filter_reply(msg, reply, str(context.run_config.get("env", "")))
