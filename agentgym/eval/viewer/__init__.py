"""``agentgym view DIR``: a local web page that replays evaluation and training trajectories turn by turn.

``data.EpisodeIndex`` reads a folder, ``server.create_viewer_app`` serves it with the page
``index.html`` (one static file, no external resources).
"""
