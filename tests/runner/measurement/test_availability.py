"""`mtbench plugins`' table of the extras a default run could take on this machine asks each extra about the run
that `mtbench train` with no options would make here: in the dtype `--dtype auto` chooses on that device."""

from types import SimpleNamespace

from mtbench.plugins.api import Extra
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.extras.flash_attention import FlashAttention
from mtbench.runner.measurement.availability import extras_availability


class DescribedJax(JaxBackend):
    """The JAX backend on a device it is told of, as `device_info()` reports a GPU."""

    def __init__(self, device):
        self.device = device

    def missing_framework(self):
        return None

    def device_info(self):
        return self.device


class DtypeAsked(Extra):
    name = "dtype-asked"
    backends = ("jax",)

    def unavailable_reason(self, run):
        return f"asked about {run.config.dtype}"


def reasons(device):
    registry = SimpleNamespace(backends={"jax": DescribedJax(device)}, models={},
                               extras={"dtype-asked": DtypeAsked(), "flash-attention": FlashAttention()})
    return {row["extra"]: row["reason"] for row in extras_availability(registry) if row["backend"] == "jax"}


def test_a_gpu_that_computes_bfloat16_is_asked_about_the_mixed_bfloat16_run_it_would_train():
    """Before, the extras were asked about float32 (TrainConfig's default, not the command's), and the table said
    no on every GPU to the fused attention a default run there takes."""
    cpu = reasons({"kind": "cpu", "name": "a CPU", "count": 1})
    assert cpu["dtype-asked"] == "asked about float32"
    assert cpu["flash-attention"] == "needs a GPU (or TPU) and float16/bfloat16; this run has cpu/float32"
    gpu = reasons({"kind": "gpu", "name": "a GPU", "count": 1, "bfloat16": True})
    assert gpu["dtype-asked"] == "asked about mixed_bfloat16"
    assert "float16/bfloat16" not in (gpu["flash-attention"] or "")
    older = reasons({"kind": "gpu", "name": "a GPU of 2017", "count": 1, "bfloat16": False})
    assert older["dtype-asked"] == "asked about float32"
