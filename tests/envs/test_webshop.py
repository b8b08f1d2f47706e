"""webshop-v0: the generated catalog, WebShop's reward, the pages, state keys, the expert, WebShop's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentgym
from agentgym.checker import check_env
from agentgym.envs.webshop.catalog import NO_PRICE_BOUND, Goal, Product, generate_catalog, price_bound
from agentgym.envs.webshop.data import load_webshop_catalog
from agentgym.envs.webshop.env import WebShopEnv
from agentgym.envs.webshop.reward import score_purchase, token_set_ratio, type_reward
from agentgym.envs.webshop.search import MAX_RESULTS, search_engine
from agentgym.errors import ConfigError

MASCARA = Product("B0MASCARA1", "Lumera Waterproof Mascara", "beauty", "beauty › makeup › eyes › mascara",
                  "mascara", ("waterproof", "cruelty free"), (("color", ("black", "brown")),), 24.99,
                  "A mascara that stays on.", ("Waterproof: stays on in the rain",))
WANTED = "i need a waterproof long lasting mascara, with color: black"
GOAL = Goal("B0TARGET01", f"{WANTED}, and price lower than 40.00 dollars", WANTED,
            ("waterproof", "long lasting"), (("color", "black"),), 40.0,
            "Velora Long Lasting Waterproof Mascara", "mascara", "beauty › makeup › eyes › mascara")


def play_expert(env: WebShopEnv, **reset_kwargs) -> tuple[float, dict, int]:
    _, info = env.reset(**reset_kwargs)
    steps, reward = 0, 0.0
    while (action := env.expert_action()) is not None:
        _, reward, terminated, _, info = env.step(action)
        assert not info["invalid_action"], action
        steps += 1
        assert steps <= 15
    assert terminated
    return reward, info, steps


# --- catalog and search ----------------------------------------------------------------------------


def test_generated_catalog_is_deterministic_cached_and_every_goal_fits_its_target():
    catalog = generate_catalog(3, 80)
    assert generate_catalog(3, 80) is catalog  # cached per process
    generate_catalog.cache_clear()
    again = generate_catalog(3, 80)
    assert again is not catalog and again.products == catalog.products and again.goals == catalog.goals
    assert generate_catalog(4, 80).products != catalog.products
    assert len({p.asin for p in catalog.products}) == 80 and len(catalog.goals) == 80
    for goal in catalog.goals:
        target = catalog.by_asin[goal.asin]
        assert 1 <= len(goal.attributes) <= 3 and set(goal.attributes) <= set(target.attributes)
        assert [name for name, _ in goal.options] == [name for name, _ in target.options]
        assert target.price <= goal.price_upper and goal.instruction.startswith(goal.search_text)
        assert score_purchase(target, dict(goal.options), goal).reward == 1.0


def test_price_bound_follows_webshop_range():
    # 24.5 dollars: the bounds above it are 30, 40, 50, 60; two are drawn, the larger is kept (never 30).
    import numpy as np

    bounds = {price_bound(24.5, np.random.default_rng(seed)) for seed in range(200)}
    assert bounds == {40.0, 50.0, 60.0}
    assert price_bound(985.0, np.random.default_rng(0)) == NO_PRICE_BOUND  # only 990 lies above


def test_search_ranks_a_title_first_and_caps_results():
    catalog = generate_catalog(0, 200)
    engine = search_engine(catalog)
    assert search_engine(catalog) is engine
    for product in catalog.products[:20]:
        assert product.asin in engine.search(product.title)[:5]
    assert len(engine.search("black")) == MAX_RESULTS
    assert engine.search("zzqx") == () and engine.search("  the of ") == ()


# --- reward ----------------------------------------------------------------------------------------


def test_token_set_ratio_hand_computed():
    assert token_set_ratio("Long-Lasting", "long lasting") == 100.0
    assert token_set_ratio("navy blue", "blue") == 100.0  # a subset matches fully, as in WebShop
    # "8 ounce" / "16 ounce": the best pair is "ounce" vs "ounce 8", 2 * 5 matching of 5 + 7 characters;
    # "ounce 8" vs "ounce 16" gives 2 * 6 / 15. Under WebShop's 85: different options.
    assert token_set_ratio("8 ounce", "16 ounce") == pytest.approx(100 * 10 / 12, abs=1e-6)
    assert token_set_ratio("", "black") == 0.0


def test_reward_hand_computed_examples():
    # 2 attributes + 1 option + price: denominator 4. Waterproof yes, long lasting no, black, 24.99 <= 40.
    assert score_purchase(MASCARA, {"color": "black"}, GOAL).reward == 0.75
    assert score_purchase(MASCARA, {"color": "brown"}, GOAL).reward == 0.5
    assert score_purchase(MASCARA, {}, GOAL).reward == 0.5
    cheap_goal = Goal(**{**GOAL.__dict__, "price_upper": 20.0})
    assert score_purchase(MASCARA, {"color": "black"}, cheap_goal).reward == 0.5  # price fails: 2 / 4
    # An attribute found only in the description counts: "stays on" is not an attribute, "mascara" text is.
    staying = Goal(**{**GOAL.__dict__, "attributes": ("stays on",)})
    assert score_purchase(MASCARA, {"color": "black"}, staying).reward == 1.0
    details = score_purchase(MASCARA, {"color": "black"}, GOAL)
    assert (details.attribute_matches, details.option_matches, details.price_ok) == (1, 1, True)
    assert details.query_match and details.category_match


def test_type_reward_levels():
    # Goal type words: velora, long, lasting, waterproof, mascara (5).
    other_query = Product(**{**MASCARA.__dict__, "query": "eye makeup",
                             "product_category": "beauty › lashes"})
    assert type_reward(MASCARA, GOAL)[:2] == (1.0, 2 / 5)  # query and category match
    # no query, one shared level only, title 2/5 > 0.2: still 1.0
    assert type_reward(other_query, GOAL)[0] == 1.0
    one_word = Product(**{**other_query.__dict__, "title": "Lumera Mascara"})
    assert type_reward(one_word, GOAL)[:2] == (0.5, 1 / 5)  # 0.2 is not > 0.2 and nothing else matches
    shampoo = Product(**{**other_query.__dict__, "title": "Ollin Shampoo", "query": "shampoo",
                         "product_category": "beauty › hair care › shampoo"})
    assert type_reward(shampoo, GOAL)[:2] == (0.0, 0.0)
    assert score_purchase(shampoo, {"color": "black"}, GOAL).reward == 0.0
    long_goal = Goal(**{**GOAL.__dict__, "name": " ".join(f"word{c}" for c in "abcdefghijk") + " mascara"})
    assert type_reward(one_word, long_goal)[:2] == (0.1, 1 / 12)  # under 10% of the type words


# --- pages, actions, state keys --------------------------------------------------------------------


def test_pages_pagination_options_and_subpages():
    env = WebShopEnv(num_products=200)
    obs, info = env.reset(seed=5)
    assert obs.startswith("Instruction: ") and info["admissible_actions"] == ["search[<query>]"]
    assert info["state_key"] == f"{info['task_id']}|search" and "instructions" in info
    obs, reward, terminated, _, info = env.step("search[Black  COLOR]")
    assert (reward, terminated, info["invalid_action"]) == (0.0, False, False)
    assert "page 1 of 5 (50 products)" in obs
    assert info["state_key"] == f"{info['task_id']}|results|black color|p1"
    assert info["admissible_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert len(info["admissible_actions"]) == 12  # back, next and ten products
    _, _, _, _, info = env.step("click[next >]")
    assert info["state_key"].endswith("|p2") and "click[< prev]" in info["admissible_actions"]
    for _ in range(3):
        _, _, _, _, info = env.step("click[next >]")
    assert info["state_key"].endswith("|p5") and "click[next >]" not in info["admissible_actions"]
    product_button = info["admissible_actions"][-1]
    asin = product_button[len("click["):-1].upper()
    obs, _, _, _, info = env.step(product_button)
    product = env.catalog.by_asin[asin]
    assert product.title in obs and info["state_key"] == f"{info['task_id']}|item|{asin}|"
    (group, values), *_ = product.options
    env.step(f"click[{values[0]}]")
    _, _, _, _, info = env.step(f"click[{values[1]}]")  # a second value of one group replaces the first
    assert info["state_key"] == f"{info['task_id']}|item|{asin}|{group}={values[1]}"
    obs, _, _, _, info = env.step("click[features]")
    assert "Features:" in obs and info["state_key"].endswith("|features")
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    _, _, _, _, info = env.step("click[< prev]")
    assert info["state_key"] == f"{info['task_id']}|item|{asin}|{group}={values[1]}"
    _, _, _, _, info = env.step("click[< prev]")
    assert info["state_key"].endswith("|results|black color|p5")
    _, _, _, _, info = env.step("click[back to search]")
    assert info["state_key"].endswith("|search")


def test_invalid_actions_explain_and_change_nothing():
    env = WebShopEnv(num_products=60)
    _, info = env.reset(seed=1)
    key = info["state_key"]
    for action, why in [("buy it", "is not an action"), ("search[]", "query is empty"),
                        ("click[buy now]", "no [buy now] button"), ("", "is not an action")]:
        obs, reward, terminated, _, info = env.step(action)
        assert obs.startswith("Invalid action: ") and why in obs
        assert (reward, terminated, info["invalid_action"], info["state_key"]) == (0.0, False, True, key)
    env.step("search[mascara]")
    obs, _, _, _, info = env.step("search[shampoo]")
    assert info["invalid_action"] and "search page only" in obs


def test_state_key_names_the_state_not_the_path():
    env = WebShopEnv(num_products=200)
    goal_task = "webshop/gen-s0-n200/7"

    def item_key(query: str, clicks: list[str]) -> str:
        env.reset(options={"task_id": goal_task})
        _, _, _, _, info = env.step(f"search[{query}]")
        asin = env.catalog.products[0].asin
        assert f"click[{asin.lower()}]" in info["admissible_actions"], query
        env.step(f"click[{asin.lower()}]")
        for click in clicks:
            _, _, _, _, info = env.step(click)
        return info["state_key"]

    title = env.catalog.products[0].title
    values = [group[0] for _, group in env.catalog.products[0].options]
    first = item_key(title, [f"click[{v}]" for v in values])
    # another query, the options in the other order, a detour through the description and a typo
    second = item_key(title.upper() + " !", ["click[description]", "click[< prev]", "click[nope]",
                                             *[f"click[{v}]" for v in reversed(values)]])
    assert first == second


def test_expert_reaches_reward_one_on_every_goal():
    env = WebShopEnv(catalog_seed=1, num_products=150)
    for index in range(len(env.catalog.goals)):
        reward, info, _ = play_expert(env, options={"task_id": f"webshop/gen-s1-n150/{index}"})
        assert reward == 1.0 and info["success"] and info["purchase"]["reward"] == 1.0
        assert env.expert_action() is None


def test_expert_pages_back_and_leaves_unfit_products():
    env = WebShopEnv(num_products=200)
    env.reset(seed=2)
    env.step(f"search[{env.goal.search_text}]")
    results = env._results  # the expert's choice is the first fitting result
    fitting = next(n for n, asin in enumerate(results) if env._plan(asin) is not None)
    assert fitting < 10 and len(results) > 10
    env.step("click[next >]")
    assert env.expert_action() == "click[< prev]"
    env.step("click[< prev]")
    unfit = next(asin for asin in results[:10] if env._plan(asin) is None)
    env.step(f"click[{unfit.lower()}]")
    assert env.expert_action() == "click[< prev]"
    env.step("click[< prev]")
    assert env.expert_action() == f"click[{results[fitting].lower()}]"


def test_snapshot_restore_continues_identically():
    env = WebShopEnv(num_products=100)
    env.reset(seed=9)
    env.step(env.expert_action())
    env.step(env.expert_action())
    data = env.snapshot()
    tail = [env.step(env.expert_action()) for _ in range(2)]
    copy = WebShopEnv(num_products=100)  # never reset
    copy.restore(data)
    assert [copy.step(copy.expert_action()) for _ in range(2)] == tail
    with pytest.raises(ConfigError):
        WebShopEnv(num_products=101).restore(data)


def test_registered_env_passes_the_contract_checker():
    spec = agentgym.spec("webshop-v0")
    assert spec.max_turns == 15 and "Expert:" in spec.description
    check_env("webshop-v0")
    check_env(lambda: WebShopEnv(catalog_seed=2, num_products=40), seed=3)


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="num_products"):
        WebShopEnv(num_products=0)
    with pytest.raises(ConfigError, match="catalog_seed"):
        WebShopEnv(catalog_seed=-1)
    env = WebShopEnv(num_products=30)
    for task_id in ("webshop/gen-s0-n30/30", "webshop/gen-s1-n30/0", "webshop/gen-s0-n30/07", 5):
        with pytest.raises(ConfigError, match="task_id"):
            env.reset(options={"task_id": task_id})


# --- WebShop's released files ----------------------------------------------------------------------


def write_webshop_files(folder: Path) -> None:
    products = [
        {"asin": "B07MASC001", "name": "Lumera Long Lasting Waterproof Mascara", "category": "beauty",
         "query": "Mascara ", "product_category": "Beauty & Personal Care › Makeup › Eyes › Mascara",
         "full_description": "A mascara for all day wear.", "small_description": ["Waterproof formula"],
         "pricing": "$12.99", "images": [""],
         "customization_options": {"Color": [{"value": "Black/Gold", "image": None},
                                             {"value": "Brown", "image": None}],
                                   "Size": [{"value": "2 Pack", "image": None},
                                            {"value": "1 Pack", "image": None}]}},
        {"asin": "B07SHAM002", "name": "Ollin Sulfate Free Shampoo", "category": "beauty", "query": "shampoo",
         "product_category": "Beauty & Personal Care › Hair Care › Shampoo", "full_description": "",
         "small_description": "Gentle", "pricing": "$8.50 to $15.00", "customization_options": None},
        {"asin": "B07MASC001", "name": "duplicate id, skipped", "customization_options": None},
        {"asin": "nan", "name": "no id, skipped", "customization_options": None},
    ]
    attributes = {
        "B07MASC001": {"attributes": ["long lasting", "waterproof"],
                       "instruction": "i need a long lasting waterproof mascara",
                       "instruction_attributes": ["long lasting", "waterproof"]},
        "B07SHAM002": {"attributes": ["sulfate free"]},  # no instruction: no goal
    }
    (folder / "items_shuffle_1000.json").write_text(json.dumps(products), encoding="utf-8")
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attributes), encoding="utf-8")


def test_webshop_data_dir_loads_products_and_goals(tmp_path):
    write_webshop_files(tmp_path)
    catalog = load_webshop_catalog(str(tmp_path))
    assert [p.asin for p in catalog.products] == ["B07MASC001", "B07SHAM002"]
    mascara, shampoo = catalog.products
    assert mascara.options == (("color", ("black | gold", "brown")), ("size", ("2 pack", "1 pack")))
    assert mascara.query == "mascara" and mascara.price == 12.99 and shampoo.price == 8.5
    assert shampoo.features == ("Gentle",) and shampoo.options == ()
    # one goal per option combination (2 colours x 2 sizes), options in sorted group order
    assert len(catalog.goals) == 4
    assert catalog.goals[0].instruction.startswith(
        "i need a long lasting waterproof mascara, with color: black | gold, and size: 2 pack, and price "
        "lower than ")
    assert {goal.price_upper for goal in catalog.goals} <= {30.0, 40.0, 50.0}
    env = WebShopEnv(data_dir=str(tmp_path))
    for index in range(4):
        reward, info, _ = play_expert(env, options={"task_id": f"webshop/data/{index}"})
        assert reward == 1.0 and info["purchase"]["asin"] == "B07MASC001"
    check_env(lambda: WebShopEnv(data_dir=str(tmp_path)))


def test_webshop_data_dir_errors_name_the_files(tmp_path):
    with pytest.raises(ConfigError, match="not a folder"):
        load_webshop_catalog(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="items_shuffle_1000.json"):
        load_webshop_catalog(str(tmp_path))
    write_webshop_files(tmp_path)
    (tmp_path / "items_ins_v2_1000.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match="no product .* has an instruction"):
        load_webshop_catalog(str(tmp_path))
