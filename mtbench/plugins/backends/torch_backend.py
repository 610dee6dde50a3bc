"""The PyTorch backend."""

import os

from mtbench import Backend, cpu_model, hookimpl, median_flops_per_s


class TorchBackend(Backend):
    name = "torch"
    keras_backend = "torch"
    framework_modules = ("torch",)
    description = "Keras 3 on PyTorch: eager by default"

    def prepare_process(self, config):
        # torch.compile caches under /tmp by default; keep its files with mtbench's other caches.
        return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(config.cache_dir, "torchinductor")}

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
