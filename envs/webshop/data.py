"""``load_webshop_catalog``: a ``Catalog`` from WebShop's released product files in a local folder.

The folder holds two of WebShop's JSON files (``web_agent_site/data`` in its repository; nothing is
downloaded here):

- ``items_shuffle_1000.json`` (or ``items_shuffle.json``, the full set): a list of products, each an object
  with ``asin``, ``name``, ``category``, ``query``, ``product_category`` (levels joined by ``" › "``),
  ``full_description``, ``small_description`` (the feature bullets: a list or one string), ``pricing``
  (``"$12.99"`` or ``"$10.00 to $20.00"``; missing means $100) and ``customization_options`` (option
  group → list of ``{"value": ..., "image": ...}``, or null).
- ``items_ins_v2_1000.json`` (or ``items_ins_v2.json``): an object from asin to ``{"attributes": [...],
  "instruction": "i need ...", "instruction_attributes": [...]}``.

Products are read as WebShop's engine reads them: ids that are ``"nan"``, longer than 10 characters or
repeated are skipped, option values are stripped, lowercased and have ``/`` written as ``" | "``, and a
product without attributes gets ``["DUMMY_ATTR"]``. A price range counts as its lower bound (WebShop
draws a price inside the range). Goals are WebShop's synthetic goals: one per combination of option
values of every product with an instruction, with a price bound from ``price_bound`` (seeded with 233,
WebShop's seed). When both a ``_1000`` file and a full file are present, the ``_1000`` one is read.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.envs.webshop.catalog import Catalog, Goal, Product, build_goal, price_bound
from agentgym.errors import ConfigError

PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
#: Price of a product without ``pricing`` (WebShop's default).
DEFAULT_PRICE = 100.0
_GOAL_SEED = 233
_PRICE_RE = re.compile(r"[^\d.]")


def _find(folder: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"WebShop data folder {str(folder)!r} has none of {', '.join(names)}; point "
                      "data_dir at the folder holding WebShop's items_shuffle*.json and items_ins_v2*.json")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read WebShop file {str(path)!r}: {exc}") from None


def _price(pricing: Any, where: str) -> float:
    if not pricing:
        return DEFAULT_PRICE
    if not isinstance(pricing, str):
        raise ConfigError(f"{where}: 'pricing' must be a string like '$12.99', got {pricing!r:.60}")
    try:
        values = [float(_PRICE_RE.sub("", part)) for part in pricing.split("$")[1:]]
    except ValueError:
        values = []
    if not values:
        raise ConfigError(f"{where}: 'pricing' {pricing!r:.60} has no price; write it like '$12.99'")
    return values[0]


def _options(raw: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not raw:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: 'customization_options' must be an object of option lists")
    groups = []
    for name, contents in raw.items():
        if contents is None:
            continue
        if not isinstance(contents, list) or not all(isinstance(c, dict) and isinstance(c.get("value"), str)
                                                     for c in contents):
            raise ConfigError(f"{where}: option group {name!r} must be a list of {{'value': ...}} objects")
        values = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
        if values:
            groups.append((str(name).lower(), values))
    return tuple(groups)


def _product(raw: Any, number: int, attributes: dict[str, Any]) -> Product:
    where = f"product {number}"
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ConfigError(f"{where}: each product must be an object with a string 'name'")
    bullets = raw.get("small_description") or []
    features = tuple(str(b) for b in bullets) if isinstance(bullets, list) else (str(bullets),)
    known = attributes.get(raw["asin"]) or {}
    own = known.get("attributes") or ["DUMMY_ATTR"]
    return Product(asin=raw["asin"], title=raw["name"], category=str(raw.get("category") or ""),
                   product_category=str(raw.get("product_category") or ""),
                   query=str(raw.get("query") or "").lower().strip(), attributes=tuple(str(a) for a in own),
                   options=_options(raw.get("customization_options"), where),
                   price=_price(raw.get("pricing"), where),
                   description=str(raw.get("full_description") or ""), features=features)


@functools.lru_cache(maxsize=4)
def load_webshop_catalog(data_dir: str) -> Catalog:
    """The catalog and synthetic goals of a WebShop data folder (read once per process).

    Args:
        data_dir: the folder with ``items_shuffle*.json`` and ``items_ins_v2*.json`` (see the module).

    Raises:
        ConfigError: a file is missing or malformed (the message names the file or product), or no
            product has an instruction.
    """
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"data_dir {data_dir!r} is not a folder; give the folder holding WebShop's "
                          "items_shuffle*.json and items_ins_v2*.json")
    raw_products = _read_json(_find(folder, PRODUCT_FILES))
    attributes = _read_json(_find(folder, ATTRIBUTE_FILES))
    if not isinstance(raw_products, list):
        raise ConfigError(f"{PRODUCT_FILES[0]}-style file must hold a list of products")
    if not isinstance(attributes, dict):
        raise ConfigError(f"{ATTRIBUTE_FILES[0]}-style file must hold an object from asin to attributes")
    products: list[Product] = []
    seen: set[str] = set()
    for number, raw in enumerate(raw_products):
        asin = raw.get("asin") if isinstance(raw, dict) else None
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(_product(raw, number, attributes))
    rng = np.random.default_rng(_GOAL_SEED)
    goals: list[Goal] = []
    for product in products:
        known = attributes.get(product.asin) or {}
        instruction, wanted = known.get("instruction"), known.get("instruction_attributes")
        if not isinstance(instruction, str) or not instruction.strip() or not wanted:
            continue
        bound = price_bound(product.price, rng)
        names = sorted(name for name, _ in product.options)
        values = dict(product.options)
        for combination in itertools.product(*(values[name] for name in names)):
            goals.append(build_goal(product, instruction, [str(a) for a in wanted],
                                    dict(zip(names, combination, strict=True)), bound))
    if not goals:
        raise ConfigError(f"no product in {str(folder)!r} has an instruction with instruction_attributes "
                          f"in {ATTRIBUTE_FILES[0]}; the env needs at least one goal")
    return Catalog("data", tuple(products), tuple(goals))
