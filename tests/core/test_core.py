"""``agentgym.core``: the text spaces (every str is in them, samples are short printable text) and the base
reset that chooses a task through the hooks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import agentgym
from agentgym.core import MAX_TEXT_CHARS, SAMPLE_CHARS, Env, TaskSplit, TextSpace
from agentgym.errors import ConfigError


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


class _Deck(Env):
    """Draw one card of a deck of ten: the three task hooks and no reset of its own."""

    def task_splits(self) -> tuple[TaskSplit, ...]:
        return (TaskSplit("all", 10, "the ten cards"),)

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        return {"task_id": f"card-{index}"}

    def parse_task_id(self, task_id: Any) -> int:
        if not (isinstance(task_id, str) and task_id.startswith("card-")):
            raise ConfigError(f"deck task_id {task_id!r} is not a card; ids look like 'card-3'")
        return int(task_id.removeprefix("card-"))

    def choose_task(self, seed: int | None) -> int:
        return self.seed_or_draw(seed, 10) % 10

    def start_task(self, task: int, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return f"card {task}", {"state_key": str(task), "task_id": f"card-{task}", "options": options}


def test_the_base_reset_chooses_the_task_through_the_hooks() -> None:
    deck = _Deck()
    assert deck.reset(seed=13)[0] == "card 3"  # the seed chooses
    obs, info = deck.reset(seed=13, options={"task_id": "card-7", "mode": "x"})  # the task id wins
    assert (obs, info["options"]) == ("card 7", {"task_id": "card-7", "mode": "x"})
    obs, info = deck.reset(options={"split": "all", "index": 5})  # a named split starts by task_id
    assert (obs, info["task_ref"], info["options"]) == ("card 5", {"split": "all", "index": 5},
                                                         {"task_id": "card-5"})
    with pytest.raises(ConfigError, match="ids look like 'card-3'"):
        deck.reset(options={"task_id": "joker"})
    # Without a seed the task is drawn from np_random: reproducible after a seeded reset.
    deck.reset(seed=1)
    drawn = [deck.reset()[0] for _ in range(5)]
    deck.reset(seed=1)
    assert [deck.reset()[0] for _ in range(5)] == drawn and len(set(drawn)) > 1


def test_an_env_with_its_own_reset_still_seeds_through_the_base() -> None:
    class Coin(Env):
        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
            base = super().reset(seed=seed)
            return ("heads" if self.np_random.random() < 0.5 else "tails"), {"state_key": "", "base": base}

    first, info = Coin().reset(seed=2, options={"task_id": "ignored"})
    assert info["base"] == ("", {"state_key": ""})
    assert Coin().reset(seed=2)[0] == first
