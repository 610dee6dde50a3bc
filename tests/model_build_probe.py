"""Run by tests/keras_models/test_model_build.py in a fresh process (keras fixes its backend at import): builds the
tiny GPT on torch with the flash kernel asked for, as `--extra flash-attention` builds it on a GPU, and records the
aten operations that ran on a device (not on the symbolic "meta" one) while its variables were created. On this
CPU torch's flash check answers as on a GPU: yes for tensors on the device, no for meta tensors (CUDA's check wants
them on a CUDA device). Prints one JSON line: {"built": {op name: calls}, "forward": {op name: calls}}, the second
for one forward pass afterwards, so that the count is seen to see the attention; then whether the inputs SDPA was
given while `--extra flash-attention` took its evidence of the kernel needed gradients, as the step's do:
{..., "evidence_inputs_need_grad": [one per call]}.

    python tests/model_build_probe.py
"""

import collections
import json
import os


def main():
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.backends.torch_backend import TorchBackend

    TorchBackend().attention_kernels(True, {"kind": "cpu"})
    torch.backends.cuda.can_use_flash_attention = lambda params, debug=False: params.query.device.type != "meta"

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ran = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            first = out[0] if isinstance(out, (tuple, list)) else out
            if isinstance(first, torch.Tensor) and first.device.type != "meta":
                self.ran[func.overloadpacket.__name__] += 1
            return out

    keras.config.set_dtype_policy("mixed_bfloat16")
    with Recorder() as building:
        model = build_gpt(GPT_PRESETS["tiny"], flash_attention=True)
    with torch.no_grad(), Recorder() as forward:
        model(np.full((2, 8), 5, "int32"))
    print(json.dumps({"built": building.ran, "forward": forward.ran,
                      "evidence_inputs_need_grad": evidence_inputs_need_grad(model, torch)}))


def evidence_inputs_need_grad(model, torch):
    """Whether each query SDPA was given needed gradients while the flash-attention extra took its evidence."""
    import numpy as np

    from mtbench.plugins.extras.flash_attention import FlashAttention
    need_grad, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recorded(query, *args, **kwargs):
        need_grad.append(query.requires_grad)
        return sdpa(query, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recorded
    torch.cuda.synchronize = lambda *args: None  # this CPU has no CUDA to wait for
    try:
        FlashAttention._torch_evidence(model, (np.full((2, 8), 5, "int32"),))
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    return need_grad


if __name__ == "__main__":
    main()
