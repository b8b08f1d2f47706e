"""Snapshot bytes for envs' ``snapshot``/``restore``: the kind tag, pickling and the ``np_random`` state."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np

from agentgym.errors import ConfigError

#: Keys ``pack_snapshot`` writes itself; an env's own fields may not use them.
_RESERVED = ("kind", "rng_state", "rng_seed")


def _kind(env: gymnasium.Env) -> str:
    cls = type(env)
    return f"{cls.__module__}.{cls.__qualname__}"


def pack_snapshot(env: gymnasium.Env, fields: Mapping[str, Any]) -> bytes:
    """Pickle an env's own snapshot ``fields`` with its kind tag and its ``np_random`` state.

    Args:
        env: The env being snapshotted; its class names the kind (``restore`` accepts the bytes only
            on an instance of the same class) and its ``np_random`` bit-generator state and
            ``_np_random_seed`` travel with the fields.
        fields: The rest of the episode state, by name; every value must pickle. The keys
            ``"kind"``, ``"rng_state"`` and ``"rng_seed"`` are reserved.

    Returns:
        The snapshot as bytes, for ``unpack_snapshot`` (trusted bytes only: pickle).

    Raises:
        ConfigError: ``fields`` uses a reserved key.

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> env = EchoEnv()
        >>> _ = env.reset(seed=7)
        >>> data = pack_snapshot(env, {"said": "hi"})
        >>> after = env.np_random.integers(100, size=3).tolist()
        >>> copy = EchoEnv()  # never reset
        >>> unpack_snapshot(copy, data)
        {'said': 'hi'}
        >>> copy.np_random.integers(100, size=3).tolist() == after
        True
    """
    clash = [key for key in _RESERVED if key in fields]
    if clash:
        raise ConfigError(f"snapshot field {clash[0]!r} is reserved by pack_snapshot; rename it")
    state = {
        "kind": _kind(env),
        **fields,
        "rng_state": env.np_random.bit_generator.state,
        "rng_seed": env._np_random_seed,  # gymnasium keeps the seed only here
    }
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def unpack_snapshot(
    env: gymnasium.Env, data: bytes, *, expect: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check and unpickle ``pack_snapshot`` bytes, re-seat ``env.np_random``, return the env's fields.

    Works on a never-reset instance. ``env`` is untouched when the bytes are rejected.

    Args:
        env: The env being restored; it must be an instance of the class that packed ``data``.
        data: Bytes from ``pack_snapshot`` (trusted bytes only: pickle).
        expect: Fields that must hold these values (e.g. the variant of a configurable env),
            checked before anything is changed.

    Returns:
        The fields given to ``pack_snapshot`` (a new dict, without the kind tag and RNG keys).

    Raises:
        ConfigError: ``data`` is not a snapshot of ``env``'s class, or a field differs from ``expect``.

    Example:
        >>> from agentgym.examples import EchoEnv
        >>> unpack_snapshot(EchoEnv(), b"not a snapshot")
        Traceback (most recent call last):
        ...
        agentgym.errors.ConfigError: restore() got bytes that are not a EchoEnv snapshot
    """
    name = type(env).__qualname__
    try:
        state = pickle.loads(data)
    except Exception as exc:  # unpickling foreign bytes fails in many ways
        raise ConfigError(f"restore() got bytes that are not a {name} snapshot") from exc
    if not isinstance(state, dict) or state.get("kind") != _kind(env):
        raise ConfigError(f"restore() got bytes that are not a {name} snapshot")
    for key, value in (expect or {}).items():
        if state.get(key) != value:
            raise ConfigError(f"restore() got bytes that are not a {name} snapshot with {key}={value!r}")
    rng_state = state.pop("rng_state")
    rng = np.random.Generator(getattr(np.random, rng_state["bit_generator"])())
    rng.bit_generator.state = rng_state
    env._np_random, env._np_random_seed = rng, state.pop("rng_seed")
    del state["kind"]
    return state
