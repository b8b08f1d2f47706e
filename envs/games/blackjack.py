"""``blackjack-v0``: Gymnasium Blackjack with a basic-strategy expert."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentgym.envs.games.toytext import ToyTextEnv

# --- blackjack-v0 --------------------------------------------------------------------------------

BLACKJACK_ACTIONS: tuple[str, ...] = ("stick", "hit")


def basic_strategy(player_sum: int, dealer_card: int, usable_ace: bool) -> int:
    """Basic strategy for hit/stick only (dealer stands on all 17s, no doubling or splitting).

    Returns 1 (hit) or 0 (stick). ``dealer_card`` is the dealer's face-up card, 1 for an ace.

    Example:
        >>> basic_strategy(16, 10, False), basic_strategy(16, 6, False), basic_strategy(18, 9, True)
        (1, 0, 1)
    """
    dealer = 11 if dealer_card == 1 else dealer_card
    if usable_ace:
        if player_sum >= 19:
            return 0
        if player_sum == 18:
            return 0 if dealer <= 8 else 1
        return 1
    if player_sum >= 17:
        return 0
    if player_sum >= 13:
        return 0 if dealer <= 6 else 1
    if player_sum == 12:
        return 0 if 4 <= dealer <= 6 else 1
    return 1


def _cards(hand: Sequence[int]) -> str:
    return ", ".join("A" if card == 1 else str(card) for card in hand)


def _total(hand: Sequence[int]) -> tuple[int, bool]:
    total = sum(hand)
    if 1 in hand and total + 10 <= 21:
        return total + 10, True
    return total, False


class BlackjackEnv(ToyTextEnv):
    """Blackjack against a dealer who stands on 17 (Gymnasium's ``Blackjack-v1``, ``natural=False``).

    Cards are drawn with replacement from an infinite deck decided by the seed; face cards count
    10, an ace 1 or 11. Say ``hit`` to draw a card or ``stick`` to stop; the dealer then draws to
    17 or more. Reward +1 win, 0 draw, -1 loss (going over 21 loses at once); success = a win.
    ``task_id``: ``"blackjack/<seed>"``. Expert: the basic-strategy table (``basic_strategy``).

    Example:
        >>> env = BlackjackEnv()
        >>> obs, info = env.reset(seed=1)
        >>> print(obs)
        Your cards: 10, 10 (total 20).
        The dealer shows 7; their other card is face down.
        >>> env.expert_action()
        'stick'
    """

    #: Basic strategy loses some hands: the dealer's cards are chance.
    expert_solves_every_task: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__(
            "Blackjack-v1",
            BLACKJACK_ACTIONS,
            gym_kwargs={"natural": False, "sab": False},
            expert=lambda gym_env, obs: basic_strategy(*obs),
            name="blackjack",
            instructions=(
                "You are playing blackjack against a dealer. Cards count their number, face cards "
                "(J, Q, K) count 10 and an ace counts 1 or 11, whichever is better. Get closer to 21 "
                "than the dealer without going over: say hit to take another card or stick to stop; "
                "then the dealer draws until reaching 17 or more. Going over 21 loses at once. "
                "Answer with exactly one of: stick, hit."
            ),
        )

    def describe(self, obs: Any, *, terminated: bool) -> str:
        game = self._gym.unwrapped
        player, dealer = list(game.player), list(game.dealer)  # type: ignore[attr-defined]
        total, soft = _total(player)
        note = " (bust)" if total > 21 else (", counting an ace as 11" if soft else "")
        lines = [f"Your cards: {_cards(player)} (total {total}{note})."]
        if terminated:
            dealer_total, _ = _total(dealer)
            lines.append(f"The dealer's cards: {_cards(dealer)} (total {dealer_total}).")
        else:
            lines.append(f"The dealer shows {_cards(dealer[:1])}; their other card is face down.")
        return "\n".join(lines)
