"""Run by tests/plugins/extras/test_torch_accumulation.py as two processes joined over gloo (`TorchProcessGroup`): the
tiny GPT's eager torch step under DistributedDataParallel, as `--extra ddp` wraps it, summing the gradients of 1 and
of 2 micro-batches a step, and the same under fsdp (FSDP2). Each process prints as one JSON line, for each, the
losses of three steps on one batch, the c10d collectives torch's profiler saw dispatched in the third (DDP rebuilds
its buckets after the first, here of at most 64 KiB), and DDP's rebuilt buckets as its reducer logged them, or fsdp's
units.

    python tests/accumulation_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import collections
import itertools
import json
import os
import sys


def main(rank, coordinator):
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import profile

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    from mtbench.plugins.extras.fsdp import torch_sharded_step
    from mtbench.plugins.extras.torch_ddp import gradient_buckets
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    ids = np.random.default_rng(rank).integers(1, 200, size=(4, 16)).astype(np.int32)
    weight = np.ones((4, 16), np.float32)
    report = {"ddp": {}, "fsdp": {}}
    for extra, micro_batches in itertools.product(report, (1, 2)):
        keras.utils.set_random_seed(0)
        model = build_gpt(GPT_PRESETS["tiny"])
        compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny"), 10, {})
        step = EagerTorchTrainStep(model, micro_batches)
        if extra == "ddp":
            # Buckets of at most 64 KiB (the tiny GPT's gradients are about 0.5 MB): several, each reduced once.
            distributed = DistributedDataParallel(model, bucket_cap_mb=1 / 16)
            step.distribute(processes, distributed)
        else:
            step = torch_sharded_step(model, step, processes)
        losses = [float(step((ids,), ids, weight)["loss"]) for _ in range(2)]
        with profile() as trace:
            losses.append(float(step((ids,), ids, weight)["loss"]))
        ran = collections.Counter(event.name for event in trace.events() if event.name.startswith("c10d::"))
        report[extra][micro_batches] = {"collectives": dict(ran), "losses": losses}
        if extra == "ddp":
            # The buckets DDP rebuilt after the first backward pass (its first assignment puts every gradient in one).
            report[extra][micro_batches]["buckets"] = len(gradient_buckets(distributed))
        else:
            report[extra][micro_batches]["units"] = len(step.layout.units)
    processes.close()
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
