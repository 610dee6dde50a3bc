"""What a torch process frees when an extra lays the tiny GPT (4 blocks, bytes, block 32) out over processes: the bytes
of every tensor Python can reach, by storage, before and after, printed as JSON.

    python tests/held_bytes_probe.py pipeline
        stage 0 of 2 lets the other stage's weights and moments go (one process: nothing is sent)
    python -m torch.distributed.run --nproc-per-node 2 tests/held_bytes_probe.py tensor-parallel
        each process keeps its part of the split weights and moments
"""

import dataclasses
import gc
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import torch  # noqa: E402


def live_bytes():
    gc.collect()
    storages = {}
    for thing in gc.get_objects():
        if not isinstance(thing, torch.Tensor) or thing.device.type == "meta":
            continue
        try:
            storage = thing.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a DTensor: its local tensor is counted on its own
            continue
    return sum(storages.values())


def tiny_gpt():
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    keras.utils.set_random_seed(0)
    model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32, decoder_layers=4))
    model.compile(optimizer=keras.optimizers.AdamW(), loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


def pipeline_stage():
    from mtbench.plugins.extras.pipeline_parallel import StageHolding, owning_stages, stage_bounds, stage_variables
    model = tiny_gpt()
    bounds = stage_bounds(4, 2)
    before = live_bytes()
    StageHolding(model, owning_stages(model, bounds), stage_variables(model, bounds, 0), 0, None).hold_distributed()
    freed = before - live_bytes()
    x = model.embed(torch.randint(0, 256, (2, 32)))
    for block in model.blocks[:2]:
        x = block(x)
    return {"freed": freed, "stage_output": list(x.shape)}


def tensor_parallel_split():
    import torch.distributed as dist

    from mtbench.plugins.extras.fsdp import process_mesh
    from mtbench.plugins.extras.tensor_parallel import TorchSplitting, require_plan
    dist.init_process_group("gloo")
    model = tiny_gpt()
    plan, attentions = require_plan(model)
    mesh = process_mesh(dist.get_world_size())
    before = live_bytes()
    TorchSplitting(model, plan, attentions, mesh)
    figures = {"freed": before - live_bytes()}
    dist.destroy_process_group()
    return figures


if __name__ == "__main__":
    figures = {"pipeline": pipeline_stage, "tensor-parallel": tensor_parallel_split}[sys.argv[1]]()
    # One write of the whole line: the processes share the launcher's stdout, and `print` writes the text and its
    # newline apart, so two processes' lines could run together.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (json.dumps(figures) + "\n").encode())
