"""A training run: the loop (collect → estimate → update → log → checkpoint), its set-up, checkpoints,
stop and interrupt handling, progress lines, metrics sinks, the learning-curve plot (``curve``), SFT
warm-up (``pipeline``), the quickstart preset and multi-process runs (``distributed``).

The run's folder and the name of every file in it are ``agentgym.run_folder.RunFolder``, below the
layers, because the viewer and evaluation read run folders too.
"""
