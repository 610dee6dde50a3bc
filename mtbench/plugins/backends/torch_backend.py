"""The PyTorch backend."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

from mtbench import Backend, cpu_model, hookimpl, median_flops_per_s, native_bfloat16, unusable_directory

# Extras whose train step torch.compile compiles (inductor): without one, a torch run compiles nothing to cache.
INDUCTOR_EXTRAS = ("torch-compile",)
# Where inductor keeps what its FX graph and AOTAutograd caches hold: one entry per compiled graph.
INDUCTOR_ENTRY_DIRS = ("fxgraph", "aotautograd")


def compile_cache_dir(cache_dir):
    """Inductor's caches for this torch version (its cache keys hold the version too; a directory per version
    keeps each one's count meaningful). Known before torch is imported, as inductor reads it at import."""
    return os.path.join(cache_dir, "compile", f"torch-{importlib.metadata.version('torch')}")


def _scratch_dir():
    """A directory of this process only, removed at exit: inductor needs somewhere to write its code even when
    nothing may be kept, and its default (/tmp/torchinductor_USER) outlives the process."""
    path = tempfile.mkdtemp(prefix="mtbench-inductor-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# What each of SDPA's fused kernels is called in a result's `model.attention`.
FUSED_KERNEL_NAMES = {"flash": "flash (fused)", "mem_efficient": "memory-efficient (fused)", "cudnn": "cudnn (fused)",
                      "unknown": "fused (the dispatcher's choice)"}


# The attention the dispatcher is asked about where a run's model is not known: GPT-2 small's heads, in bfloat16.
GPT2_SMALL_ATTENTION = {"heads": 12, "head_dim": 64, "length": 1024, "dtype": "bfloat16"}


def probed_attention(run):
    """{'heads', 'head_dim', 'length', 'dtype'} of the attention `run`'s model will compute (its family's shape,
    `--max-len`, the compute dtype of `--dtype`), as SDPA's dispatcher will see it; GPT-2 small's where the run or
    its model's shape is not known before the model is built."""
    shape = getattr(run, "model_shape", None)
    if shape is None or not shape.num_heads:
        return dict(GPT2_SMALL_ATTENTION)
    import keras  # imported on torch already: the run's dtype policy is set before the model is built
    return {"heads": shape.num_heads, "head_dim": shape.d_model // shape.num_heads,
            "length": getattr(run.config, "max_len", None) or shape.max_len,
            "dtype": keras.DTypePolicy(getattr(run.config, "dtype", "float32")).compute_dtype}


def preferred_fused_kernels(device, attention=None):
    """{'causal', 'masked': the fused SDPA kernel torch's dispatcher picks on this process's CUDA GPU with every
    fused kernel on, for a causal attention and for one with an additive mask}, asked of the dispatcher itself
    (`torch._fused_sdp_choice`) on inputs of `attention`'s shape and dtype (`probed_attention`; GPT-2 small's by
    default): its choice depends on them (the head size above all), and on whether the inputs need gradients (the
    step trains: cuDNN's backward takes fewer head sizes than its forward). The mask is the model's, one additive
    row of keys a sequence. On a CPU (`device`, `device_info()`), whose one fused kernel is flash's, flash and
    memory-efficient (what torch's GPU dispatcher gives them where cuDNN's kernel is not ranked first)."""
    import torch
    if device.get("kind") != "gpu" or not torch.cuda.is_available():
        return {"causal": "flash", "masked": "mem_efficient"}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "mem_efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn"}
    attention = {**GPT2_SMALL_ATTENTION, **(attention or {})}
    dtype, length = getattr(torch, attention["dtype"]), attention["length"]
    query = torch.zeros(1, attention["heads"], length, attention["head_dim"], dtype=dtype, device="cuda",
                        requires_grad=True)
    mask = torch.zeros(1, 1, 1, length, dtype=dtype, device="cuda")  # Keras makes the key mask additive
    with sdpa_kernel(list(names)), torch.enable_grad():
        return {kind: names.get(SDPBackend(torch._fused_sdp_choice(query, query, query, attn_mask, 0.0, causal)),
                                "unknown")
                for kind, attn_mask, causal in (("causal", None, True), ("masked", mask, False))}


class TorchBackend(Backend):
    name = "torch"
    keras_backend = "torch"
    framework_modules = ("torch",)
    description = "Keras 3 on PyTorch: eager by default"
    # torch-compile compiles the train step only.
    inference = "eager: torch.no_grad, a decoding loop step by step from Python"

    def prepare_process(self, config):
        if not getattr(config, "compile_cache", True) or unusable_directory(compile_cache_dir(config.cache_dir)):
            # (open_compile_cache then records the cache off and why)
            return {"TORCHINDUCTOR_CACHE_DIR": _scratch_dir(), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
                    "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
        # On by default in this torch, but a justknob or an older torch may say otherwise: set, not assumed.
        return {"TORCHINDUCTOR_CACHE_DIR": compile_cache_dir(config.cache_dir), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
                "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}

    def start_processes(self, launch):
        if launch.num_processes == 1:
            return super().start_processes(launch)
        from mtbench.plugins.backends.torch_processes import TorchProcessGroup
        return TorchProcessGroup(launch)

    def framework_versions(self):
        import torch
        return {"torch": torch.__version__}

    def device_info(self):
        import torch
        if torch.cuda.is_available():
            # On ROCm torch's capability tuple is the architecture's (gfx906's (9, 0), no bfloat16 matrix units):
            # the architecture's name tells.
            # The process's own device (a launcher's local rank, once `start_processes` has set it), not the
            # node's first: on a node of mixed GPUs its name, bfloat16 and peak are this process's.
            index = torch.cuda.current_device()
            capability = (torch.cuda.get_device_properties(index).gcnArchName if torch.version.hip
                          else torch.cuda.get_device_capability(index))
            return {"kind": "gpu", "name": torch.cuda.get_device_name(index), "count": torch.cuda.device_count(),
                    "bfloat16": native_bfloat16(capability)}
        return {"kind": "cpu", "name": cpu_model(), "count": 1, "threads": torch.get_num_threads()}

    def synchronize(self, model=None):
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def random_generator_state(self):
        # Keras's dropout on torch draws from torch's generators (the CPU's, and on a GPU the process's device's),
        # not from the layers' seed states.
        import numpy as np
        import torch
        states = [torch.get_rng_state()] + ([torch.cuda.get_rng_state()] if torch.cuda.is_available() else [])
        return np.concatenate([state.numpy() for state in states])

    def restore_random_generator_state(self, state):
        import torch
        state = torch.tensor(state, dtype=torch.uint8)
        cpu = torch.get_rng_state().numel()
        torch.set_rng_state(state[:cpu])
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state[cpu:])

    def compilations(self):
        """The graphs torch.compile's dynamo has compiled in this process (each its own inductor program, its
        backward compiled with it): 0 for an eager step, one for each shape a compiled step trains, and more where
        a guard failed and dynamo compiled again, which the timing windows then count where it happened."""
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])

    def peak_device_bytes(self):
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        return None

    def device_memory(self):
        import torch
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()  # one device a process: its local rank's under torchrun
        return [{"device": torch.cuda.get_device_name(index), "index": index,
                 "peak_bytes": int(torch.cuda.max_memory_allocated(index)),
                 "in_use_bytes": int(torch.cuda.memory_allocated(index))}]

    def matmul_flops_per_s(self, dtype, size):
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        generator = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, dtype=getattr(torch, dtype), device=device, generator=generator)
        b = torch.randn(size, size, dtype=getattr(torch, dtype), device=device, generator=generator)

        def run():
            torch.matmul(a, b)
            self.synchronize()

        return median_flops_per_s(run, 2 * size ** 3)

    def open_compile_cache(self, config):
        if not config.compile_cache:
            return self.compile_cache_state(None, "--no-compile-cache")
        if not any(name in INDUCTOR_EXTRAS for name in config.extras):
            return self.compile_cache_state(None, "eager: nothing is compiled (torch.compile: --extra torch-compile)")
        return self.compile_cache_state(compile_cache_dir(config.cache_dir))

    def compile_cache_entries(self, directory):
        return sum(len(files) for entry_dir in INDUCTOR_ENTRY_DIRS
                   for _, _, files in os.walk(os.path.join(directory, entry_dir)))

    def compile_cache_hits(self):
        from torch._dynamo.utils import counters
        # AOTAutograd's entry is the whole compiled forward and backward (inductor's FX graphs are what it loads).
        return {"hits": int(counters["aot_autograd"]["autograd_cache_hit"]),
                "misses": int(counters["aot_autograd"]["autograd_cache_miss"])}

    def set_matmul_precision(self, precision):
        import torch
        # 'high' allows TF32 in CUDA (and oneDNN) float32 matmuls; 'highest' keeps them IEEE float32. cuDNN's own
        # TF32 switch (convolutions; on by default in torch) is set alike so that nothing keeps the other one.
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = precision == "high"
        # cuBLAS may otherwise sum a 16-bit matmul's split-K partial products in 16 bits; XLA accumulates them in
        # float32, which is what `model.attention.arithmetic` and the policies record.
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        return self.accelerator_environment()["float32_matmul"]

    def attention_kernels(self, fused, device, run=None):
        """Unfused, mtbench's models attend with aten's matmuls and softmax (`plain_attention`), as JAX does with
        XLA's, and SDPA (which other code may call) is held to its math kernel. Fused, to SDPA's fused kernels
        (flash, memory-efficient and cuDNN's), its dispatcher choosing among them as for a user who calls SDPA
        (nanoGPT): cuDNN's on Hopper and newer (the kernel JAX's fused attention runs too), FlashAttention before,
        the memory-efficient kernel for masks flash refuses; the math kernel stays off, so inputs no fused kernel
        takes are an error rather than a quiet fallback. The kernel named is the dispatcher's choice for `run`'s
        attention (`probed_attention`); the flash-attention extra checks what then ran."""
        import torch
        enable = {"math": not fused, "flash": fused, "mem_efficient": fused, "cudnn": fused}
        for name, on in enable.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
        enabled = [name for name in enable if getattr(torch.backends.cuda, f"{name}_sdp_enabled")()]
        if enabled != [name for name, on in enable.items() if on]:
            from mtbench import RunFailure
            raise RunFailure(f"torch kept the SDPA kernels {enabled} enabled; mtbench asked for "
                             f"{[name for name, on in enable.items() if on]}")
        if not fused:
            return {"causal": "aten (unfused)", "masked": "aten (unfused)", "decoding": "aten (unfused)",
                    "sdpa_kernels_enabled": enabled}
        # Decoding with a cache attends through the model's own unfused attention (`Attention.attend`'s default),
        # as JAX's does: aten's matmuls, whatever SDPA kernels are enabled.
        choice = preferred_fused_kernels(device, probed_attention(run))
        return {"causal": FUSED_KERNEL_NAMES[choice["causal"]], "masked": FUSED_KERNEL_NAMES[choice["masked"]],
                "decoding": "aten (unfused)", "sdpa_kernels_enabled": enabled}

    def attention_implementation(self, fused, device):
        return FUSED_KERNEL_NAMES[preferred_fused_kernels(device)["causal"]] if fused else "aten (unfused)"

    def compile_inference(self, fn, model):
        import torch

        def call(*args):
            with torch.no_grad():
                return fn(*args)

        return call

    def host_sync_counter(self):
        from mtbench.plugins.backends.torch_host_syncs import TorchHostSyncCounter
        return TorchHostSyncCounter()

    def step_profiler(self, directory):
        from mtbench.plugins.backends.torch_profiler import TorchStepProfiler
        return TorchStepProfiler(directory)

    def make_train_step(self, run, model):
        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        return EagerTorchTrainStep(model, micro_batches=run.config.grad_accum)

    def accelerator_environment(self):
        import torch
        from mtbench import cudnn_version_text

        def reported(read):
            try:
                return read()
            except Exception:  # a getter this torch lacks; the legacy TF32 getters raise once the new API was used
                return None

        # The legacy TF32 switches and their successors (torch 2.9+): torch reports them through either API.
        float32_matmul = {
            "torch.backends.cuda.matmul.allow_tf32": lambda: bool(torch.backends.cuda.matmul.allow_tf32),
            "torch.backends.cudnn.allow_tf32": lambda: bool(torch.backends.cudnn.allow_tf32),
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
            "torch.backends.cuda.matmul.fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
            "torch.backends.cudnn.fp32_precision": lambda: torch.backends.cudnn.fp32_precision,
        }
        sixteen_bit_sums = {f"torch.backends.cuda.matmul.allow_{dtype}_reduced_precision_reduction":
                            getattr(torch.backends.cuda.matmul, f"allow_{dtype}_reduced_precision_reduction")
                            for dtype in ("bf16", "fp16")}
        # On ROCm torch's cuDNN is MIOpen, whose version numbers read as cuDNN's would be wrong.
        rocm = torch.version.hip
        return {"cuda_version": torch.version.cuda, "rocm_version": rocm,
                "cudnn_version": None if rocm else cudnn_version_text(reported(torch.backends.cudnn.version)),
                "float32_matmul": {name: reported(read) for name, read in float32_matmul.items()},
                "sixteen_bit_matmul": sixteen_bit_sums}


@hookimpl
def mtbench_register_backends(register):
    register(TorchBackend())
