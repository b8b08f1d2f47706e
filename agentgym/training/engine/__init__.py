"""The update engine: a batch's turns packed into token tensors (``packing``), the policy losses
(``losses``), the update that runs an ``UpdatePlan`` over minibatches (``update``), the off-policy
corrections (``offpolicy``) and the model's weights as a checkpoint holds them (``weights``).

Its modules import torch; plug-in authors import from ``agentgym.training.api``.
"""
