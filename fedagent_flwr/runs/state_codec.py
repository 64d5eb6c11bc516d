"""The server state's plain-data form: JSON with a few tagged types, and nothing that runs code when read.

Why not pickle: a pickle can carry any object, so reading one can run any code, and a damaged one fails with
errors that name no field. The server's state is small and of known kinds - numbers, strings, lists, dicts
keyed by round, the strategy's NumPy generator, Flower's metric records, the communication ledger, the global
RNG states - so each kind gets an explicit form here, and anything else is refused when the state is written
(not silently when it is read back).

Tagged forms (an object with the single key "__kind__" plus its fields):
  dict      a dict whose keys are not all strings (rounds are ints), as [key, value] pairs
  tuple     a tuple, as a list
  ndarray   a small NumPy array (the legacy NumPy RNG key), as dtype, shape and a flat list
  bytes     bytes, base64 (torch's RNG state)
  generator a numpy.random.Generator, as its bit generator's name and state
  record    a Flower MetricRecord or ConfigRecord, as its items
  object    an instance of a class listed in STATE_CLASSES, as its attributes
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, MetricRecord

from strategies.communication import CommunicationLedger

KIND = "__kind__"
# Classes whose instances the strategy keeps as state; they are rebuilt from their attributes, never called.
STATE_CLASSES: dict[str, type] = {"CommunicationLedger": CommunicationLedger}
RECORDS: dict[str, type] = {"MetricRecord": MetricRecord, "ConfigRecord": ConfigRecord}


def encode(value: Any, where: str = "state") -> Any:
    """`value` as JSON-ready data; TypeError naming the field for a kind this module does not know."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {KIND: "float", "repr": repr(value)}
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return encode(value.item(), where)
    if isinstance(value, dict):
        if all(isinstance(k, str) and k != KIND for k in value):
            return {k: encode(v, f"{where}.{k}") for k, v in value.items()}
        return {KIND: "dict", "items": [[encode(k, where), encode(v, f"{where}[{k!r}]")] for k, v in value.items()]}
    if isinstance(value, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {KIND: "tuple", "items": [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, np.ndarray):
        return {KIND: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}
    if isinstance(value, bytes):
        return {KIND: "bytes", "base64": base64.b64encode(value).decode()}
    if isinstance(value, np.random.Generator):
        return {KIND: "generator", "state": encode(value.bit_generator.state, f"{where}.state")}
    for name, cls in RECORDS.items():
        if type(value) is cls:
            return {KIND: "record", "class": name, "items": encode(dict(value), where)}
    for name, cls in STATE_CLASSES.items():
        if type(value) is cls:
            return {KIND: "object", "class": name, "vars": encode(vars(value), where)}
    raise TypeError(f"{where} holds a {type(value).__name__}, which the server's state cannot store "
                    f"(fedagent_flwr/runs/state_codec.py lists the kinds it can)")


def decode(data: Any) -> Any:
    """The inverse of `encode`; ValueError for a tag it does not know."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    kind = data.get(KIND)
    if kind is None:
        return {k: decode(v) for k, v in data.items()}
    if kind == "float":
        return float(data["repr"])
    if kind == "dict":
        return {_hashable(decode(k)): decode(v) for k, v in data["items"]}
    if kind == "tuple":
        return tuple(decode(v) for v in data["items"])
    if kind == "ndarray":
        return np.asarray(data["data"], dtype=np.dtype(data["dtype"])).reshape(data["shape"])
    if kind == "bytes":
        return base64.b64decode(data["base64"])
    if kind == "generator":
        state = decode(data["state"])
        bit_generator = getattr(np.random, state["bit_generator"])()
        bit_generator.state = state
        return np.random.Generator(bit_generator)
    if kind == "record" and data.get("class") in RECORDS:
        return RECORDS[data["class"]](decode(data["items"]))
    if kind == "object" and data.get("class") in STATE_CLASSES:
        obj = object.__new__(STATE_CLASSES[data["class"]])
        vars(obj).update(decode(data["vars"]))
        return obj
    raise ValueError(f"unknown stored kind {kind!r} (class {data.get('class')!r})")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
