"""The shop's data: ``Product``, ``Goal``, ``Catalog``, the generated catalog and goals built from a product.

A catalog is a tuple of products and a tuple of goals (the tasks). ``generate_catalog`` builds one from
a seed without any download: product types grouped in WebShop's categories (beauty, fashion, home,
electronics, grocery, health, sports), each with its own attribute pool and option groups; every product
gets a brand, a few attributes, option values, a price, a description and feature bullets. ``build_goal``
turns a product into a WebShop-style instruction (attributes, one value per option group and a price
bound), the same way for generated products and for WebShop's released data (``envs.webshop.data``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentgym.envs.arguments import check_int

#: Price bounds an instruction may use, as in WebShop: 10, 20, ..., 990 dollars.
PRICE_RANGE: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
#: Price bound of an instruction whose product costs more than every bound but three (WebShop's "no bound").
NO_PRICE_BOUND = 1_000_000.0
#: Products in a generated catalog by default, and the most ``generate_catalog`` makes.
DEFAULT_NUM_PRODUCTS, MAX_NUM_PRODUCTS = 500, 5000


@dataclass(frozen=True)
class Product:
    """One product of the shop, as WebShop's item pages show it."""

    asin: str
    """Product id (WebShop's Amazon ids, ``B0...``); results pages show it as a button, lowercased."""
    title: str
    """The product's name."""
    category: str
    """Top-level category (``"beauty"``)."""
    product_category: str
    """Category path, levels joined by ``" › "`` (``"beauty › makeup › eyes › mascara"``)."""
    query: str
    """The product-type search query the product was collected under (``"mascara"``)."""
    attributes: tuple[str, ...]
    """What the product is (``"waterproof"``, ``"long lasting"``); lowercase."""
    options: tuple[tuple[str, tuple[str, ...]], ...]
    """Option groups in page order: ``(("color", ("black", "brown")), ...)``; values lowercase."""
    price: float
    """Price in dollars."""
    description: str
    """The description sub-page's text."""
    features: tuple[str, ...]
    """The features sub-page's bullet points."""

    def option_group(self, value: str) -> str | None:
        """The group holding option ``value`` (the first one, if several do), or ``None``."""
        for name, values in self.options:
            if value in values:
                return name
        return None

    def search_text(self) -> str:
        """The text the search engine indexes besides the title: category, attributes, options, features,
        description."""
        option_values = " ".join(value for _, values in self.options for value in values)
        return " ".join((self.product_category.replace("›", " "), " ".join(self.attributes), option_values,
                         " ".join(self.features), self.description))


@dataclass(frozen=True)
class Goal:
    """One task: buy a product with these attributes and options under a price bound."""

    asin: str
    """The product the instruction was written from (it satisfies the goal)."""
    instruction: str
    """What the agent reads: ``"i need a waterproof mascara, with color: black, and price lower than 40.00
    dollars"``."""
    search_text: str
    """The instruction without its price clause: the words the expert searches with."""
    attributes: tuple[str, ...]
    """Attributes the bought product must have (WebShop's ``instruction_attributes``)."""
    options: tuple[tuple[str, str], ...]
    """One wanted value per option group: ``(("color", "black"),)``."""
    price_upper: float
    """The price bound in dollars (``NO_PRICE_BOUND`` when the instruction states none)."""
    name: str
    """The target's title (for the type reward)."""
    query: str
    """The target's search query (for the type reward)."""
    product_category: str
    """The target's category path (for the type reward)."""


@dataclass(eq=False)
class Catalog:
    """Products and goals of one shop, with an id index; one instance per catalog per process (compared and
    hashed by identity, so caches keyed on it stay cheap)."""

    name: str
    """Names the catalog in task ids: ``"gen-s0-n500"`` for a generated one, ``"data"`` for WebShop's."""
    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    by_asin: dict[str, Product] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {product.asin: product for product in self.products}


def price_bound(price: float, rng: np.random.Generator) -> float:
    """WebShop's price bound for a product costing ``price``: of the (at most) four ``PRICE_RANGE`` bounds
    above the price, two are drawn and the larger kept; ``NO_PRICE_BOUND`` when fewer than two exist.

    Example:
        >>> price_bound(24.5, np.random.default_rng(0)) in (40.0, 50.0, 60.0)
        True
    """
    above = [bound for bound in PRICE_RANGE if bound > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND
    picked = rng.choice(len(above), size=2, replace=False)
    return above[int(max(picked))]


def build_goal(product: Product, instruction: str, attributes: Sequence[str],
               chosen_options: Mapping[str, str], price_upper: float) -> Goal:
    """The goal of buying ``product`` with ``chosen_options``: WebShop's synthetic instruction, i.e. the
    product's instruction text, then ``" with <group>: <value>, and ..."``, then the price clause.

    Example:
        >>> p = Product("B0TEST0001", "Lumera Waterproof Mascara", "beauty", "beauty › mascara", "mascara",
        ...             ("waterproof",), (("color", ("black", "brown")),), 12.5, "", ())
        >>> build_goal(p, "i need a waterproof mascara", ["waterproof"], {"color": "black"}, 30.0).instruction
        'i need a waterproof mascara, with color: black, and price lower than 30.00 dollars'
    """
    option_text = ", and ".join(f"{name}: {value}" for name, value in chosen_options.items())
    text = instruction.strip() + (f", with {option_text}" if option_text else "")
    price_text = f", and price lower than {price_upper:.2f} dollars" if price_upper < NO_PRICE_BOUND else ""
    return Goal(asin=product.asin, instruction=text + price_text, search_text=text,
                attributes=tuple(attributes), options=tuple(chosen_options.items()), price_upper=price_upper,
                name=product.title, query=product.query, product_category=product.product_category)


# --- the generated catalog -------------------------------------------------------------------------

_COLORS = ("black", "white", "brown", "navy blue", "red", "green", "pink", "grey", "beige", "purple")
_CLOTHING_SIZES = ("small", "medium", "large", "xl")

# (category path, product type, attribute pool, option groups). Within a group no value's words are a
# subset of another's ("large" / "x-large" would match each other under the fuzzy option match).
_TYPES: tuple[tuple[str, str, tuple[str, ...], dict[str, tuple[str, ...]]], ...] = (
    ("beauty › makeup › eyes › mascara", "mascara",
     ("long lasting", "waterproof", "cruelty free", "paraben free", "smudge proof", "volumizing"),
     {"color": ("black", "brown", "navy blue", "burgundy")}),
    ("beauty › skin care › face › moisturizers", "face moisturizer",
     ("fragrance free", "oil free", "sensitive skin", "hyaluronic acid", "non comedogenic", "anti aging"),
     {"size": ("1.7 fl oz", "3.4 fl oz", "8 fl oz")}),
    ("beauty › hair care › shampoo", "shampoo",
     ("sulfate free", "natural ingredients", "color safe", "dry hair", "anti dandruff", "paraben free"),
     {"size": ("12 ounce", "16 ounce", "33.8 ounce"), "scent": ("coconut", "lavender", "unscented")}),
    ("beauty › makeup › lips › lipstick", "lipstick",
     ("long lasting", "matte finish", "cruelty free", "moisturizing", "vegan"),
     {"color": ("red", "pink", "nude", "berry", "coral")}),
    ("fashion › women › dresses", "summer dress",
     ("machine wash", "short sleeve", "polyester spandex", "button closure", "loose fit", "v neck"),
     {"color": _COLORS[:8], "size": _CLOTHING_SIZES}),
    ("fashion › men › shirts", "t-shirt",
     ("cotton", "slim fit", "machine wash", "long sleeve", "moisture wicking", "crew neck"),
     {"color": _COLORS, "size": _CLOTHING_SIZES}),
    ("fashion › shoes › running shoes", "running shoes",
     ("non slip", "lightweight", "rubber sole", "breathable", "arch support", "memory foam"),
     {"color": _COLORS[:6], "size": ("7", "8", "9", "10", "11", "12")}),
    ("fashion › women › leggings", "yoga leggings",
     ("high waist", "tummy control", "squat proof", "quick drying", "four way stretch"),
     {"color": _COLORS[:7], "size": _CLOTHING_SIZES}),
    ("home › kitchen › cookware", "frying pan",
     ("non stick", "dishwasher safe", "oven safe", "stainless steel", "induction compatible"),
     {"size": ("8 inch", "10 inch", "12 inch")}),
    ("home › bedding › pillows", "bed pillow",
     ("memory foam", "hypoallergenic", "machine washable", "cooling gel", "down alternative"),
     {"size": ("standard", "queen", "king"), "pack": ("1 pack", "2 pack", "4 pack")}),
    ("home › furniture › office chairs", "office chair",
     ("ergonomic", "adjustable height", "lumbar support", "easy assemble", "high back", "swivel"),
     {"color": ("black", "white", "grey", "beige")}),
    ("home › furniture › living room › coffee tables", "coffee table",
     ("solid wood", "storage space", "easy assemble", "mid century", "living room"),
     {"color": ("walnut", "oak", "espresso", "white")}),
    ("electronics › headphones › earbuds", "wireless earbuds",
     ("bluetooth 5.0", "noise cancelling", "long battery life", "water resistant", "fast charging"),
     {"color": ("black", "white", "pink", "navy blue")}),
    ("electronics › accessories › chargers", "phone charger",
     ("fast charging", "usb c", "compact", "wall mount", "high speed"),
     {"size": ("3 ft", "6 ft", "10 ft"), "pack": ("1 pack", "2 pack", "3 pack")}),
    ("electronics › computers › keyboards", "mechanical keyboard",
     ("wireless", "backlit", "ergonomic", "usb c", "hot swappable"),
     {"color": ("black", "white", "grey")}),
    ("grocery › snacks › nuts", "mixed nuts",
     ("gluten free", "low sodium", "non gmo", "high protein", "keto friendly", "resealable bag"),
     {"flavor": ("sea salt", "honey roasted", "unsalted", "smoked"),
      "size": ("8 ounce", "16 ounce", "2 pound")}),
    ("grocery › beverages › tea", "green tea",
     ("organic", "caffeine free", "non gmo", "individually wrapped", "natural ingredients"),
     {"flavor": ("jasmine", "mint", "lemon", "ginger"), "size": ("20 count", "50 count", "100 count")}),
    ("grocery › breakfast › cereal", "granola",
     ("gluten free", "low sugar", "high protein", "whole grain", "vegan"),
     {"flavor": ("almond", "chocolate", "blueberry", "cinnamon"), "size": ("11 ounce", "24 ounce")}),
    ("health › vitamins › supplements", "vitamin d3 supplement",
     ("non gmo", "gluten free", "easy to swallow", "vegan", "third party tested"),
     {"size": ("60 count", "120 count", "240 count")}),
    ("sports › yoga › mats", "yoga mat",
     ("non slip", "eco friendly", "extra thick", "lightweight", "carrying strap"),
     {"color": ("purple", "blue", "black", "green", "pink")}),
)
_PRICE_BY_CATEGORY = {"beauty": (4.0, 45.0), "fashion": (9.0, 70.0), "home": (15.0, 260.0),
                      "electronics": (9.0, 150.0), "grocery": (3.0, 35.0), "health": (6.0, 40.0),
                      "sports": (12.0, 60.0)}
_SYLLABLES = ("lu", "me", "ra", "vo", "ka", "ti", "zen", "ol", "mi", "sa", "dor", "bel", "no", "vi", "tra",
              "ex", "qua", "lin", "ro", "fa")
_OPENERS = ("i need", "i am looking for", "i want", "find me", "i'm searching for")
_BENEFITS = ("for everyday use", "built to last", "a customer favourite", "great value for the price",
             "easy to care for", "backed by a one year warranty")


def _brand(rng: np.random.Generator) -> str:
    parts = rng.choice(len(_SYLLABLES), size=int(rng.integers(2, 4)), replace=False)
    return "".join(_SYLLABLES[int(k)] for k in parts).capitalize()


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _generate_product(rng: np.random.Generator, brands: Sequence[str], asin: str) -> tuple[Product, Goal]:
    path, kind, pool, groups = _TYPES[int(rng.integers(len(_TYPES)))]
    category = path.split(" › ")[0]
    num_attributes = int(rng.integers(2, min(4, len(pool)) + 1))
    picked = sorted(rng.choice(len(pool), size=num_attributes, replace=False))
    attributes = tuple(pool[int(k)] for k in picked)
    options: list[tuple[str, tuple[str, ...]]] = []
    for name, values in groups.items():
        count = int(rng.integers(2, len(values) + 1))
        options.append((name, tuple(values[int(k)] for k in sorted(rng.choice(len(values), count,
                                                                              replace=False)))))
    brand = brands[int(rng.integers(len(brands)))]
    in_title = [attributes[int(k)] for k in sorted(rng.choice(num_attributes, size=int(rng.integers(1, 3)),
                                                              replace=False))]
    title = f"{brand} {' '.join(a.title() for a in in_title)} {kind.title()}"
    low, high = _PRICE_BY_CATEGORY[category]
    price = round(float(rng.uniform(low, high)), 2)
    features = tuple(f"{a.capitalize()}: {_BENEFITS[int(rng.integers(len(_BENEFITS)))]}" for a in attributes)
    description = (f"The {brand} {kind} is {', '.join(attributes[:-1])} and {attributes[-1]}. "
                   f"Available in {len(options[0][1])} {options[0][0]}s.")
    product = Product(asin, title, category, path, kind, attributes, tuple(options), price, description,
                      features)
    # WebShop's instructions name 1-3 of the product's attributes and one value of every option group.
    wanted = tuple(attributes[int(k)] for k in sorted(rng.choice(num_attributes, size=int(rng.integers(
        1, min(3, num_attributes) + 1)), replace=False)))
    chosen = {name: values[int(rng.integers(len(values)))] for name, values in options}
    opener = _OPENERS[int(rng.integers(len(_OPENERS)))]
    described = " ".join(wanted)
    text = f"{opener} {_article(described)} {described} {kind}"
    return product, build_goal(product, text, wanted, chosen, price_bound(price, rng))


@functools.lru_cache(maxsize=8)
def generate_catalog(seed: int = 0, num_products: int = DEFAULT_NUM_PRODUCTS) -> Catalog:
    """A generated catalog of ``num_products`` products and one goal per product (cached per process).

    Args:
        seed: decides every product, price and instruction.
        num_products: catalog size, in ``[1, MAX_NUM_PRODUCTS]``.

    Raises:
        ConfigError: ``num_products`` is out of range.

    Example:
        >>> catalog = generate_catalog(0, 50)
        >>> len(catalog.products), len(catalog.goals), catalog.name
        (50, 50, 'gen-s0-n50')
        >>> goal = catalog.goals[0]
        >>> catalog.by_asin[goal.asin].price <= goal.price_upper
        True
    """
    check_int(num_products, "num_products", 1, MAX_NUM_PRODUCTS)
    rng = np.random.default_rng([int(seed), 0x5E0B])
    brands = sorted({_brand(rng) for _ in range(60)})
    asins = set()
    products: list[Product] = []
    goals: list[Goal] = []
    while len(products) < num_products:
        asin = "B0" + "".join(rng.choice(list("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"), size=8))
        if asin in asins:
            continue
        asins.add(asin)
        product, goal = _generate_product(rng, brands, asin)
        products.append(product)
        goals.append(goal)
    return Catalog(f"gen-s{int(seed)}-n{int(num_products)}", tuple(products), tuple(goals))

