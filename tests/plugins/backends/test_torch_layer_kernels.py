"""The torch layer kernels (`torch_layer_kernels`) against Keras's own layer calls: the same aten operations in the
same dtypes, bit-equal outputs and gradients, Keras's call wherever a layer is not plain, and the host work they
save counted in Python calls per step."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import json_answer


def run_on_torch(probe):
    """The JSON object a probe prints last, run in a process of its own with keras on torch."""
    env = {**os.environ}
    env.pop("KERAS_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    return json_answer(proc)

PROBE = textwrap.dedent("""
    import contextlib, json, os
    os.environ["KERAS_BACKEND"] = "torch"
    import keras, numpy as np, torch
    from keras import layers
    from torch.utils._python_dispatch import TorchDispatchMode
    from mtbench.plugins.backends import torch_layer_kernels
    from mtbench.plugins.backends.torch_plain_calls import plain_layer_calls
    from mtbench.keras_models.transformer import Embedding

    class Ops(TorchDispatchMode):
        '''The aten operations that ran, with their arguments' dtypes.'''
        def __init__(self):
            super().__init__()
            self.ran = []
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            dtypes = [str(a.dtype) for a in args if isinstance(a, torch.Tensor)]
            self.ran.append(f"{func.__name__}({','.join(dtypes)})")
            return func(*args, **(kwargs or {}))

    class Block(layers.Layer):
        '''Each kernel's layer, nested, in every configuration the kernels serve or hand back to Keras.'''
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(50, 16)
            self.positions = Embedding(8, 16)   # mtbench's: looked up in float32, cast after
            self.norm = layers.LayerNormalization(epsilon=1e-6)
            self.uncentred = layers.LayerNormalization(center=False)
            self.hidden = layers.Dense(32, activation="relu")
            self.out = layers.Dense(16, use_bias=False)
            self.gelu = layers.Dense(16, activation="gelu")
            self.softplus = layers.Dense(16, activation="softplus")  # an activation the kernels leave to Keras
            self.lora = layers.Dense(16)
            self.float32 = layers.Dense(16, dtype="float32")   # a float32 layer inside a mixed-precision one

        def call(self, ids):
            x = self.norm(self.tokens(ids) + self.positions(ids % 8))
            x = x + self.out(self.hidden(x))
            x = self.lora(self.softplus(self.gelu(self.uncentred(x))))
            return self.float32(x)

    served = []   # the layers a kernel computed (it did not hand them back to Keras), by their attribute names
    kernels = torch_layer_kernels.layer_kernels

    def recording_kernels():
        def recording(kernel):
            def serve(layer, args, kwargs, autocast_dtype):
                out = kernel(layer, args, kwargs, autocast_dtype)
                if out is not NotImplemented:
                    served.append(layer.name)
                return out
            return serve
        return {cls: recording(kernel) for cls, kernel in kernels().items()}

    torch_layer_kernels.layer_kernels = recording_kernels   # looked up at each call

    def run(policy, plain):
        keras.config.set_dtype_policy(policy)
        keras.utils.set_random_seed(0)
        block = Block()
        names = {getattr(block, attribute).name: attribute for attribute in (
            "tokens", "positions", "norm", "uncentred", "hidden", "out", "gelu", "softplus", "lora", "float32")}
        served.clear()
        ids = keras.ops.convert_to_tensor(np.random.RandomState(0).randint(0, 50, (4, 8)), dtype="int32")
        block(ids)
        block.lora.enable_lora(2)
        ops = Ops()
        with plain_layer_calls(training=True) if plain else contextlib.nullcontext(), ops:
            out = block(ids)
        out.float().square().sum().backward()
        grads = [v.value.grad for v in block.trainable_variables]
        return out, grads, ops.ran, sorted({names[name] for name in served})

    report = {}
    for policy in ("float32", "mixed_bfloat16"):
        keras_out, keras_grads, keras_ops, keras_served = run(policy, plain=False)
        out, grads, ran, kernel_served = run(policy, plain=True)
        report[policy] = {
            "outputs_equal": bool(torch.equal(keras_out, out)), "dtype": str(out.dtype),
            "gradients_equal": [bool(torch.equal(a, b)) for a, b in zip(keras_grads, grads)],
            "keras_ops": keras_ops, "kernel_ops": ran, "keras_served": keras_served, "kernel_served": kernel_served}
    print(json.dumps(report))
""")


@pytest.mark.slow
def test_the_kernels_run_kerass_operations_and_give_its_numbers():
    report = run_on_torch(PROBE)
    for policy, seen in report.items():
        # Keras's own calls reach no kernel; the plain calls reach one for every layer it serves, and hand the
        # activation it does not know and the LoRA layer back to Keras: equal numbers are then the kernels'.
        assert seen["keras_served"] == [], policy
        assert seen["kernel_served"] == ["float32", "gelu", "hidden", "norm", "out", "positions", "tokens",
                                         "uncentred"], policy
        assert seen["outputs_equal"], policy
        assert all(seen["gradients_equal"]) and len(seen["gradients_equal"]) == 17, policy
        assert seen["kernel_ops"] == seen["keras_ops"], policy
    assert report["mixed_bfloat16"]["dtype"] == "torch.float32"   # the float32 layer's output


CALLS_PROBE = textwrap.dedent("""
    import json, os, sys
    os.environ["KERAS_BACKEND"] = "torch"
    import keras, numpy as np
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends import torch_layer_kernels
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model

    def python_calls(step, ids):
        '''Python and C functions called during one train step: the host's work, counted.'''
        count = [0]
        def profiler(frame, event, arg):
            count[0] += event in ("call", "c_call")
        sys.setprofile(profiler)
        step((ids, ids), ids, np.ones(ids.shape, np.float32))
        sys.setprofile(None)
        return count[0]

    model = build_transformer(PRESETS["tiny"])
    compile_model(keras, model, TrainConfig(preset="tiny"), 10, {})
    step = EagerTorchTrainStep(model)
    ids = np.ones((4, 16), np.int32)
    step((ids, ids), ids, np.ones((4, 16), np.float32))
    with_kernels = python_calls(step, ids)
    torch_layer_kernels.layer_kernels = lambda: {}   # every layer called as Keras calls it
    print(json.dumps({"with_kernels": with_kernels, "keras_calls": python_calls(step, ids)}))
""")


@pytest.mark.slow
def test_the_eager_step_makes_half_the_python_calls_with_the_kernels():
    """On `tiny`, 4,123 calls a step against 8,699 (2026-11-26)."""
    report = run_on_torch(CALLS_PROBE)
    assert report["with_kernels"] < 0.6 * report["keras_calls"], report


DEVICES_PROBE = textwrap.dedent("""
    import json, os
    os.environ["KERAS_BACKEND"] = "torch"
    import keras, torch
    from keras import layers
    from mtbench.plugins.backends import torch_layer_kernels as kernels
    from mtbench.keras_models.transformer import Embedding

    dense, norm = layers.Dense(4), layers.LayerNormalization()
    table, float32_table = layers.Embedding(9, 4), Embedding(9, 4)
    for layer, shape in ((dense, (2, 4)), (norm, (2, 4)), (table, (2, 3)), (float32_table, (2, 3))):
        layer.build(shape)
    # Inputs on another device than the weights (a GPU's weights, host inputs): "meta" stands for it on a CPU.
    elsewhere = torch.empty((2, 4), device="meta")
    ids = torch.zeros((2, 3), dtype=torch.int64, device="meta")
    print(json.dumps({
        "dense": kernels.dense(dense, (elsewhere,), {}, None) is NotImplemented,
        "layer_norm": kernels.layer_normalization(norm, (elsewhere,), {}, None) is NotImplemented,
        "embedding": kernels.embedding(table, (ids,), {}, None) is NotImplemented,
        "float32_embedding": kernels.float32_embedding(float32_table, (ids,), {}, None) is NotImplemented}))
""")


@pytest.mark.slow
def test_inputs_on_another_device_than_the_weights_are_left_to_keras():
    """Keras moves a host input to the weights' device; the kernels would fail on it, so they leave it to Keras."""
    assert run_on_torch(DEVICES_PROBE) == {"dense": True, "layer_norm": True, "embedding": True,
                                           "float32_embedding": True}
