"""flash-attention: fused attention kernels for every kind of attention, on both backends: cuDNN on JAX (Keras's
`dot_product_attention(..., flash_attention=True)`); on torch, FlashAttention for the causal self-attention
(Keras narrows it to flash) and the memory-efficient kernel for the masked ones, which flash cannot take: the
torch backend holds the process to fused SDPA kernels (`TorchBackend.attention_kernels`), as it holds a run
without this extra to the math kernel.

Keras on JAX falls back to plain XLA attention with only a logged message when cuDNN refuses the inputs, so
asking for the kernel proves nothing: before training, the compiled program (JAX) or a profiler trace (torch)
of a real forward pass must name the fused kernel, for every kind of attention it was asked for, or the run
stops. On JAX the padded attentions take the fused kernel too: the model then spells their mask out over every
query, the form cuDNN accepts (`mtbench.keras_models.transformer.attention_mask`).
"""

import re

from mtbench import Extra, hookimpl

HALF_DTYPES = ("float16", "bfloat16", "mixed_float16", "mixed_bfloat16")
# Names that only a fused attention kernel produces: cuDNN's fused multi-head attention custom calls in XLA's
# HLO, and torch's flash SDPA operator and CUDA kernels.
JAX_KERNEL_PATTERN = re.compile(r"__cudnn\$fmha\w*")
TORCH_KERNEL_PATTERN = re.compile(r"\S*(?:flash|efficient)\S*", re.IGNORECASE)


MASKED_KINDS = ["encoder self-attention", "cross-attention"]


def kernel_evidence(text_or_names, pattern):
    """The distinct kernel names in a compiled program's text or a list of profiler event names."""
    text = text_or_names if isinstance(text_or_names, str) else "\n".join(text_or_names)
    return sorted(set(pattern.findall(text)))


def torch_kinds_missing(kernels, applied_to):
    """The kinds of attention in `applied_to` that no torch kernel in `kernels` served: flash serves the causal
    self-attention, the memory-efficient kernel the masked ones."""
    flash = any("flash" in kernel.lower() for kernel in kernels)
    efficient = any("efficient" in kernel.lower() for kernel in kernels)
    return [kind for kind in applied_to if not (efficient if kind in MASKED_KINDS else flash)]


def cudnn_kinds_missing(kernels, applied_to):
    """The kinds of attention in `applied_to` that no cuDNN kernel in `kernels` served. cuDNN takes a padding
    mask as a bias: the masked attentions run its bias variant (`__cudnn$fmhaScaleBiasSoftmax`), the causal
    self-attention, which has no mask, a variant without one."""
    with_bias = any("Bias" in kernel for kernel in kernels)
    without_bias = any("Bias" not in kernel for kernel in kernels)
    return [kind for kind in applied_to if not (with_bias if kind in MASKED_KINDS else without_bias)]


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
    description = "fused attention kernel (cuDNN on JAX, FlashAttention on torch), verified before training"
    backends = ("jax", "torch")

    def unavailable_reason(self, run):
        if run.attention_dropout:
            # Keras's fused attention takes no dropout; torch's SDPA would, JAX's cuDNN call would not.
            return (f"drops no attention probabilities, and this model drops {run.attention_dropout:g} of them "
                    f"while training (--dropout 0 lets it run)")
        kind, dtype = run.device_kind, run.config.dtype
        if kind not in ("gpu", "tpu") or dtype not in HALF_DTYPES:
            return f"needs a GPU (or TPU) and float16/bfloat16; this run has {kind}/{dtype}"
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
        # torch's flash kernel takes no attention mask: Keras is asked for it on the causal decoder self-attention
        # only, and the padded attentions run the memory-efficient kernel the backend holds the process to.
        masked = True if run.backend.name == "jax" else None
        run.model_options.update(flash_attention=True, flash_attention_masked=masked)
        masked_kinds = MASKED_KINDS if "masked" in run.attention_kinds else []  # a decoder-only model has none
        run.extras_state[self.name] = {"applied_to": ["decoder self-attention", *masked_kinds]}

    def verify(self, run, model, batch):
        x = batch.inputs
        if run.backend.name == "jax":
            evidence, method = self._jax_evidence(model, x), "names in the compiled HLO of the forward pass"
        else:
            evidence, method = self._torch_evidence(model, x), "torch.profiler events of one forward pass"
        state = run.extras_state[self.name]
        state.update(verified_by=method, kernels=evidence)
        if not evidence:
            return f"the fused attention kernel did not run ({method} name none); the run would mislabel itself"
        kinds_missing = cudnn_kinds_missing if run.backend.name == "jax" else torch_kinds_missing
        missing = kinds_missing(evidence, state.get("applied_to", []))
        if missing:
            return (f"the fused attention kernel did not run for the {' and '.join(missing)} ({method}: "
                    f"{', '.join(evidence)}); the run would mislabel itself")
        return None

    @staticmethod
    def _jax_evidence(model, x):
        import jax
        import keras

        def forward(values, inputs):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return model(inputs)

        compiled = jax.jit(forward).lower([v.value for v in model.variables], x).compile()
        return kernel_evidence(compiled.as_text(), JAX_KERNEL_PATTERN)

    @staticmethod
    def _torch_evidence(model, x):
        import torch
        from keras.src.backend.torch.core import get_device
        from torch.profiler import ProfilerActivity, profile

        from mtbench.plugins.backends.torch_eager_step import to_device
        from mtbench.plugins.backends.torch_plain_calls import called_as_the_step_calls
        # On the run's device and as the step calls the model: split by tensor-parallel, its layers each take a
        # share of the width Keras's input checks expect, and their DTensors take their inputs as they are.
        rows = tuple(to_device(part, get_device()) for part in x)
        with torch.no_grad(), called_as_the_step_calls(model, training=False), \
                profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            model(rows)
            torch.cuda.synchronize()
        return kernel_evidence([event.name for event in trace.events()], TORCH_KERNEL_PATTERN)


@hookimpl
def mtbench_register_extras(register):
    register(FlashAttention())
