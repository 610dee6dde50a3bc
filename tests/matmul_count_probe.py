"""Run by tests/keras_models/test_attention.py in a fresh process (keras fixes its backend at import): for each run
named, trains a new tiny GPT one step with mtbench's torch step (eager, or compiled), then counts the matrix
products the next step ran, by the aten operations that ran them (the eager step's, or those inductor's program
called): products of many matrices at once (attention's, batched over rows and heads) and the rest (a weight's
product, forward and backward; torch.einsum runs a fused projection as a batch of one), and the dtypes of their
inputs. Prints one JSON line, {run: counts}.

    python tests/matmul_count_probe.py KIND-DTYPE ...   (KIND: eager | compiled; DTYPE: a Keras policy)

The runs share one process (each process spends seconds importing torch, Keras and mtbench); list the eager runs
first, as an mtbench process builds one train step and a compiled step's settings stay in the process after it.
The batch, two rows of 16 tokens, is the update probe's (tests/plugins/backends/test_torch_step_honesty.py): the
float32 compiled step compiles the program that probe's compiles, and whichever process runs second loads it from
inductor's cache.
"""

import json
import os
import sys

PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def count(kind, dtype):
    import keras
    import numpy as np
    from torch.profiler import profile

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model

    shape = GPT_PRESETS["tiny"]
    keras.config.set_dtype_policy(dtype)
    model = build_gpt(shape)
    compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype=dtype), 10, {})
    step = CompiledTorchTrainStep(model) if kind == "compiled" else EagerTorchTrainStep(model)
    ids = np.random.default_rng(0).integers(0, 256, (2, 17)).astype("int32")
    batch = (ids[:, :-1],), ids[:, 1:], np.ones((2, 16), np.float32)
    step(*batch)
    with profile(record_shapes=True) as trace:
        step(*batch)
    batched = weights = 0
    input_dtypes = {}
    for event in trace.events():
        if event.name in PRODUCTS:
            for name, dims in zip(event.input_dtypes, event.input_shapes):
                if dims:  # a tensor's (inductor's addmm takes its scalars as inputs too)
                    input_dtypes[name] = input_dtypes.get(name, 0) + 1
            shapes = [dims for dims in event.input_shapes if dims]
            many = event.name.endswith("bmm") and shapes and shapes[0][0] > 1
            batched += bool(many)
            weights += not many
    return {"blocks": shape.decoder_layers, "batched": batched, "weights": weights, "input_dtypes": input_dtypes}


def main(*runs):
    os.environ["KERAS_BACKEND"] = "torch"
    print(json.dumps({run: count(*run.split("-", 1)) for run in runs}))


if __name__ == "__main__":
    main(*sys.argv[1:])
