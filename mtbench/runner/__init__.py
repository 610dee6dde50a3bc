"""The run, split by stage. `training.py` is one run from top to bottom; the stages it calls live in
`data/` (corpus to batches), `loop/` (batches to trained weights), `evaluation/` (weights to scores),
`measurement/` (the machine and the FLOPs behind every figure) and `results/` (figures to files and tables)."""

from mtbench.plugins import manager as _manager
from mtbench.runner.tasks import BUILTIN_TASK_MODULES as _TASKS

for _module in _TASKS:
    _manager.add_builtin_plugin(_module)
