"""``tools-v0``: the tools by hand, checking on the final state and answer, malformed turns, the expert and a
random tool user measured, state keys, snapshot/restore, the HTTP service."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from fractions import Fraction as F
from typing import Any

import numpy as np
import pytest

import agentgym
from agentgym.checker import check_env
from agentgym.envs.registration import register_tool_envs
from agentgym.envs.tools.function_calling import MAX_CALLS_PER_TURN, FunctionCallingEnv
from agentgym.envs.tools.function_tasks import (
    FAMILIES,
    answer_matches,
    generate_task,
    numbers_match,
    parse_task_id,
)
from agentgym.envs.tools.function_tools import (
    TOOLS,
    UNITS,
    Database,
    ToolError,
    calculate,
    convert_units,
    format_number,
    parse_number,
)
from agentgym.errors import ConfigError
from agentgym.http.client import EnvClient, RemoteEnv

pytestmark = pytest.mark.timeout(60)

#: "Transfer 598.59 from ivan's account (3647.6) to mallory's account (502.9). Then answer with ivan's
#: new balance."
REPORTED = "tools/transfer/7"
#: "Transfer 49.49 from erin's account (3815.27) to walter's account." (no value asked)
SILENT = "tools/transfer/0"
_RESPONSE_RE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@pytest.fixture(autouse=True)
def registered() -> None:
    register_tool_envs()


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def responses(obs: str) -> list[dict[str, Any]]:
    return [json.loads(block) for block in _RESPONSE_RE.findall(obs)]


def play_expert(env: Any, **reset: Any) -> list[tuple[Any, ...]]:
    obs, info = env.reset(**reset)
    trace: list[tuple[Any, ...]] = [(obs, 0.0, False, False, info)]
    while not (trace[-1][2] or trace[-1][3]):
        trace.append(env.step(env.expert_action()))
    return trace


# --- tools by hand --------------------------------------------------------------------------------


def test_calculator_is_exact_and_rejects_everything_but_arithmetic() -> None:
    assert calculate("2 + 3 * 4") == 14 and calculate("(2 + 3) * 4") == 20
    assert calculate("0.1 + 0.2") == F(3, 10)  # exact, not 0.30000000000000004
    assert calculate("(1.1 + 2.2) * 3") == F("9.9")
    assert calculate("-3 ** 2") == -9 and calculate("(-3) ** 2") == 9  # Python precedence
    assert calculate("2 ^ -2") == F(1, 4) and calculate("7 / 2") == F(7, 2)
    assert calculate("1e3 * 2.5") == 2500 and calculate("3 × 4 ÷ 6 − 1") == 1
    assert calculate("12.37 * (100 - 15) / 100") == F("10.5145")
    rejected = [
        ("1 / (3 - 3)", "division by zero"), ("0 ** -1", "division by zero"), ("2 ** 0.5", "whole number"),
        ("9 ** 9 ** 9", "between"), (" * ".join(["10 ** 99"] * 4), "too large"), ("1e400", "too large"),
        ("1e999999999 + 1", "too large"), ("15% * 80", "'%'"), ("1,234.5 + 1", "thousands"),
        ("price * 2", "'price' is not a number"), ("__import__('os').system('true')", "functions"),
        ("abs(-2)", "functions"), ("7 // 2", "'//'"), ("2 +", "well-formed"), ("", "empty"),
        ("x = 2", "without '='"), ("'a' * 3", "not a number"), ("1" * 201, "longer than"),
        ("[1, 2]", "list is not supported"), ("3 < 4", "compare is not supported"),
        ("0x1F", "not a decimal number"),
    ]
    for text, message in rejected:
        with pytest.raises(ToolError, match=re.escape(message)):
            calculate(text)


def test_unit_converter_uses_exact_factors_and_names() -> None:
    cases = [
        ("3.5", "mi", "km", "5.632704"), ("1", "miles", "Kilometres", "1.609344"), ("12", "in", "ft", "1"),
        ("1", "yd", "cm", "91.44"), ("1", "lb", "g", "453.59237"), ("2", "lbs", "oz", "32"),
        ("1", "t", "kg", "1000"), ("1", "week", "h", "168"), ("90", "minutes", "hours", "1.5"),
        ("1", "gal", "l", "3.785411784"), ("1", "gal", "qt", "4"), ("1", "pt", "floz", "16"),
        ("0", "C", "K", "273.15"), ("-40", "C", "F", "-40"), ("0", "K", "degrees Fahrenheit", "-459.67"),
        ("212", "°F", "celsius", "100"),
    ]
    for value, source, target, expected in cases:
        assert convert_units(F(value), source, target) == F(expected), (value, source, target)
    assert convert_units(F(100), "F", "C") == F(340, 9)
    assert format_number(convert_units(F(100), "F", "C")) == "37.7777777778"
    for args, message in [(("furlong", "m"), "unknown unit 'furlong'"), (("C", "s"), "temperature"),
                          (("km", "kg"), "cannot convert length (km) to mass (kg)")]:
        with pytest.raises(ToolError, match=re.escape(message)):
            convert_units(F(1), *args)
    with pytest.raises(ToolError, match="below absolute zero"):
        convert_units(F(-500), "F", "C")
    assert {d for d, _, _ in UNITS.values()} == {"length", "mass", "time", "volume", "temperature"}


def test_numbers_are_shown_and_read_back_exactly() -> None:
    shown = [format_number(F(x)) for x in ("12.50", "-0.125", "1/3", "2/3", "1e-11", "-1e-11", "100")]
    assert shown == ["12.5", "-0.125", "0.3333333333", "0.6666666667", "0", "0", "100"]
    assert format_number(F(5, 10**10)) == "0.0000000005"
    assert format_number(F(1, 2 * 10**10)) == "0.0000000001"  # half up
    assert parse_number(0.1) == F(1, 10) and parse_number(7) == 7 and parse_number(True) is None
    assert parse_number(float("nan")) is None and parse_number(float("inf")) is None
    assert parse_number("It is $1,234.50.") == F("1234.5") and parse_number("-3.5 km") == F("-3.5")
    assert parse_number("about 12,5") == 12 and parse_number("done") is None
    assert parse_number("1e999999999") is None
    assert numbers_match(F("3049.01"), F("3049.005")) and numbers_match(F("3049.0"), F("3049.01"))
    assert not numbers_match(F("3048.99"), F("3049.005"))
    assert numbers_match(F(10**8 + 50), F(10**8))  # one part in a million
    assert answer_matches("ivan", "ivan") and answer_matches("Ivan!", "ivan")
    assert not answer_matches("ivan's", "ivan") and not answer_matches(3049, "ivan")
    assert answer_matches("3049.01", F("3049.01")) and not answer_matches("no number", F(1))
    assert answer_matches("anything", None)


def test_database_tools() -> None:
    db = Database({"accounts/alice/balance": F(100), "inventory/kettle/stock": F(3)})
    assert db.lookup("accounts/alice/balance") == 100
    with pytest.raises(ToolError, match="did you mean 'accounts/alice/balance'"):
        db.lookup("accounts/alise/balance")
    with pytest.raises(ToolError, match="list_keys shows the keys"):
        db.delete("nothing/like/it")
    assert db.update("notes/x", F(1)) is None and db.update("notes/x", F(2)) == 1
    assert db.list_keys("notes/") == ["notes/x"] and len(db.list_keys()) == 3 and db.list_keys("zzz") == []
    assert db.delete("notes/x") == 2 and "notes/x" not in db.values
    for bad in ("", "has space", "x" * 81, "ünïcode"):
        with pytest.raises(ToolError, match="invalid key"):
            db.update(bad, F(1))
    full = Database({f"k{i}": F(i) for i in range(100)})
    with pytest.raises(ToolError, match="full"):
        full.update("one/more", F(1))
    full.update("k5", F(0))  # an existing key can still change


# --- tasks and checking ---------------------------------------------------------------------------


def test_transfer_is_checked_on_the_final_database_and_the_answer() -> None:
    env = agentgym.make("tools-v0")

    def transfer(task_id: str, payer_value: Callable[[F, F], F], *extra: str, answer: Any = "done"
                 ) -> tuple[Any, ...]:
        """Look both balances up, store the payer's as ``payer_value(right payer, right payee)``, answer."""
        prompt, _ = env.reset(options={"task_id": task_id})
        ((amount, payer, payee),) = re.findall(r"Transfer ([\d.]+) from (\w+)'s account to (\w+)'s", prompt)
        keys = f"accounts/{payer}/balance", f"accounts/{payee}/balance"
        obs, *_ = env.step(call("lookup", key=keys[0]) + call("lookup", key=keys[1]))
        have, had = (F(str(r["result"]["value"])) for r in responses(obs))
        left, right = have - F(amount), had + F(amount)
        writes = (call("update", key=keys[0], value=float(payer_value(left, right)))
                  + call("update", key=keys[1], value=float(right)))
        obs, reward, terminated, _, info = env.step(
            writes + "".join(extra) + call("answer", answer=answer(left) if callable(answer) else answer))
        assert terminated and [r["name"] for r in responses(obs)] == ["update"] * (2 + len(extra))
        return reward, info, obs

    def right(left: F, _: F) -> F:
        return left

    reward, info, obs = transfer(SILENT, right)
    assert (reward, info["success"], info["state_correct"], info["answer_correct"]) == (1.0, True, True, None)
    assert obs.endswith("Answer received. The task is solved.")
    # The payer given the payee's new balance, or two cents too much taken: 0.
    reward, info, obs = transfer(SILENT, lambda left, right: right)
    assert reward == 0.0 and not info["success"] and not info["state_correct"] and "expected state" in obs
    assert transfer(SILENT, lambda left, _: left - F("0.02"))[0] == 0.0
    # Rounding within 0.01 is accepted.
    assert transfer(SILENT, lambda left, _: left + F("0.004"))[0] == 1.0
    # A correct transfer plus a change nobody asked for: 0.
    reward, info, _ = transfer(SILENT, right, call("update", key="notes/log", value=1))
    assert reward == 0.0 and not info["state_correct"]
    # Asked for a value: the answer counts too.
    reward, info, _ = transfer(REPORTED, right, answer=float)
    assert (reward, info["answer_correct"]) == (1.0, True) and info["answer"] == "3049.01"
    reward, info, obs = transfer(REPORTED, right, answer="done")
    assert (reward, info["state_correct"], info["answer_correct"]) == (0.0, True, False)
    assert obs.endswith("The task is not solved: the answer is not correct.")
    assert transfer(REPORTED, right, answer=lambda left: f"{float(left):,.2f} dollars")[0] == 1.0


def test_partial_credit_counts_the_checks() -> None:
    env = agentgym.make("tools-v0", partial_credit=True)
    env.reset(options={"task_id": REPORTED})
    # Right payer balance and answer, payee untouched: 2 of 3 checks.
    _, reward, terminated, _, info = env.step(call("update", key="accounts/ivan/balance", value=3049.01)
                                              + call("answer", answer=3049.01))
    assert terminated and reward == pytest.approx(2 / 3) and not info["success"]
    env.reset(options={"task_id": REPORTED})
    assert env.step(call("answer", answer=0))[1] == 0.0  # 0 of 3


def test_every_family_is_generated_with_a_plan_that_needs_tools() -> None:
    for family in FAMILIES:
        for number in range(30):
            task = generate_task(family, number)
            assert task == generate_task(family, number) and task.task_id == f"tools/{family}/{number}"
            assert all(1 <= len(turn) <= MAX_CALLS_PER_TURN for turn in task.plan)
            names = [name for turn in task.plan for name, _ in turn]
            assert names[-1] == "answer" and names.count("answer") == 1
            # Every task needs a tool result before the end: nothing can be answered from the prompt.
            assert any(n in ("lookup", "convert", "list_keys") for n in names[:-1]), task
            if family in ("convert", "stock_value", "sell", "weight", "richest", "restock"):
                assert task.answer is not None
            elif family in ("convert_store", "close_account", "sensor"):
                assert task.answer is None
    closing = generate_task("close_account", 3)
    assert len(closing.expected) == len(closing.initial) - 1
    assert "sensors/cellar/temp_c" in generate_task("sensor", 3).expected
    assert generate_task("richest", 3).answer == "heidi"
    assert generate_task("restock", 3).plan[0] == (("list_keys", {"prefix": "inventory/"}),)


def test_prompts_and_instructions_never_show_the_answer() -> None:
    env = agentgym.make("tools-v0")
    # Names are in the richest prompts by design, and a restock whose only short item is empty adds
    # exactly the level; every other answer is a number the prompt cannot give away.
    for seed in range(300):
        obs, info = env.reset(seed=seed)
        if info["answer"] not in (None, "0") and info["task_id"].split("/")[1] not in ("richest", "restock"):
            for text in (obs, info["instructions"]):
                assert not re.search(rf"(?<![\d.]){re.escape(info['answer'])}(?!\d)", text), (seed, obs)
    assert "accounts/<name>/balance" in info["instructions"] and "temperature: C F K" in info["instructions"]
    assert all(tool["function"]["name"] in info["instructions"] for tool in TOOLS)


# --- malformed input and tool errors --------------------------------------------------------------


def test_malformed_turns_are_invalid_and_run_nothing() -> None:
    env = agentgym.make("tools-v0", format_penalty=0.5, max_turns=30)
    obs, info = env.reset(options={"task_id": SILENT})
    start_key = info["state_key"]
    write = call("update", key="accounts/erin/balance", value=1)
    bad_turns = {
        "I would transfer the money.": "no tool call found",
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'no "name"',
        call("transfer", amount=49.49): "unknown tool 'transfer'",
        call("update", key="accounts/erin/balance"): "missing the required argument 'value'",
        call("update", key="a", value="12.5"): "argument 'value' must be number, got string",
        call("lookup", key=["a"]): "must be string, got array",
        call("lookup", key="a", extra=1): "has no argument 'extra'",
        write + call("lookup", key="x") + call("lookup"): "missing the required argument 'key'",
        write * (MAX_CALLS_PER_TURN + 1): f"at most {MAX_CALLS_PER_TURN} tool calls",
        call("answer", answer="done") + write: "answer once, as the last call",
        call("answer", answer="a") + call("answer", answer="b"): "answer once",
        "<update>accounts/erin/balance</update>":
            "takes several arguments (key, value); call it as <tool_call>",
        "<convert>3 mi</convert>": "takes several arguments (value, from_unit, to_unit)",
        f"<tool_call>{write[11:-12]}": "never closed",
        call("answer", answer=None): "must be ['number', 'string']",
    }
    for action, message in bad_turns.items():
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["invalid_action"] and reward == -0.5 and not (terminated or truncated), action
        assert obs.startswith("Invalid action: ") and message in obs, (action, obs)
        assert "No call was run." in obs
        assert obs.endswith(env.render()) and info["state_key"] == start_key, action
    assert env.unwrapped._db.values == generate_task("transfer", 0).initial


def test_tool_failures_answer_with_an_error_and_the_other_calls_still_run() -> None:
    env = agentgym.make("tools-v0")
    env.reset(options={"task_id": SILENT})
    obs, reward, terminated, _, info = env.step(
        call("calculate", expression="1 / 0") + call("lookup", key="accounts/erin/balanse")
        + call("convert", value=3, from_unit="furlong", to_unit="m")
        + call("convert", value=3, from_unit="kg", to_unit="km")
        + call("delete", key="accounts/nobody/balance")
        + call("convert", value=1e308, from_unit="km", to_unit="m"))
    assert [r["error"] for r in responses(obs)] == [
        "division by zero",
        "no key 'accounts/erin/balanse'; did you mean 'accounts/erin/balance'?",
        ("unknown unit 'furlong'; known units: length: mm cm m km in ft yd mi; mass: mg g kg t oz lb; "
         "time: s min h day week; volume: ml l floz pt qt gal; temperature: C F K"),
        "cannot convert mass (kg) to length (km)",
        "no key 'accounts/nobody/balance'; list_keys shows the keys",
        "argument 'value' is too large",
    ]
    assert not info["invalid_action"] and info["tool_errors"] == 6 and reward == 0.0 and not terminated
    obs, _, _, _, info = env.step(call("calculate", expression="2 +* 2")
                                  + call("lookup", key="accounts/erin/balance")
                                  + call("list_keys", prefix="accounts/") + call("list_keys"))
    got = responses(obs)
    assert got[0]["error"] == "it is not a well-formed arithmetic expression" and info["tool_errors"] == 1
    assert got[1] == {"name": "lookup", "result": {"key": "accounts/erin/balance", "value": 3815.27}}
    initial = generate_task("transfer", 0).initial
    assert got[2]["result"]["keys"] == sorted(k for k in initial if k.startswith("accounts/"))
    assert len(got[3]["result"]["keys"]) == len(initial) == 22


def test_tag_form_and_string_encoded_arguments_work() -> None:
    env = agentgym.make("tools-v0")
    env.reset(options={"task_id": REPORTED})
    arguments = json.dumps({"value": 1, "from_unit": "mi", "to_unit": "m"})
    encoded = json.dumps({"name": "convert", "arguments": arguments})
    obs, _, _, _, info = env.step("<think>need <lookup>?</think><lookup>accounts/ivan/balance</lookup>\n"
                                  f"<calculate>3647.6 - 598.59</calculate><tool_call>{encoded}</tool_call>")
    assert [r["result"] for r in responses(obs)] == [
        {"key": "accounts/ivan/balance", "value": 3647.6}, {"result": 3049.01},
        {"value": 1, "from_unit": "mi", "to_unit": "m", "result": 1609.344}]
    assert not info["invalid_action"]
    env.step(call("update", key="accounts/ivan/balance", value=3049.01)
             + call("update", key="accounts/mallory/balance", value=1101.49))
    obs, reward, terminated, _, info = env.step("Ivan now has <answer>3049.01</answer>")
    assert terminated and reward == 1.0 and obs == "Answer received. The task is solved."


# --- expert, random policy, state keys, forks -----------------------------------------------------


def random_action(rng: np.random.Generator, keys: list[str], numbers: list[float], words: list[str]) -> str:
    """A random tool user: 1-3 calls of random tools with plausible arguments (real keys, seen numbers)."""
    names = [t["function"]["name"] for t in TOOLS]
    units = list(UNITS)

    def number() -> float:
        return float(rng.choice(numbers)) if numbers and rng.random() < 0.8 else int(rng.integers(0, 100))

    def one(options: list[Any]) -> Any:
        return options[int(rng.integers(len(options)))]

    calls = []
    for _ in range(int(rng.integers(1, 4))):
        name, key = one(names), one(keys)
        args: dict[str, Any] = {
            "calculate": {"expression": f"{number()} {one(list('+-*/'))} {number()}"},
            "convert": {"value": number(), "from_unit": one(units), "to_unit": one(units)},
            "lookup": {"key": key}, "delete": {"key": key}, "update": {"key": key, "value": number()},
            "list_keys": {"prefix": one(["", "inventory/", "accounts/"])},
            "answer": {"answer": one(["done", number(), one(words)])},
        }[name]
        calls.append(call(name, **args))
        if name == "answer":
            break
    return "".join(calls)


def test_expert_solves_every_task_and_a_random_tool_user_almost_never_does() -> None:
    env = agentgym.make("tools-v0")
    expert, lengths, randomly = [], [], []
    for seed in range(1000):
        trace = play_expert(env, seed=seed)
        assert not any(step[4]["invalid_action"] or step[4].get("tool_errors") for step in trace), seed
        expert.append(trace[-1][1] == 1.0 and trace[-1][4]["success"] and trace[-1][2])
        lengths.append(len(trace) - 1)
        rng = np.random.default_rng(seed)
        obs, info = env.reset(seed=seed)
        words, numbers = re.findall(r"[a-z]+", obs), []
        while True:
            numbers += [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", obs)]
            keys = sorted(env.unwrapped._db.values) or ["none"]
            obs, _, terminated, truncated, info = env.step(random_action(rng, keys, numbers, words))
            if terminated or truncated:
                break
        randomly.append(info["success"])
    assert np.mean(expert) == 1.0
    assert np.mean(lengths) == pytest.approx(2.911) and max(lengths) == 4
    assert np.mean(randomly) < 0.01  # measured: 0.0
    for family in FAMILIES:  # and every family, on both splits
        for split in ("train", "test"):
            trace = play_expert(agentgym.make("tools-v0", families=[family], split=split), seed=1)
            assert trace[-1][4]["success"] and trace[0][4]["task_id"].startswith(f"tools/{family}/")


def test_expert_picks_up_where_the_agent_left_off_and_state_keys_ignore_wording() -> None:
    env = agentgym.make("tools-v0")
    env.reset(options={"task_id": REPORTED})
    env.step(call("lookup", key="accounts/mallory/balance") + call("lookup", key="accounts/ivan/balance"))
    assert "lookup" not in env.expert_action() and env.expert_action().count("calculate") == 2
    _, _, _, _, one = env.step("<calculate>3647.6 - 598.59</calculate>")
    assert env.expert_action().count("calculate") == 1  # the other value is known already
    env.reset(options={"task_id": REPORTED})
    env.step(call("lookup", key="accounts/ivan/balance"))
    env.step(call("lookup", key="accounts/mallory/balance"))
    _, _, _, _, two = env.step(call("calculate", expression="(364760 - 59859) / 100"))
    assert one["state_key"] == two["state_key"] == (
        "tools/transfer/7|db=|knows=calc=3049.01;lookup:accounts/ivan/balance;"
        "lookup:accounts/mallory/balance")
    env.step(call("update", key="accounts/mallory/balance", value=0))
    _, _, _, _, info = env.step(call("update", key="accounts/ivan/balance", value=3049.01))
    assert info["state_key"].startswith(
        "tools/transfer/7|db=accounts/ivan/balance=3049.01;accounts/mallory/balance=0|")
    # The expert first learns the value it is missing, then repairs the wrong update only.
    assert env.expert_action() == call("calculate", expression="502.9 + 598.59")
    env.step(env.expert_action())
    assert env.expert_action() == (call("update", key="accounts/mallory/balance", value=1101.49)
                                   + "\n" + call("answer", answer=3049.01))
    assert env.step(env.expert_action())[1] == 1.0 and env.expert_action() is None


def test_check_env_task_ids_splits_and_arguments() -> None:
    check_env("tools-v0", num_episodes=4)
    check_env(agentgym.make("tools-v0", families=["restock", "close_account"], split="test",
                            partial_credit=True, format_penalty=0.5))
    env = agentgym.make("tools-v0", split="train")
    first = env.reset(seed=11)
    assert env.reset(seed=12, options={"task_id": first[1]["task_id"]}) == first
    for split, parity in (("train", 0), ("test", 1)):
        env = agentgym.make("tools-v0", split=split)
        assert {parse_task_id(env.reset(seed=s)[1]["task_id"])[1] % 2 for s in range(20)} == {parity}
    bad_ids = [("tools/nope/1", "unknown tools task family"), ("tools/transfer/01", "malformed"),
               ("transfer/1", "malformed"), (f"tools/transfer/{2**31}", "below"), (7, "malformed")]
    for task_id, message in bad_ids:
        with pytest.raises(ConfigError, match=message):
            FunctionCallingEnv().reset(options={"task_id": task_id})
    for kwargs, message in [({"families": ["chess"]}, "families"), ({"families": []}, "families"),
                            ({"split": "dev"}, "split"), ({"format_penalty": -1}, "format_penalty")]:
        with pytest.raises(ConfigError, match=message):
            FunctionCallingEnv(**kwargs)
    assert agentgym.spec("tools-v0").max_turns == 10


def test_snapshot_restores_the_database_mid_episode() -> None:
    env = FunctionCallingEnv()
    env.reset(options={"task_id": "tools/close_account/3"})
    env.step(env.expert_action())
    env.step(call("update", key="notes/scratch", value=5))
    data = env.snapshot()
    rest = [env.step(env.expert_action()) for _ in range(2)]
    copy = FunctionCallingEnv()
    copy.restore(data)
    assert copy.render() == env.render() and "notes/scratch" in copy._db.values
    assert [copy.step(copy.expert_action()) for _ in range(2)] == rest
    assert rest[-1][2] and rest[-1][4]["state_correct"] is False  # the scratch key was never asked for


def test_tools_over_the_env_service(make_service: Callable[..., Any]) -> None:
    client = EnvClient(client=make_service(["tools-v0"]))
    local = agentgym.make("tools-v0")
    with RemoteEnv("tools-v0", client=client) as remote:
        for seed in (3, 4):
            expected = json.loads(json.dumps(play_expert(local, seed=seed)))
            assert json.loads(json.dumps(play_expert(remote, seed=seed))) == expected
        remote.reset(seed=5)
        obs, _, _, _, info = remote.step("<tool_call>{oops</tool_call>")
        assert info["invalid_action"] and "not valid JSON" in obs


def test_tool_calls_counts_the_calls_each_step_ran() -> None:
    env = agentgym.make("tools-v0")
    _, info = env.reset(options={"task_id": REPORTED})
    assert info["tool_calls"] == 0
    _, _, _, _, info = env.step(call("lookup", key="accounts/ivan/balance")
                                + call("calculate", expression="1 / 0"))
    assert info["tool_calls"] == 2 and info["tool_errors"] == 1  # a failing call ran too
    _, _, _, _, info = env.step(call("lookup", key="x") + call("answer", answer="1")
                                + call("lookup", key="x"))
    assert info["invalid_action"] and info["tool_calls"] == 0  # answer not last: nothing ran
    _, _, _, _, info = env.step(call("lookup", key="x") * (MAX_CALLS_PER_TURN + 1))
    assert info["invalid_action"] and info["tool_calls"] == 0
    _, _, terminated, _, info = env.step(call("calculate", expression="2 + 2") + call("answer", answer="4"))
    assert terminated and info["tool_calls"] == 1  # the answer is not a tool call
