"""The PyTorch backend."""

import atexit
import importlib.metadata
import os
import shutil
import tempfile

from mtbench import Backend, cpu_model, hookimpl, median_flops_per_s

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


class TorchBackend(Backend):
    name = "torch"
    keras_backend = "torch"
    framework_modules = ("torch",)
    description = "Keras 3 on PyTorch: eager by default"

    def prepare_process(self, config):
        if not getattr(config, "compile_cache", True):
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
            return {"kind": "gpu", "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
        return {"kind": "cpu", "name": cpu_model(), "count": 1, "threads": torch.get_num_threads()}

    def synchronize(self, model=None):
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def peak_device_bytes(self):
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        return None

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

    def attention_implementation(self, fused, device):
        # Not fused: torch's SDPA dispatcher picks the kernel (flash, memory-efficient, cuDNN or math) per call.
        return "flash" if fused else "sdpa"

    def compile_inference(self, fn, model):
        import torch

        def call(*args):
            with torch.no_grad():
                return fn(*args)

        return call

    def make_train_step(self, run, model):
        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        return EagerTorchTrainStep(model)


@hookimpl
def mtbench_register_backends(register):
    register(TorchBackend())
