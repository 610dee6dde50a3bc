"""Run by tests/plugins/backends/test_overflow_agreement.py as two processes joined over gloo (`TorchProcessGroup`):
torch's fused AdamW under Keras's loss scaling, where the processes hold different gradients (as fsdp's shards,
tensor-parallel's parts and pipeline stages do) and only process 1's overflow. Twice: with the processes as the
optimizer's group, whose overflow verdicts it combines, and without one. Each process prints as one JSON line, for
each, whether its weights moved, Keras's iteration count and the loss scale after the step.

    python tests/overflow_agreement_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import json
import os
import sys


def main(rank, coordinator):
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import torch
    import torch.distributed as dist

    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    report = {}
    for grouped in (True, False):
        variables = [keras.Variable(torch.ones(4, 3), name="kernel"), keras.Variable(torch.zeros(3), name="bias")]
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.AdamW(learning_rate=0.1))
        fused = FusedAdamW(optimizer, variables, group=dist.group.WORLD if grouped else None)
        before = [v.value.detach().clone() for v in variables]
        scale = float(optimizer.dynamic_scale.value)
        for parameter in fused.parameters:  # the scaled gradients: process 1's last one overflowed
            parameter.grad = torch.full_like(parameter, 0.5 * scale)
        if rank == 1:
            fused.parameters[-1].grad[0] = float("inf")
        fused.step()
        report["grouped" if grouped else "alone"] = {
            "moved": any(not torch.equal(b, v.value) for b, v in zip(before, variables)),
            "iterations": int(optimizer.iterations.value), "scale": float(optimizer.dynamic_scale.value),
            "scale_before": scale, "description": fused.description()}
    processes.close()
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
