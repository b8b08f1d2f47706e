"""ALFWorld household tasks (``alfworld-v0``): the env, its engine and the game generator.

The ``alfworld`` package is imported only when an env is made or a game generated.
"""
