"""The text spaces of ``agentgym.core``: every str is in them, samples are short printable text."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import agentgym
from agentgym.core import MAX_TEXT_CHARS, SAMPLE_CHARS, Env, TextSpace


def test_every_string_within_the_bounds_is_in_the_space() -> None:
    space = TextSpace(10, min_length=2)
    for text in ("#@", "a\nb", "ünïcode ✓", "\x00\t", "x" * 10):
        assert text in space, text
    for outside in ("x", "x" * 11, 42, b"bytes", None, ["ab"]):
        assert outside not in space, outside


def test_a_real_observation_is_in_the_env_spaces_but_not_in_gymnasiums_default() -> None:
    obs, _ = agentgym.make("maze-v0").reset(seed=0)
    assert "#" in obs and "\n" in obs
    assert obs in Env.observation_space and obs in Env.action_space
    assert obs not in spaces.Text(MAX_TEXT_CHARS, min_length=0)


def test_samples_are_short_printable_members_and_follow_the_seed() -> None:
    space = TextSpace(seed=3)
    samples = [space.sample() for _ in range(200)]
    assert all(s in space and len(s) <= space.sample_max_length == 32 for s in samples)
    assert set("".join(samples)) <= set(SAMPLE_CHARS)
    assert len({len(s) for s in samples}) > 20  # lengths spread over 0..32
    again = TextSpace(seed=3)
    assert [again.sample() for _ in range(200)] == samples


def test_sample_length_bounds_masks_and_probabilities() -> None:
    assert TextSpace(5, sample_max_length=50).sample_max_length == 5
    assert TextSpace(100, min_length=40).sample_max_length == 40
    space = TextSpace(100, seed=0)
    assert len(space.sample(mask=(77, None))) == 77
    only_a = np.zeros(len(space.character_list), dtype=np.int8)
    only_a[space.character_index("a")] = 1
    assert set(space.sample(mask=(None, only_a))) <= {"a"}
    probability = only_a.astype(np.float64)
    assert space.sample(probability=(9, probability)) == "a" * 9
    with pytest.raises(AssertionError):
        space.sample(mask=(101, None))  # longer than the space allows


def test_the_space_does_not_claim_to_flatten() -> None:
    assert TextSpace().is_np_flattenable is False
    assert "TextSpace(0, 1000000" in repr(TextSpace())
