"""Run by tests/keras_models/test_attention_arithmetic.py in a fresh process (keras fixes its backend at import):
builds the tiny Transformer under a dtype policy on torch, holds SDPA to the kernels a run holds it to
(`TorchBackend.attention_kernels`), and records the aten operations one forward pass ran that could be the
attention's: batched matmuls of many matrices and softmaxes (SDPA's own, had it run), with their input and output
dtypes. Prints one JSON line: {op name: [[input dtypes, output dtype], ...]}.

    python tests/attention_ops_probe.py DTYPE
"""

import json
import os
import sys

WATCHED = ("bmm", "baddbmm", "_softmax", "_safe_softmax", "_scaled_dot_product")


def main(dtype):
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends.torch_backend import TorchBackend

    TorchBackend().attention_kernels(False, {"kind": "cpu"})
    keras.config.set_dtype_policy(dtype)
    model = build_transformer(PRESETS["tiny"])
    ids = np.full((2, 8), 5, "int32")
    ids[:, -2:] = 0  # padding, so the masked attentions hide a key

    def name(value):
        return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else None

    ran = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            op = func.overloadpacket.__name__
            # torch.einsum runs a fused query-key-value projection as a batch of one matrix: not attention's.
            projection = op == "bmm" and args[0].shape[0] == 1
            if op.startswith(WATCHED) and not projection:
                first = out[0] if isinstance(out, (tuple, list)) else out
                ran.setdefault(op, []).append([[name(arg) for arg in args if name(arg)], name(first)])
            return out

    with torch.no_grad(), Recorder():
        model((ids, ids))
    print(json.dumps(ran))


if __name__ == "__main__":
    main(*sys.argv[1:])
