"""Under torchrun, JAX's processes meet at a coordination service of their own: process 0 finds a free port and
leaves it in torchrun's store (MASTER_ADDR:MASTER_PORT) for the others. It took MASTER_PORT + 1 before, which
another program held once in this suite (two xdist workers' gloo and torchrun ports): process 0 could not serve
and the run died."""

import concurrent.futures
import datetime
import socket

from mtbench import Launch
from mtbench.plugins.backends.jax_processes import collectives_library, coordinator_address


def test_the_processes_agree_on_a_free_port_left_in_torchruns_store(monkeypatch):
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))  # torchrun's agent's
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        try:
            taken.bind(("", store.port + 1))  # the port after the store, held by another program
            taken.listen()
        except OSError:  # another program (a test of the other xdist worker) holds it already: the case itself
            pass
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
        launches = [Launch(process_id=rank, num_processes=2, coordinator=f"127.0.0.1:{store.port}",
                           launcher="torchrun", timeout_s=30) for rank in (1, 0)]  # the others may ask first
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            addresses = list(pool.map(coordinator_address, launches))
    assert addresses[0] == addresses[1]
    host, _, port = addresses[0].rpartition(":")
    assert host == "127.0.0.1" and int(port) not in (store.port, store.port + 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as service:
        service.bind(("", int(port)))  # free for process 0's coordination service


def test_the_collectives_are_named_for_the_platform_that_carries_them():
    """What a result's `processes.collectives` says JAX's processes talk through, by the device's platform (and, on a
    GPU, its client's platform version: ROCm's JAX reports 'rocm ...')."""
    from types import SimpleNamespace

    def device(platform, version=""):
        return SimpleNamespace(platform=platform, client=SimpleNamespace(platform_version=version))
    assert [collectives_library(device(*args)) for args in (("cpu",), ("gpu", "cuda 12090"), ("gpu", "rocm 6.3.1"),
                                                             ("tpu", "PJRT C API"))] == [
        "gloo", "nccl", "rccl", "tpu interconnect"]
