"""Run by tests/runner/loop/test_long_runs.py as two processes joined through torch.distributed (gloo): each
evaluates a trained run (`evaluate_and_save`) in two halves with a collective between them, as a task's evaluation
sums its scores over the processes; process 1 is sent SIGINT in the first half. Prints what each returned and
what the evaluation finished as one JSON line.

    python tests/evaluation_signal_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import contextlib
import io
import json
import os
import signal
import sys
from types import SimpleNamespace


def main(rank, coordinator):
    from rich.console import Console

    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    from mtbench.runner.loop.timing import Stopwatch
    from mtbench.runner.training import evaluate_and_save, stopped_after_training
    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    halves = []

    def evaluate(phase):
        with phase("evaluate"):
            if rank == 1:
                os.kill(os.getpid(), signal.SIGINT)
            halves.append(processes.sum([1.0])[0])  # the other process must reach it too
            halves.append(processes.sum([2.0])[0])
        return {"test_loss": 1.5}, {}

    result = {"metrics": {}, "model": {}}
    stopped = evaluate_and_save(
        result, SimpleNamespace(measure_only=False, save_model=False), SimpleNamespace(processes=processes),
        SimpleNamespace(task_code=contextlib.nullcontext, task=SimpleNamespace(metrics=("test_loss",))), None, SimpleNamespace(evaluator=SimpleNamespace(evaluate=evaluate)), SimpleNamespace(writes=rank == 0),
        Stopwatch(), Console(file=io.StringIO()), None, None)  # (no outcome or checkpoints: several finish first)
    print(json.dumps({"stopped": stopped and stopped.name, "exit_code": stopped and stopped.exit_code,
                      "said": stopped and stopped_after_training(result, stopped), "halves": halves,
                      "metrics": result["metrics"]}))
    with contextlib.suppress(Exception):
        processes.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
