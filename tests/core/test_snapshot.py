"""agentgym.snapshot: the shared pack/unpack of env snapshot bytes."""

from __future__ import annotations

import pickle

import pytest

from agentgym.errors import ConfigError
from agentgym.examples import EchoEnv
from agentgym.snapshot import pack_snapshot, unpack_snapshot


class OtherEnv(EchoEnv):
    """A different class: its snapshots are foreign to ``EchoEnv``."""


def test_round_trip_restores_fields_and_the_rng_stream_exactly() -> None:
    env = EchoEnv()
    env.reset(seed=123)
    env.np_random.integers(1000, size=5)  # move the stream off its seeded start
    data = pack_snapshot(env, {"said": ["hi", "bye"], "count": 2})
    after = env.np_random.random(8).tolist()

    copy = EchoEnv()
    copy.reset(seed=999)
    assert unpack_snapshot(copy, data) == {"said": ["hi", "bye"], "count": 2}
    assert copy.np_random.random(8).tolist() == after
    assert copy.np_random_seed == env.np_random_seed == 123


def test_unpack_works_on_a_never_reset_instance() -> None:
    env = EchoEnv()
    env.reset(seed=5)
    data = pack_snapshot(env, {})
    after = env.np_random.integers(1 << 30, size=4).tolist()

    fresh = EchoEnv()
    assert unpack_snapshot(fresh, data) == {}
    assert fresh.np_random.integers(1 << 30, size=4).tolist() == after
    # The restored generator is the copy's own: drawing from it leaves the original alone.
    assert fresh.np_random is not env.np_random


def test_restores_are_independent_of_each_other() -> None:
    env = EchoEnv()
    env.reset(seed=1)
    data = pack_snapshot(env, {})
    first, second = EchoEnv(), EchoEnv()
    unpack_snapshot(first, data)
    unpack_snapshot(second, data)
    first.np_random.random(3)
    assert second.np_random.random(2).tolist() == env.np_random.random(2).tolist()


@pytest.mark.parametrize(
    "data",
    [
        b"not a pickle",
        b"",
        pickle.dumps({"kind": "other"}),
        pickle.dumps(["kind", "EchoEnv"]),
        pickle.dumps({"said": "hi"}),
    ],
)
def test_foreign_bytes_are_rejected_naming_the_class(data: bytes) -> None:
    env = EchoEnv()
    env.reset(seed=3)
    before = env.np_random.bit_generator.state
    with pytest.raises(ConfigError, match=r"not a EchoEnv snapshot"):
        unpack_snapshot(env, data)
    assert env.np_random.bit_generator.state == before  # untouched


def test_a_snapshot_of_another_class_is_rejected() -> None:
    other = OtherEnv()
    other.reset(seed=0)
    data = pack_snapshot(other, {})
    with pytest.raises(ConfigError, match=r"not a EchoEnv snapshot"):
        unpack_snapshot(EchoEnv(), data)
    with pytest.raises(ConfigError, match=r"not a OtherEnv snapshot"):
        unpack_snapshot(OtherEnv(), pack_snapshot(EchoEnv(), {}))
    assert unpack_snapshot(OtherEnv(), data) == {}


def test_expect_rejects_a_differing_field_before_touching_the_env() -> None:
    env = EchoEnv()
    env.reset(seed=0)
    data = pack_snapshot(env, {"name": "a", "x": 1})
    target = EchoEnv()
    target.reset(seed=42)
    before = target.np_random.bit_generator.state
    with pytest.raises(ConfigError, match=r"not a EchoEnv snapshot with name='b'"):
        unpack_snapshot(target, data, expect={"name": "b"})
    assert target.np_random.bit_generator.state == before
    assert unpack_snapshot(target, data, expect={"name": "a"}) == {"name": "a", "x": 1}


@pytest.mark.parametrize("key", ["kind", "rng_state", "rng_seed"])
def test_reserved_field_names_are_refused(key: str) -> None:
    env = EchoEnv()
    env.reset(seed=0)
    with pytest.raises(ConfigError, match=key):
        pack_snapshot(env, {key: 1})
