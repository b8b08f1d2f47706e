"""A training run: the loop (collect → estimate → update → log → checkpoint), its set-up, the run
folder and every file in it (``run_folder``), checkpoints, stop and interrupt handling, progress
lines, metrics sinks, the learning-curve plot (``curve``), SFT warm-up (``pipeline``), the quickstart
preset and multi-process runs (``distributed``).
"""
