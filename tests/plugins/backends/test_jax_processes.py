"""Under torchrun, JAX's processes meet at a coordination service of their own: process 0 finds a free port and
leaves it for the others, in the directory mtbench made for the launch where mtbench started torchrun (a
compare's run), else in torchrun's store (MASTER_ADDR:MASTER_PORT), which only torch reads. It took
MASTER_PORT + 1 before, which another program held once in this suite (two xdist workers' gloo and torchrun
ports): process 0 could not serve and the run died."""

import concurrent.futures
import datetime
import json
import socket
import textwrap

import pytest

from mtbench import Launch
from mtbench.plugins.backends.jax_processes import collectives_library, coordinator_address
from tests.conftest import CPU_ONLY, TINY_COMPARE, python_path

# Makes torch unimportable in the processes torchrun starts (RANK set, `-m mtbench`), not in torchrun's agent, which
# needs it, and writes down each attempt (a `try: import torch` would otherwise pass over the refusal unseen). Nor in a
# process one of them starts: a run whose cache holds no peak yet measures every backend's, torch's too, each in a
# process of its own that inherits the rank (the test then failed or passed by what ran before it in the session).
NO_TORCH_IN_WORKERS = textwrap.dedent("""
    import os, sys
    argv = sys.orig_argv
    if "RANK" in os.environ and "-m" in argv and argv[argv.index("-m") + 1:][:1] == ["mtbench"]:
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    with open(os.environ["TORCH_IMPORTS_FILE"], "a") as attempts:
                        attempts.write(f"process {os.environ['RANK']}: {name}\\n")
                    raise ImportError(f"{name} was imported by a process of a JAX run")
        sys.meta_path.insert(0, NoTorch())
""")


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


def test_processes_started_as_compare_starts_them_meet_in_its_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    launches = [Launch(process_id=rank, num_processes=2, coordinator="127.0.0.1:1", launcher="torchrun",
                       timeout_s=30, launch_dir=str(tmp_path)) for rank in (1, 0)]  # the others may ask first
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        addresses = list(pool.map(coordinator_address, launches))
    assert addresses[0] == addresses[1] and addresses[0].startswith("127.0.0.1:")
    assert [p.name for p in tmp_path.iterdir()] == ["jax-coordinator-0"]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as service:
        service.bind(("", int(addresses[0].rpartition(":")[2])))  # free for process 0's coordination service


def test_a_process_whose_process_0_leaves_no_port_stops_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    from mtbench.plugins.backends.jax_processes import JaxProcessGroup
    from mtbench.errors import MtbenchError
    launch = Launch(process_id=1, num_processes=2, coordinator="127.0.0.1:1", launcher="torchrun", timeout_s=1,
                    launch_dir=str(tmp_path))
    with pytest.raises(MtbenchError, match=r"process 1 of 2 could not join the others at 127.0.0.1:1: process 0 "
                                           r"left no port in .*jax-coordinator-0 within 1 s"):
        JaxProcessGroup(launch)
    gone = Launch(process_id=0, num_processes=2, coordinator="127.0.0.1:1", launcher="torchrun", timeout_s=1,
                  launch_dir=str(tmp_path / "gone"))  # a directory that is no more: one line too
    with pytest.raises(MtbenchError, match=r"process 0 of 2 could not join the others at 127.0.0.1:1: .*No such file"):
        JaxProcessGroup(gone)


def test_compare_names_its_torchruns_directory_to_their_processes(tmp_path, monkeypatch):
    """run_child, which starts compare's and rerun's runs, hands the processes of a torchrun the directory it made
    for them (torchrun's --log-dir); a run of one process gets none."""
    from mtbench.runner.orchestration import children
    started = []

    class Started:
        returncode = 0

        def __init__(self, command, env=None, **kwargs):
            started.append((command, env))

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(children.subprocess, "Popen", Started)
    for processes in (2, 1):
        assert children.run_child(["train"], str(tmp_path / f"{processes}.log"), "run", processes=processes) is None
    (command, env), (_, alone) = started
    log_dir = next(arg for arg in command if arg.startswith("--log-dir=")).removeprefix("--log-dir=")
    assert env["MTBENCH_LAUNCH_DIR"] == log_dir and alone is None


@pytest.mark.slow  # two JAX processes on the worker's core: about 30 s
def test_a_jax_run_that_compare_starts_over_two_processes_trains_without_importing_torch(tmp_path, cache_dir,
                                                                                          monkeypatch):
    """torch is not imported into the processes of a JAX run that mtbench starts under torchrun: its host memory
    and start are JAX's own (torch took 1 s and 175 MiB of each process here to read torchrun's store)."""
    from mtbench.runner.orchestration.children import run_child
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_TORCH_IN_WORKERS)
    imports = tmp_path / "torch-imports.txt"
    for name, value in {**CPU_ONLY, "PYTHONPATH": python_path(tmp_path / "site"), "MTBENCH_LOAD_PLUGINS": "",
                        "TORCH_IMPORTS_FILE": str(imports)}.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "jax-2.json"
    # --measure-only: the processes' start, their meeting and their training are what is checked. The evaluation
    # after training compiled its programs in both processes (JAX caches process 0's alone): 12 s of CPU here.
    failure = run_child(["train", "--backend", "jax", "--extra", "data-parallel", *TINY_COMPARE, "--steps", "4",
                         "--measure-only", "--cache-dir", cache_dir, "--out", str(out)], str(tmp_path / "run.log"),
                        "jax", processes=2)
    assert failure is None, (tmp_path / "run.log").read_text()[-3000:]
    result = json.loads(out.read_text())
    assert result["processes"]["world_size"] == 2 and result["processes"]["launcher"] == "torchrun"
    assert len(result["history"]) == 4
    assert not imports.exists()  # no process asked for torch, even where it could have done without
    assert result["processes"]["coordinator_port_from"] == "the launch's directory"


def test_the_collectives_are_named_for_the_platform_that_carries_them():
    """What a result's `processes.collectives` says JAX's processes talk through, by the device's platform (and, on a
    GPU, its client's platform version: ROCm's JAX reports 'rocm ...')."""
    from types import SimpleNamespace

    def device(platform, version=""):
        return SimpleNamespace(platform=platform, client=SimpleNamespace(platform_version=version))
    assert [collectives_library(device(*args)) for args in (("cpu",), ("gpu", "cuda 12090"), ("gpu", "rocm 6.3.1"),
                                                             ("tpu", "PJRT C API"))] == [
        "gloo", "nccl", "rccl", "tpu interconnect"]
