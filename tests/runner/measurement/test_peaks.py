"""The peak MFU divides by: the datasheet entry a device name selects, the arithmetic whose peak is used, and
the record of a CPU measurement (when it was taken, how busy the host was)."""

import datetime
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import MACHINE_CPUS, cache_of_its_own, cpu_machine_only
from mtbench import Backend
from mtbench.runner.measurement.peaks import (calibrate, calibration_path, datasheet_peak, device_peak,
                                              device_peak_record, one_measurement_at_a_time)


@pytest.mark.parametrize("device_name, source, bfloat16", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM datasheet", 989.4e12),   # torch and JAX name the SXM card so
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe datasheet", 756e12),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL datasheet (per GPU)", 835.5e12),
    ("NVIDIA H200", "NVIDIA H200 SXM datasheet", 989.4e12),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL datasheet", 835.5e12),
    ("NVIDIA GH200 480GB", "NVIDIA GH200 Grace Hopper datasheet", 989.4e12),  # not taken for an H200
    ("NVIDIA B200", "NVIDIA HGX B200 datasheet (per GPU)", 2250e12),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 datasheet", 312e12),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 datasheet", 312e12),
    ("NVIDIA A10", "NVIDIA A10 datasheet", 125e12),
    ("NVIDIA L4", "NVIDIA L4 datasheet", 121e12),
    ("NVIDIA L40", "NVIDIA L40 datasheet", 181.05e12),
    ("NVIDIA L40S", "NVIDIA L40S datasheet", 362.05e12),   # not the L40's, nor the L4's
    ("NVIDIA GeForce RTX 4090", "NVIDIA Ada Lovelace architecture whitepaper", 165.2e12),
    ("AMD Instinct MI300X", "AMD Instinct MI300X datasheet (SPX)", 1307.4e12),
    ("AMD Instinct MI325X", "AMD Instinct MI325X datasheet (SPX)", 1307.4e12),
    ("TPU v4", "Google Cloud TPU v4 documentation", 275e12),
    ("TPU v5 lite", "Google Cloud TPU v5e documentation", 197e12),   # JAX's device_kind of a v5e
    ("TPU v5e", "Google Cloud TPU v5e documentation", 197e12),
    ("TPU v5", "Google Cloud TPU v5p documentation", 459e12),        # JAX's device_kind of a v5p
    ("TPU v5p", "Google Cloud TPU v5p documentation", 459e12),
    ("TPU v6 lite", "Google Cloud TPU v6e (Trillium) documentation", 918e12),
])
def test_the_most_specific_device_name_selects_the_datasheet(device_name, source, bfloat16):
    peak, named = datasheet_peak(device_name, "mixed_bfloat16")
    assert peak == bfloat16
    assert named.startswith(source + ", ")


# The A10G (AWS's), the RTX 4090 D and the GB200's GPUs (B200s at more power) have datasheets of their own; none is
# known here.
@pytest.mark.parametrize("device_name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090 D", "NVIDIA GB200",
                                         "Tesla V100-SXM2-16GB", "TPU v3", "", None])
def test_an_unknown_device_has_no_datasheet_peak(device_name):
    assert datasheet_peak(device_name, "float32") == (None, None)


@pytest.mark.parametrize("dtype, precision, peak, source", [
    ("float32", "high", 378e12, "NVIDIA H100 PCIe datasheet, TF32 dense"),
    ("float32", "highest", 51e12, "NVIDIA H100 PCIe datasheet, FP32 dense"),
    ("bfloat16", "high", 756e12, "NVIDIA H100 PCIe datasheet, BF16 dense"),
    ("mixed_bfloat16", "highest", 756e12, "NVIDIA H100 PCIe datasheet, BF16 dense"),
    ("mixed_float16", "high", 756e12, "NVIDIA H100 PCIe datasheet, FP16 dense"),
])
def test_the_tf32_peak_is_used_exactly_for_float32_at_high_precision(dtype, precision, peak, source):
    assert datasheet_peak("NVIDIA H100 PCIe", dtype, matmul_precision=precision) == (peak, source)


def test_matmul_precision_defaults_to_highest_and_reaches_device_peak(tmp_path):
    gpu = {"kind": "gpu", "name": "NVIDIA A100-SXM4-80GB", "count": 1}
    assert datasheet_peak(gpu["name"], "float32") == (19.5e12, "NVIDIA A100 datasheet, FP32 dense")
    assert device_peak(FakeBackend(), gpu, "float32", str(tmp_path), matmul_precision="high") == \
        (156e12, "NVIDIA A100 datasheet, TF32 dense")
    record = device_peak_record(FakeBackend(), gpu, "float32", str(tmp_path))
    assert record == {"flops_per_s": 19.5e12, "source": "NVIDIA A100 datasheet, FP32 dense", "measured_at": None,
                      "load_average": None, "cpus": None, "threads": None, "other_processes_percent": None}
    unknown = device_peak(FakeBackend(), {"kind": "gpu", "name": "NVIDIA A10G"}, "float32", str(tmp_path))
    assert unknown == (None, "no datasheet peak known for NVIDIA A10G")


def test_an_amd_gpu_gives_no_peak_for_float32_at_high_precision_which_may_run_as_xf32():
    assert datasheet_peak("AMD Instinct MI300X", "float32") == (163.4e12,
                                                                "AMD Instinct MI300X datasheet (SPX), FP32 dense")
    assert datasheet_peak("AMD Instinct MI300X", "float32", matmul_precision="high") == \
        (None, "AMD Instinct MI300X datasheet (SPX): no TF32 figure known for these matmuls")


def test_a_tpu_has_no_tf32_peak():
    assert datasheet_peak("TPU v5 lite", "float32", matmul_precision="high") == \
        (197e12, "Google Cloud TPU v5e documentation, BF16 MXU dense")


def cache_without_peaks(session_cache, path):
    """A --cache-dir without the CPU's peaks, whose other folders (the corpus, its tokens, compiled programs) are the
    session cache's: a run made there measures the peaks and nothing else again."""
    shared = {*os.listdir(session_cache), "compile", "datasets", "tokens"} - {"calibration"}
    return cache_of_its_own(session_cache, path, sorted(shared))


# How many CPUs this test's process may run on: what its in-process measurements are keyed by.
HERE = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class FakeBackend(Backend):
    """A backend whose matmul 'measures' a fixed figure, on the CPU, and keeps the size of each one it measured."""
    name = "fake"

    def __init__(self, name="fake", flops_per_s=1e11, threads=None):
        self.name, self.flops_per_s, self.sizes, self.threads = name, flops_per_s, [], threads

    def device_info(self):
        return {"kind": "cpu", "name": "Test CPU", "count": 1, **({"threads": self.threads} if self.threads else {})}

    def matmul_flops_per_s(self, dtype, size):
        self.sizes.append(size)
        return self.flops_per_s


def test_a_cpu_measurement_records_when_it_was_taken_and_the_load(tmp_path):
    before = datetime.datetime.now().astimezone().replace(microsecond=0)
    record = calibrate(FakeBackend(), "float32", "Test CPU", str(tmp_path))
    measured_at = datetime.datetime.fromisoformat(record["measured_at"])
    assert before <= measured_at <= datetime.datetime.now().astimezone()
    assert measured_at.utcoffset() is not None
    assert len(record["load_average"]) == 3 and all(load >= 0 for load in record["load_average"])
    with open(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)) as f:
        assert json.load(f) == record
    # A later run reads the cached measurement, its time and load included, and measures nothing.
    backend = FakeBackend()
    cached = device_peak_record(backend, backend.device_info(), "float32", str(tmp_path),
                                matmul_precision="high")
    assert cached == record and backend.sizes == []
    assert record["cpus"] == HERE and record["threads"] is None  # a backend that does not say


class SlowBackend(FakeBackend):
    """A matmul that takes half a second and no CPU: what the CPUs do meanwhile is another process's work."""

    def matmul_flops_per_s(self, dtype, size):
        import time
        time.sleep(0.5)
        return super().matmul_flops_per_s(dtype, size)


def test_a_cpu_measurement_beside_a_busy_neighbour_records_its_share_and_runs_say_mfu_reads_high(tmp_path):
    """Processes that are no children of the measuring one spin on every core: the load average, a minute's
    moving average, may not have seen them yet; the CPUs' own count does."""
    import signal
    import time
    from mtbench.figures import run_warnings
    from mtbench.runner.measurement.environment import environment_rows
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"  # the shell ends: orphans, not ours
    neighbours = []
    try:
        for _ in range(os.cpu_count()):  # they inherit this worker's CPUs: those the measurement counts
            started = subprocess.run(["sh", "-c", spin], capture_output=True, text=True, check=True)
            neighbours.append(int(started.stdout))
        time.sleep(0.2)
        record = calibrate(SlowBackend(), "float32", "Test CPU", str(tmp_path))
    finally:
        for neighbour in neighbours:
            os.kill(neighbour, signal.SIGKILL)
    assert record["other_processes_percent"] > 50
    with open(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)) as f:
        assert json.load(f)["other_processes_percent"] == record["other_processes_percent"]
    utilization = {"mfu": 0.5, "peak_measured_at": record["measured_at"], "peak_load_average": [0.0, 0.0, 0.0],
                   "peak_other_processes_percent": 40.0}
    result = {"status": "completed", "timing": {}, "env": {"cpu_count": 2}, "utilization": utilization}
    [warning] = [text for text in run_warnings(result) if text.startswith("MFU peak")]
    assert warning.startswith("MFU peak measured under load: other processes used 40 % of the CPUs' time as it "
                              "measured (bound 10 %) at ")
    assert not [text for text in run_warnings({**result, "utilization": {**utilization,
                                                                          "peak_other_processes_percent": 2.0}})
                if text.startswith("MFU peak")]
    description = {"host": {"mtbench": "0", "python": "3", "platform": "p", "cpu_model": "c", "cpu_count": 2,
                            "nvidia_gpu_present": False, "framework_env": {}},
                   "backends": {"fake": {"available": False, "reason": "r",
                                         "peaks": {"float32": {**record, "other_processes_percent": 40.0}}}},
                   "extras": {}, "plugins": [], "warnings": [], "device_warnings": []}
    rows = environment_rows(description)
    assert ("warning", "peak", "fake float32 was measured while other processes used 40 % of the CPUs' time (bound "
            "10 %): it reads low and every MFU of it high; `mtbench env --calibrate` on a quiet machine measures it "
            "again") in rows
    [peak_row] = [row for row in rows if row[0] == "peak"]
    assert peak_row[2].endswith(", other processes 40 % of the CPUs (" + record["source"] + ")")


def test_a_cpu_measurement_records_the_threads_its_framework_ran_and_the_table_names_them(tmp_path):
    from mtbench.figures import peak_measurement_text
    record = calibrate(FakeBackend(threads=3), "float32", "Test CPU", str(tmp_path))
    assert record["threads"] == 3
    with open(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)) as f:
        assert json.load(f)["threads"] == 3
    text = peak_measurement_text(record["measured_at"], record["load_average"], record["cpus"], record["threads"])
    assert text.endswith(f" on {HERE} CPU{'s' * (HERE != 1)}, 3 threads")
    assert peak_measurement_text(record["measured_at"], record["load_average"], record["cpus"]).endswith(
        f" on {HERE} CPU{'s' * (HERE != 1)}")  # an earlier caller's text, as before


def test_a_cache_file_written_before_the_time_was_recorded_still_reads(tmp_path):
    path = calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"flops_per_s": 2e11, "source": "measured: old"}, f)
    backend = FakeBackend()
    assert device_peak_record(backend, backend.device_info(), "float32", str(tmp_path)) == \
        {"flops_per_s": 2e11, "source": "measured: old", "measured_at": None, "load_average": None, "cpus": None,
         "threads": None, "other_processes_percent": None}
    assert device_peak(backend, backend.device_info(), "float32", str(tmp_path)) == (2e11, "measured: old")


def test_a_peak_cached_before_the_cpus_were_counted_is_measured_again(tmp_path):
    """Earlier versions named the file by the CPU model alone, and a process of several wrote its share's peak
    there: a run measures the peak again, on the CPUs it has, and keeps the old file as it was."""
    old = os.path.join(tmp_path, "calibration", "fake-float32-Test-CPU.json")
    os.makedirs(os.path.dirname(old))
    with open(old, "w") as f:
        json.dump({"flops_per_s": 5e10, "source": "measured: half", "measured_at": "2026-11-30T10:00:00+00:00",
                   "load_average": [0.1, 0.1, 0.1]}, f)
    backend = FakeBackend(flops_per_s=1e11)
    record = device_peak_record(backend, backend.device_info(), "float32", str(tmp_path))
    assert backend.sizes == [256, 2048] and record["flops_per_s"] == 1e11 and record["cpus"] == HERE  # probe, measure
    assert sorted(name for name in os.listdir(os.path.dirname(old)) if name.endswith(".json")) == sorted([
        "fake-float32-Test-CPU.json", f"fake-float32-Test-CPU-{HERE}cpus.json"])
    with open(old) as f:
        assert json.load(f)["flops_per_s"] == 5e10


def test_a_peak_measured_on_another_count_of_cpus_is_not_this_runs(tmp_path):
    """A run pinned to some of the CPUs (taskset, a scheduler's share) divides by their peak, and a run on all of
    them by theirs: each is cached under its count."""
    calibrate(FakeBackend(flops_per_s=1e11), "float32", "Test CPU", str(tmp_path))
    other = calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE + 1)
    os.rename(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE), other)
    backend = FakeBackend(flops_per_s=3e11)
    assert device_peak(backend, backend.device_info(), "float32", str(tmp_path))[0] == 3e11
    assert backend.sizes == [256, 2048]  # the probe, then the measurement


def test_the_fastest_backend_sets_the_cpu_peak_with_its_own_record(tmp_path):
    slow, fast = FakeBackend("slow", 1e11), FakeBackend("fast", 3e11)
    record = device_peak_record(slow, slow.device_info(), "float32", str(tmp_path), all_backends=(slow, fast))
    assert record["flops_per_s"] == 3e11
    assert record["source"] == ("measured: 2048x2048 float32 matmul on fast, median of repeats "
                                "(the fastest of fast, slow on this CPU)")
    with open(calibration_path(str(tmp_path), "fast", "float32", "Test CPU", HERE)) as f:
        assert record["measured_at"] == json.load(f)["measured_at"] is not None


def test_runs_that_calibrate_together_keep_the_first_measurement_and_env_calibrate_replaces_it(tmp_path):
    """Two runs that found no cached peak measure at once: the one that finishes second divides by the first's
    measurement, which the cache keeps, so that both runs' MFU are against one peak."""
    first = calibrate(FakeBackend(flops_per_s=1e11), "float32", "Test CPU", str(tmp_path), replace=False)
    second = calibrate(FakeBackend(flops_per_s=2e11), "float32", "Test CPU", str(tmp_path), replace=False)
    assert second == first and first["flops_per_s"] == 1e11
    # `mtbench env --calibrate` measures again on purpose.
    again = calibrate(FakeBackend(flops_per_s=3e11), "float32", "Test CPU", str(tmp_path))
    assert again["flops_per_s"] == 3e11
    with open(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)) as f:
        assert json.load(f) == again
    assert [name for name in os.listdir(os.path.dirname(calibration_path(str(tmp_path), "fake", "float32", "x", HERE)))
            if name.startswith(".tmp-")] == []


@pytest.mark.parametrize("flops_per_s, size", [
    (3e9, 512),     # an emulated 16-bit dtype: a 512 matmul takes 0.09 s, a 768 one would take 0.30 s
    (1e11, 2048),   # a CPU's float32: a 2048 matmul takes 0.17 s
])
def test_a_slow_dtype_is_measured_on_matmuls_that_keep_the_calibration_to_seconds(tmp_path, flops_per_s, size):
    backend = FakeBackend(flops_per_s=flops_per_s)
    record = calibrate(backend, "float16", "Test CPU", str(tmp_path))
    assert backend.sizes == [256, size]  # the probe, then the measurement
    assert record["source"] == f"measured: {size}x{size} float16 matmul on fake, median of repeats"


def test_processes_that_find_no_peak_together_measure_it_one_at_a_time(tmp_path):
    """The lock `one_measurement_at_a_time` holds: a second process (here a thread, with a lock file of its own
    opening) waits until the first has measured and cached the peak, then reads it."""
    import threading
    path = calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE)
    order, second_started = [], threading.Event()

    def second():
        second_started.set()
        with one_measurement_at_a_time(path):
            order.append("second")

    with one_measurement_at_a_time(path):
        order.append("first")
        waiting = threading.Thread(target=second)
        waiting.start()
        second_started.wait()
        waiting.join(timeout=0.5)
        assert waiting.is_alive() and order == ["first"]  # it waits for the lock
        order.append("first done")
    waiting.join()
    assert order == ["first", "first done", "second"]


@pytest.mark.slow  # three processes that import torch and measure: 7 s beside the other worker
@pytest.mark.skipif(not MACHINE_CPUS or len(MACHINE_CPUS) < 2, reason="needs a machine with 2 CPUs or more")
def test_a_measurement_on_given_cpus_runs_in_a_process_that_holds_them(tmp_path, monkeypatch):
    """`measure_on` measures in a process of its own, on the CPUs given, whatever this process holds (a pytest
    worker holds one share of the machine's CPUs), and with as many threads as they give: torchrun's
    OMP_NUM_THREADS=1, in the environment of the process that asks, is left out."""
    from mtbench.runner.measurement.peaks import measure_on
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = {}
    for cpus in (MACHINE_CPUS[:1], MACHINE_CPUS):
        measured = measure_on(cpus, "torch", "float32", 256)
        assert (measured.size, measured.cpus) == (256, len(cpus)) and measured.flops_per_s > 0
        threads[len(cpus)] = measured.threads
    # torch's own count on every CPU where nothing sets it (a thread for each physical core), not torchrun's one.
    unset = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    program = (f"import os; os.sched_setaffinity(0, {MACHINE_CPUS}); import torch; "
               f"print(torch.get_num_threads())")
    own = subprocess.run([sys.executable, "-c", program], env=unset, capture_output=True, text=True,
                         check=True).stdout.split()[-1]
    assert threads == {1: 1, len(MACHINE_CPUS): int(own)}, threads


@pytest.mark.slow  # two torch processes and the measuring processes of torch's and JAX's peaks: about 25 s
@pytest.mark.skipif(not MACHINE_CPUS or len(MACHINE_CPUS) < 2, reason="needs a machine with 2 CPUs or more")
def test_processes_sharing_the_cpus_measure_the_peak_on_all_of_them(tmp_path, cache_dir):
    """Each of 2 processes holds half of the CPUs: the peak they divide by was measured on all of them, not on
    the half a process holds (which cached half the machine's peak for every later run of this CPU)."""
    from tests.plugins.extras.test_multi_process import torchrun
    out, cache = tmp_path / "ddp.json", tmp_path / "cache"
    cache_without_peaks(cache_dir, cache)
    proc = torchrun("train", "--backend", "torch", "--extra", "ddp", "--model", "gpt", "--preset", "tiny",
                    "--block-size", "32", "--batch-size", "8", "--steps", "4", "--dtype", "float32", "--measure-only",
                    "--cache-dir", str(cache), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["processes"]["cpu_share"]["threads"] == len(MACHINE_CPUS) // 2
    utilization = result["utilization"]
    assert utilization["peak_cpus"] == len(MACHINE_CPUS) and utilization["mfu"] > 0
    # torch's peak and JAX's (the CPU's is the faster), each measured once, on every CPU.
    calibrations = [name for name in os.listdir(cache / "calibration") if name.endswith(".json")]
    assert sorted(name.split("-float32-")[0] for name in calibrations) == ["jax", "torch"]
    for name in calibrations:
        with open(cache / "calibration" / name) as f:
            assert json.load(f)["cpus"] == len(MACHINE_CPUS), name


@pytest.mark.skipif(not MACHINE_CPUS or len(MACHINE_CPUS) < 2, reason="needs a machine with 2 CPUs or more")
def test_a_backend_that_a_process_of_its_own_cannot_find_is_measured_here_under_its_own_count(tmp_path):
    """A backend registered by code, not installed, has no process of its own to measure in: this process
    measures it on the CPUs it holds, and the record and its file say how many (a run on all of them measures
    again)."""
    backend = FakeBackend()
    record = calibrate(backend, "float32", "Test CPU", str(tmp_path), cpus=MACHINE_CPUS)
    assert backend.sizes and record["flops_per_s"] == 1e11 and record["cpus"] == HERE
    assert record["source"].endswith("matmul on fake, median of repeats")  # nothing failed: it was expected here
    assert os.path.exists(calibration_path(str(tmp_path), "fake", "float32", "Test CPU", HERE))


def test_a_measuring_process_that_fails_is_reported_in_the_record_measured_here(tmp_path):
    """A measuring process that finds its backend and then fails (here: on a CPU this machine does not have) is
    named, with its last line, in the record of the measurement this process makes in its place (a run measures
    its peak after training, and goes on); a backend that process cannot find is measured here without one (the
    test above)."""
    from mtbench.plugins.manager import registry
    missing_cpu = os.cpu_count() + 4096
    record = calibrate(registry().backends["torch"], "float32", "Test CPU", str(tmp_path), size=64,
                       cpus=[missing_cpu])
    assert re.fullmatch(rf"measured: \d+x\d+ float32 matmul on torch, median of repeats, in this process: measuring "
                        rf"torch's float32 matmul peak on CPUs \[{missing_cpu}\] failed: .*Invalid argument",
                        record["source"]), record["source"]
    assert record["cpus"] == HERE and record["flops_per_s"] > 0


@pytest.mark.slow
@cpu_machine_only
def test_a_first_run_measures_each_backends_peak_in_a_process_of_its_own_before_training(tmp_path, cache_dir):
    """On a cache without peaks a jax run measures jax's and torch's matmul peaks (MFU divides by the faster one),
    each in a process of its own: torch is never imported into the run's process, whose host memory (and on a
    machine with RAPL, energy) would count it. The measuring is a phase of its own, before training, left out of
    the run's total time."""
    import subprocess
    import sys

    from conftest import REPOSITORY, cli_environment
    out, cache = tmp_path / "run.json", tmp_path / "cache"
    cache_without_peaks(cache_dir, cache)
    # The tiny GPT's step as test_init_schemes.py's torch draw compiles it (the same shapes and schedule, on bytes
    # of another text): the session compiles it once.
    program = ("import runpy, sys\n"
               f"sys.argv = ['mtbench', 'train', '--backend', 'jax', '--model', 'gpt', '--preset', 'tiny', "
               f"'--data', {os.path.join(REPOSITORY, 'README.md')!r}, '--block-size', '32', '--batch-size', '8', "
               f"'--steps', '2', '--measure-only', '--dtype', 'float32', '--cache-dir', {str(cache)!r}, "
               f"'--out', {str(out)!r}]\n"
               "try:\n    runpy.run_module('mtbench', run_name='__main__')\nexcept SystemExit as exit:\n"
               "    assert not exit.code, exit.code\n"
               "print(sorted({name.split('.')[0] for name in sys.modules if name.startswith(('jax', 'torch'))}))\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=cli_environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch" not in eval(proc.stdout.strip().splitlines()[-1])
    with open(out) as f:
        result = json.load(f)
    assert result["utilization"]["peak_source"].endswith("(the fastest of jax, torch on this CPU)")
    assert sorted(name.split("-")[0] for name in os.listdir(cache / "calibration") if name.endswith(".json")) == [
        "jax", "torch"]
    phases = list(result["timing"]["phases_s"])
    assert phases.index("peak") < phases.index("train") and result["timing"]["phases_s"]["peak"] > 0
    # The machine's measurement is not the run's time: the total holds every other phase, and not the peak's
    # (seconds of two processes' matmuls, against the few milliseconds between phases).
    phases_s = result["timing"]["phases_s"]
    assert sum(seconds for name, seconds in phases_s.items() if name != "peak") <= result["timing"]["total_s"] \
        < sum(phases_s.values())


def test_a_plugin_backend_that_measures_no_matmul_gives_no_cpu_peak_rather_than_failing(tmp_path):
    """The docs ask `matmul_flops_per_s` only for MFU on CPUs: a run on such a backend failed with `Error:
    NotImplementedError:`. Now its MFU is n/a, with the reason, or divides by another backend's measurement."""
    class Unmeasured(FakeBackend):
        matmul_flops_per_s = Backend.matmul_flops_per_s

    alone = Unmeasured("plain")
    record = device_peak_record(alone, alone.device_info(), "float32", str(tmp_path))
    assert record["flops_per_s"] is None
    assert record["source"] == ("backend 'plain' measures no matmul (Backend.matmul_flops_per_s) and no other "
                                "backend installed here measured this CPU")
    other = FakeBackend("other", 2e11)
    record = device_peak_record(alone, alone.device_info(), "float32", str(tmp_path), all_backends=(alone, other))
    assert record["flops_per_s"] == 2e11
