"""``ProductSearch``: BM25 (``bm25s``, through ``agentgym.retrieval.index``) over a catalog's products.

Each product is one document: its title, and as text its category path, attributes, option values,
features and description. Like WebShop's search engine it returns at most ``MAX_RESULTS`` products (five
pages of ten), best first; ties keep catalog order, and products sharing no word with the query are not
returned. Results are cached per query: a group of rollouts repeats the same searches.
"""

from __future__ import annotations

import functools

from agentgym.envs.webshop.catalog import Catalog
from agentgym.retrieval.index import Index, tokenize

#: Most products one search returns (WebShop: 50).
MAX_RESULTS = 50


def canonical_query(query: str) -> str:
    """The query as the engine sees it (its index words, space-separated): equal for equal results.

    Example:
        >>> canonical_query("  Waterproof MASCARA, in black!")
        'waterproof mascara black'
    """
    return " ".join(tokenize(query))


class ProductSearch:
    """The search engine of one catalog; build it once per catalog (``search_engine``).

    Args:
        catalog: the products to index.

    Example:
        >>> from agentgym.envs.webshop.catalog import generate_catalog
        >>> catalog = generate_catalog(0, 50)
        >>> engine = ProductSearch(catalog)
        >>> target = catalog.products[0]
        >>> target.asin in engine.search(target.title)[:3]
        True
    """

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.index = Index({"id": product.asin, "title": product.title, "text": product.search_text()}
                           for product in catalog.products)
        self._cached = functools.lru_cache(maxsize=4096)(self._search)

    def search(self, query: str) -> tuple[str, ...]:
        """Ids of the best ``MAX_RESULTS`` products for ``query``, best first (empty when no word matches)."""
        return self._cached(canonical_query(query))

    def _search(self, canonical: str) -> tuple[str, ...]:
        if not canonical:
            return ()
        return tuple(hit.id for hit in self.index.search([canonical], k=MAX_RESULTS)[0])


@functools.lru_cache(maxsize=8)
def search_engine(catalog: Catalog) -> ProductSearch:
    """The one ``ProductSearch`` of ``catalog`` in this process (indexing happens once)."""
    return ProductSearch(catalog)
