"""A training run: the loop (collect → estimate → update → log → checkpoint), the parts it is built from once
(``parts``), its modes as objects (``collection``: synchronous or asynchronous, over ``pipeline``;
``distributed``: one process or several; ``checkpoint``: saving and resuming; ``warm_start``: SFT or another
run's), its set-up, stop and interrupt handling, progress lines, metrics sinks, the learning-curve plot
(``curve``) and the quickstart preset.

The run's folder and the name of every file in it are ``agentgym.run_folder.RunFolder``, below the
layers, because the viewer and evaluation read run folders too.
"""
