"""WebShop-style shopping (``webshop-v0``): catalog, BM25 search, WebShop's reward, the env."""
