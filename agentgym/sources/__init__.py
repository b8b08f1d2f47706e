"""Where the envs of a training run or an evaluation come from (``env_source.EnvSource``: in-process, env
services, a fleet, Ray) and which tasks they play (``task_split``): the env side that training and
evaluation share, below both."""
