"""flash-attention: fused attention kernels for every kind of attention, on both backends: cuDNN on JAX (Keras's
`dot_product_attention(..., flash_attention=True)`); on torch, the fused SDPA kernel torch's dispatcher picks, as
for anyone who calls SDPA: the torch backend holds the process to SDPA's fused kernels
(`TorchBackend.attention_kernels`), as it holds a run without this extra to the math kernel, and Keras is not
asked for flash (which it would force). On Hopper and newer that is cuDNN's kernel for the causal self-attention,
the one JAX runs; before, FlashAttention, and the memory-efficient kernel for the masked attentions flash refuses.

Keras on JAX falls back to plain XLA attention with only a logged message when cuDNN refuses the inputs, so
asking for the kernel proves nothing: before training, the compiled program (JAX) or a profiler trace (torch)
of a real forward pass must name the fused kernel, for every kind of attention it was asked for, or the run
stops. On JAX the padded attentions take the fused kernel too: the model then spells their mask out over every
query, the form cuDNN accepts (`mtbench.keras_models.transformer.attention_mask`).
"""

import collections
import re

from mtbench import Extra, hookimpl

HALF_DTYPES = ("float16", "bfloat16", "mixed_float16", "mixed_bfloat16")
# Names that only a fused attention kernel produces: cuDNN's fused multi-head attention custom calls in XLA's
# HLO, and torch's fused SDPA operators (flash, memory-efficient, cuDNN's) and their CUDA kernels.
JAX_KERNEL_PATTERN = re.compile(r"__cudnn\$fmha\w*")
TORCH_KERNEL_PATTERN = re.compile(r"\S*(?:flash|efficient|cudnn)\S*", re.IGNORECASE)


MASKED_KINDS = ["encoder self-attention", "cross-attention"]


def kernel_calls(text_or_names, pattern):
    """Every fused kernel named in a compiled program's text or a list of profiler event names, once a call."""
    text = text_or_names if isinstance(text_or_names, str) else "\n".join(text_or_names)
    return pattern.findall(text)


def kernel_evidence(text_or_names, pattern):
    """The distinct kernel names in a compiled program's text or a list of profiler event names."""
    return sorted(set(kernel_calls(text_or_names, pattern)))


# The operator each of torch's fused kernels runs under, one event a call (its CUDA kernels are events too).
TORCH_FUSED_OPERATORS = {"flash (fused)": "aten::_scaled_dot_product_flash_attention",
                         "memory-efficient (fused)": "aten::_scaled_dot_product_efficient_attention",
                         "cudnn (fused)": "aten::_scaled_dot_product_cudnn_attention"}


def _kinds_short(applied_to, layers, kernel_of, calls):
    """The kinds of `applied_to` whose kernel (`kernel_of(kind)`) served fewer calls (`calls`: kernel -> calls
    seen) than the layers of every kind it serves (`layers`: kind -> count; a kind with none counted needs one)."""
    needed = collections.Counter()
    for kind in applied_to:
        needed[kernel_of(kind)] += max(layers.get(kind, 0), 1)
    return [kind for kind in applied_to if calls.get(kernel_of(kind), 0) < needed[kernel_of(kind)]]


def torch_kinds_missing(kernels, applied_to, layers, serving=None):
    """The kinds of attention in `applied_to` that torch's fused kernels did not serve in every layer. `serving`:
    {'causal', 'masked': the kernel the backend said serves it, as `model.attention` names it}, by default flash
    the causal self-attention and the memory-efficient kernel the masked ones; where one kernel serves both, its
    calls must cover the layers of both. `kernels`: the profiler's event names of one forward pass, every
    call's; `layers`: kind -> the model's layers of it."""
    serving = serving or {"causal": "flash (fused)", "masked": "memory-efficient (fused)"}
    calls = {name: sum(kernel.startswith(operator) for kernel in kernels)
             for name, operator in TORCH_FUSED_OPERATORS.items()}
    return _kinds_short(applied_to, layers, lambda kind: serving["masked" if kind in MASKED_KINDS else "causal"],
                        calls)


def cudnn_kinds_missing(kernels, applied_to, layers):
    """The kinds of attention in `applied_to` that cuDNN did not serve in every layer. cuDNN takes a padding mask
    as a bias: the masked attentions run its bias variant (`__cudnn$fmhaScaleBiasSoftmax`), the causal
    self-attention, which has no mask, a variant without one. `kernels`: the kernels the compiled forward pass
    calls, once a call; `layers`: kind -> the model's layers of it."""
    with_bias = sum("Bias" in kernel for kernel in kernels)
    return _kinds_short(applied_to, layers, lambda kind: kind in MASKED_KINDS,
                        {True: with_bias, False: len(kernels) - with_bias})


def jax_compute_capability():
    """The compute capability JAX reports of its first device ('8.6'), or None where it reports none."""
    import jax
    return getattr(jax.devices()[0], "compute_capability", None)


def older_than(capability, version):
    """Whether a CUDA compute capability as JAX writes it ('7.5') is older than `version` ((8, 0): Ampere's);
    False where it is unknown (None)."""
    return capability is not None and tuple(int(part) for part in capability.split(".")[:2]) < version


def cudnn_refusal(capability, head_dim):
    """Why cuDNN's fused attention, which Keras calls on JAX, cannot train heads `head_dim` wide on a CUDA GPU of
    `capability` ('8.6'), or None (also where either is unknown): Keras raises below Ampere ("Require at least
    Ampere arch to run") rather than fall back, and cuDNN over 128 before Hopper."""
    if older_than(capability, (8, 0)):
        return f"needs compute capability 8.0 or newer on JAX (cuDNN's fused attention); this GPU has {capability}"
    if head_dim and head_dim > 128 and older_than(capability, (9, 0)):
        return (f"needs a head size of at most 128 on JAX before compute capability 9.0 (cuDNN's fused attention); "
                f"this model has {head_dim} on a GPU of {capability}")
    return None


class FlashAttention(Extra):
    name = "flash-attention"
    description = ("fused attention kernel (cuDNN on JAX; on torch SDPA's fused kernel its dispatcher picks, cuDNN "
                   "on Hopper), verified before training")
    backends = ("jax", "torch")

    def unavailable_reason(self, run):
        if run.attention_dropout:
            # Keras's fused attention takes no dropout; torch's SDPA would, JAX's cuDNN call would not.
            return (f"drops no attention probabilities, and this model drops {run.attention_dropout:g} of them "
                    f"while training (--dropout 0 lets it run)")
        kind, dtype = run.device_kind, run.config.dtype
        # Only what is missing is named: 'needs ... bfloat16; this run has cpu/bfloat16' read as a contradiction.
        device_missing, dtype_missing = kind not in ("gpu", "tpu"), dtype not in HALF_DTYPES
        if device_missing and dtype_missing:
            return f"needs a GPU (or TPU) and float16/bfloat16; this run has {kind}/{dtype}"
        if device_missing:
            return f"needs a GPU (or TPU); this run is on the {kind}"
        if dtype_missing:
            return f"needs float16 or bfloat16; this run computes in {dtype}"
        shape = run.model_shape  # None where the model family knows it only once built: `verify` checks then
        head_dim = shape and shape.d_model // shape.num_heads
        if head_dim and (head_dim % 8 or head_dim > 256):
            return f"needs a head size that is a multiple of 8 and at most 256; this model has {head_dim}"
        if run.backend.name == "torch":
            import torch
            major, minor = torch.cuda.get_device_capability()
            if major < 8:
                return f"needs compute capability 8.0 or newer on torch; this GPU has {major}.{minor}"
            if head_dim and head_dim > 192 and (8, 6) <= (major, minor) <= (8, 9):
                # FlashAttention-2's backward pass over 192 needs an A100's or H100's shared memory.
                return (f"needs a head size of at most 192 to train on torch's FlashAttention on compute capability "
                        f"{major}.{minor}; this model has {head_dim}")
        elif kind == "gpu" and run.backend.accelerator_environment().get("rocm_version"):
            return "needs cuDNN's fused attention, which JAX has on CUDA only; this GPU runs ROCm"
        elif kind == "gpu" and (refusal := cudnn_refusal(jax_compute_capability(), head_dim)):
            return refusal
        elif run.config.max_len % 2:
            # Every length bucket but the last is a multiple of 16; cuDNN trains with a mask (bias) only on
            # even lengths.
            return (f"needs an even --max-len on JAX (cuDNN trains masked attention on even lengths only); "
                    f"got {run.config.max_len}")
        return None

    def before_model(self, run):
        # On torch, Keras is not asked for flash, which it would force on the causal attention: SDPA's dispatcher
        # picks among the fused kernels the backend holds the process to (cuDNN's on Hopper, as for nanoGPT).
        fused = True if run.backend.name == "jax" else None
        run.model_options.update(flash_attention=fused, flash_attention_masked=fused)
        masked_kinds = MASKED_KINDS if "masked" in run.attention_kinds else []  # a decoder-only model has none
        run.extras_state[self.name] = {"applied_to": ["decoder self-attention", *masked_kinds]}

    def verify(self, run, model, batch):
        from mtbench.keras_models.transformer import fused_attention_layers
        x = batch.inputs
        if run.backend.name == "jax":
            calls, method = self._jax_evidence(model, x), "names in the compiled HLO of the forward pass"
        else:
            calls, method = self._torch_evidence(model, x), "torch.profiler events of one forward pass"
        evidence = sorted(set(calls))
        state = run.extras_state[self.name]
        state.update(verified_by=method, kernels=evidence)
        if not evidence:
            return f"the fused attention kernel did not run ({method} name none); the run would mislabel itself"
        # Keras on JAX falls back to plain attention call by call: a kernel named once may serve one layer of many.
        layers = fused_attention_layers(model)
        if run.backend.name == "jax":
            missing = cudnn_kinds_missing(calls, state.get("applied_to", []), layers)
        else:
            missing = torch_kinds_missing(calls, state.get("applied_to", []), layers, run.attention)
        if missing:
            counted = ", ".join(f"{layers[kind]} {kind} layers" for kind in missing)
            return (f"the fused attention kernel did not run for every {' and '.join(missing)} ({counted}; {method}: "
                    f"{', '.join(f'{kernel} x{calls.count(kernel)}' for kernel in evidence)}); the run would "
                    f"mislabel itself")
        return None

    @staticmethod
    def _jax_evidence(model, x):
        import jax
        import keras

        def forward(values, inputs):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return model(inputs)

        compiled = jax.jit(forward).lower([v.value for v in model.variables], x).compile()
        return kernel_calls(compiled.as_text(), JAX_KERNEL_PATTERN)

    @staticmethod
    def _torch_evidence(model, x):
        import torch
        from keras.src.backend.torch.core import get_device
        from torch.profiler import ProfilerActivity, profile

        from mtbench.plugins.backends.torch_eager_step import to_device
        from mtbench.plugins.backends.torch_plain_calls import called_as_the_step_calls
        from mtbench.plugins.backends.torch_profiler import kineto_lines_left_out
        # On the run's device and as the step calls the model: split by tensor-parallel, its layers each take a
        # share of the width Keras's input checks expect, and their DTensors take their inputs as they are. With
        # gradients on, as in the step: SDPA's dispatcher refuses some kernels to inputs that need them.
        rows = tuple(to_device(part, get_device()) for part in x)
        with torch.enable_grad(), called_as_the_step_calls(model, training=False), kineto_lines_left_out(), \
                profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            model(rows)
            torch.cuda.synchronize()
        return kernel_calls([event.name for event in trace.events()], TORCH_KERNEL_PATTERN)


@hookimpl
def mtbench_register_extras(register):
    register(FlashAttention())
