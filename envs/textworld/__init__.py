"""TextWorld games (``textworld-v0``); the ``textworld`` package is imported only when a game is made."""
