"""Energy from the hardware's counters: the arithmetic on recorded counter sequences (RAPL with its wrap-around,
NVML through a stand-in for pynvml), and the reason a run without a counter gives."""

import sys
import types

import pytest

from mtbench.runner.measurement import energy
from mtbench.runner.measurement.energy import EnergyMeter, NvmlCounter, RaplCounter, open_counter, rapl_domains
from tests.conftest import run_joined_probes


def write_domain(root, name, energy_uj, wrap_uj=262143328850):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{wrap_uj}\n")
    return folder


def test_rapl_reads_package_domains_only_and_survives_a_wrap(tmp_path):
    (write_domain(tmp_path, "intel-rapl:0", 1_000_000, wrap_uj=10_000_000) / "name").write_text("package-0\n")
    write_domain(tmp_path, "intel-rapl:0:0", 5)    # a subdomain (core): already inside the package's count
    write_domain(tmp_path, "intel-rapl:1", 2_000_000, wrap_uj=10_000_000)  # a second socket (no name file here)
    (tmp_path / "intel-rapl:2").mkdir()              # no counter file: skipped, not fatal
    # A laptop's platform zone, top-level too: the packages' energy and more, so left out.
    (write_domain(tmp_path, "intel-rapl:3", 9_000_000) / "name").write_text("psys\n")
    domains = rapl_domains(str(tmp_path))
    assert [path.split("/")[-2] for path, _ in domains] == ["intel-rapl:0", "intel-rapl:1"]
    counter = RaplCounter(domains)
    before = counter.read()
    assert before == [1.0, 2.0]
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("4000000\n")   # +3 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500000\n")    # wrapped: +8.5 J (10 - 2 + 0.5)
    assert counter.difference(before, counter.read()) == pytest.approx(3.0 + 8.5)


def test_processes_on_one_machine_each_count_their_share_of_its_packages(tmp_path, monkeypatch):
    """Every process of a CPU run reads the machine's packages, and the run sums its processes' joules
    (`test_the_energy_of_a_run_of_two_processes_is_both_devices_joules`): each counts its share, so the machine's
    6 J between two readings are counted once, not once a process."""
    write_domain(tmp_path, "intel-rapl:0", 1_000_000)
    domains = rapl_domains(str(tmp_path))
    monkeypatch.setattr(energy, "rapl_domains", lambda root=None: domains)
    counters = [open_counter({"kind": "cpu"}, processes_on_machine=2)[0] for _ in range(2)]
    before = [counter.read() for counter in counters]
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("7000000\n")  # +6 J
    assert [counter.difference(b, counter.read()) for counter, b in zip(counters, before)] == [3.0, 3.0]


class RecordedCounter(energy.Counter):
    """A counter that plays back a recorded sequence of readings (joules per device)."""
    source = "recorded"
    counts = "the recorded devices only"

    def __init__(self, readings):
        self.readings = iter(readings)

    def read(self):
        return next(self.readings)


def test_meter_sums_steady_steps_and_the_whole_run():
    clock = iter([100.0, 112.0])  # the run's start and end, seconds
    # start of run, then (before, after) around 3 steps on two devices, then the end of the run
    readings = [[0, 0], [10, 10], [40, 30], [50, 35], [60, 45], [61, 46], [81, 56], [100, 70]]
    meter = EnergyMeter(RecordedCounter(readings), clock=lambda: next(clock))
    history = []
    for step, (first, tokens, seconds) in enumerate([(True, 100, 2.0), (False, 200, 0.5), (False, 300, 1.0)], 1):
        joules = meter.between(meter.read(), meter.read())
        history.append({"step": step, "first_of_shape": first, "tokens": tokens, "seconds": seconds,
                        "joules": joules})
    assert [h["joules"] for h in history] == [50.0, 20.0, 30.0]
    section, history = meter.section(history)
    assert section["source"] == "recorded" and section["counts"] == "the recorded devices only"
    assert section["steady"] == {"steps": 2, "joules": 50.0, "joules_per_1k_tokens": 100.0, "avg_watts": 50 / 1.5}
    assert section["run"] == {"joules": 170.0, "seconds": 12.0, "joules_per_1k_tokens": 170 / 600 * 1000,
                              "avg_watts": 170 / 12}


def test_a_resumed_runs_joules_per_token_are_its_own_processes():
    """The meter reads from this process's start: the steps an earlier process trained (restored with the
    checkpoint, their joules kept) are no tokens of its run's joules."""
    clock = iter([0.0, 10.0])
    meter = EnergyMeter(RecordedCounter([[0], [90]]), clock=lambda: next(clock))
    earlier = [{"step": step, "first_of_shape": step == 1, "tokens": 1000, "seconds": 1.0, "joules": 40.0}
               for step in (1, 2, 3)]
    own = [{"step": step, "first_of_shape": step == 4, "tokens": 1000, "seconds": 1.0, "joules": 30.0}
           for step in (4, 5, 6)]
    section, _ = meter.section(earlier + own, resumed_at_steps=[4])
    assert section["run"]["joules"] == 90.0 and section["run"]["joules_per_1k_tokens"] == 30.0  # 90 J, 3,000 tokens
    assert section["steady"]["steps"] == 4  # every process's steady steps, each with its own joules


class TwoAlikeProcesses:
    """A group of two processes whose other process read what this one did: each sum is twice this one's."""
    world_size = 2

    def sum(self, values):
        return [2 * value for value in values]


def test_a_resumed_run_of_two_processes_sums_only_the_joules_its_processes_read():
    """Process 0's checkpoint alone is restored, so each step's joules are summed over the processes when it is
    written; the steps restored from it are summed once, not again with the resumed processes' own."""
    from mtbench.runner.measurement.energy import joules_of_every_process
    clock = iter([0.0, 10.0])
    meter = EnergyMeter(RecordedCounter([[0], [90]]), clock=lambda: next(clock))
    trained = [{"step": step, "first_of_shape": step == 1, "tokens": 1000, "seconds": 1.0, "joules": 40.0}
               for step in (1, 2, 3)]
    checkpointed = joules_of_every_process(trained, TwoAlikeProcesses())  # what save_checkpoint writes
    assert [h["joules"] for h in checkpointed] == [80.0] * 3 and [h["joules"] for h in trained] == [40.0] * 3
    own = [{"step": step, "first_of_shape": step == 4, "tokens": 1000, "seconds": 1.0, "joules": 30.0}
           for step in (4, 5, 6)]
    section, history = meter.section(checkpointed + own, TwoAlikeProcesses(), resumed_at_steps=[4])
    assert [h["joules"] for h in history] == [80.0] * 3 + [60.0] * 3
    assert section["run"]["joules"] == 180.0 and section["run"]["joules_per_1k_tokens"] == 60.0


def test_the_host_sync_probes_step_is_no_steady_step():
    """The probe's step is slowed by its counting, and differently on each backend: its joules and seconds stay out
    of the steady figures, as they stay out of the timing's (they were counted in)."""
    clock = iter([100.0, 110.0])
    # start of run, (before, after) around 3 steps on one device, the end of the run
    meter = EnergyMeter(RecordedCounter([[0], [10], [40], [50], [150], [160], [190], [200]]),
                        clock=lambda: next(clock))
    history = []
    for step, (first, probe, seconds) in enumerate([(True, False, 2.0), (False, True, 3.0), (False, False, 1.0)], 1):
        joules = meter.between(meter.read(), meter.read())
        history.append({"step": step, "first_of_shape": first, "tokens": 300, "seconds": seconds, "joules": joules,
                        **({"host_sync_probe": True} if probe else {})})
    assert [h["joules"] for h in history] == [30.0, 100.0, 30.0]
    section, _ = meter.section(history)
    assert section["steady"] == {"steps": 1, "joules": 30.0, "joules_per_1k_tokens": 100.0, "avg_watts": 30.0}


def test_nvml_counter_reads_millijoules_of_every_device_used(monkeypatch):
    # Millijoules as NVML counts them; open_counter reads once to check that the counter works.
    recorded = {0: iter([4_000, 5_000, 9_000]), 1: iter([6_000, 7_000, 7_500]), 2: iter([0, 10**9])}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 3, nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: next(recorded[handle]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    counter, reason = open_counter({"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 2}, ordinals=[0, 1])
    assert reason is None and isinstance(counter, NvmlCounter) and counter.handles == [1, 0]
    assert counter.counts.startswith("GPUs only (not the host's CPUs")  # what the figure leaves out, said
    before, after = counter.read(), counter.read()
    assert before == [7.0, 5.0] and counter.difference(before, after) == pytest.approx(0.5 + 4.0)


def test_nvml_counts_only_the_devices_this_process_computes_on(monkeypatch):
    """One process of an 8-GPU machine (torchrun's local rank 3, or a single-device run on GPU 0) counts its own
    GPU, not the idle others."""
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                                 nvmlDeviceGetCount=lambda: 8, nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
                                 nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 8}
    assert open_counter(gpu)[0].handles == [0]
    assert open_counter(gpu, ordinals=[3])[0].handles == [3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert open_counter(gpu, ordinals=[1])[0].handles == [5]


def test_nvml_finds_the_gpus_cuda_visible_devices_names_by_uuid_and_counts_no_mig_instance(monkeypatch):
    """Schedulers and containers often name the GPUs by UUID (or a unique prefix of it, as CUDA takes them): NVML's
    handles are found by it, not taken as the process's own ordinals. A MIG instance has no counter of its own:
    the whole GPU's would be claimed, so no energy is counted, and the reason says why."""
    uuids = [b"GPU-0aa1-0000", "GPU-1bb2-0000", "GPU-2cc3-0000", "GPU-3dd4-0000"]  # older nvidia-ml-py: bytes
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(uuids),
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetUUID=lambda i: uuids[i],
                                 nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpu = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 2}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-3dd4-0000,GPU-1bb")
    assert open_counter(gpu, ordinals=[0, 1])[0].handles == [3, 1]
    assert open_counter(gpu, ordinals=[1])[0].handles == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-")  # a prefix of every GPU's
    assert open_counter(gpu) == (None, "NVML's energy counter cannot be read on NVIDIA H100 80GB HBM3: LookupError: "
                                       "CUDA_VISIBLE_DEVICES names GPU-, which 4 of the machine's GPUs' UUIDs start "
                                       "with")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5ee5-0000")
    assert open_counter(gpu) == (None, "NVML's energy counter cannot be read on NVIDIA H100 80GB HBM3: LookupError: "
                                       "the process computes on a MIG instance (MIG-5ee5-0000), and NVML counts the "
                                       "energy of the whole GPU")


def test_a_gpu_split_into_mig_instances_counts_no_energy_when_no_variable_names_the_instance(monkeypatch):
    """A container given a MIG instance by NVIDIA_VISIBLE_DEVICES sees it as device 0, with no CUDA_VISIBLE_DEVICES:
    NVML's GPU 0 is then the whole GPU, other tenants' work in its counter."""
    modes = {0: [1, 1], 1: [0, 0]}  # (current, pending): MIG on GPU 0, off on GPU 1
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                                 nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
                                 nvmlDeviceGetMigMode=lambda handle: modes[handle], NVML_DEVICE_MIG_ENABLE=1,
                                 nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1}
    assert open_counter(gpu) == (None, "NVML's energy counter cannot be read on NVIDIA H100 80GB HBM3: LookupError: "
                                       "the GPU is split into MIG instances, one of which the process computes on, "
                                       "and NVML counts the energy of the whole GPU")
    assert open_counter(gpu, ordinals=[1])[0].handles == [1]


def test_a_machine_of_different_gpus_is_read_by_nvml_only_in_the_order_cuda_numbers_them(monkeypatch):
    """CUDA's device 0 is the fastest GPU unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's the first on the PCI bus: on
    this machine (a T4 on bus 0, an A100 on bus 1) the process computing on CUDA's device 0, the A100, would have
    claimed the T4's counter."""
    names = [b"Tesla T4", "NVIDIA A100-SXM4-80GB"]  # PCI bus order, NVML's
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 2,
                                 nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda i: names[i],
                                 nvmlDeviceGetTotalEnergyConsumption=lambda handle: 1_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    a100 = {"kind": "gpu", "name": "NVIDIA A100-SXM4-80GB", "count": 1}
    assert open_counter(a100) == (None, "NVML's energy counter cannot be read on NVIDIA A100-SXM4-80GB: "
                                        "LookupError: the machine's GPUs differ (NVIDIA A100-SXM4-80GB, Tesla T4), "
                                        "which CUDA numbers fastest first and NVML by PCI bus (set "
                                        "CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID in "
                                        "CUDA_VISIBLE_DEVICES)")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's numbers are NVML's
    assert open_counter(a100, ordinals=[1])[0].handles == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert open_counter(a100)[0].handles == [1]


def stand_in_amdsmi(counts):
    """AMD SMI as ROCm's `amdsmi` answers: a handle per GPU of the machine, each one's energy accumulator in ticks of
    `counter_resolution` microjoules (named 'power' before ROCm 6.2)."""
    return types.SimpleNamespace(amdsmi_init=lambda: None,
                                 amdsmi_get_processor_handles=lambda: [f"gpu{i}" for i in range(8)],
                                 amdsmi_get_energy_count=lambda handle: next(counts[handle]))


def test_amd_gpus_are_counted_by_amd_smi_on_the_gpus_this_process_computes_on(monkeypatch):
    ticks = lambda *values, key="energy_accumulator": iter({key: v, "counter_resolution": 15.3} for v in values)
    counts = {"gpu5": ticks(0, 10**6, 3 * 10**6), "gpu2": ticks(0, 2 * 10**6, 2 * 10**6, key="power"),
              "gpu3": ticks(0)}
    monkeypatch.setitem(sys.modules, "amdsmi", stand_in_amdsmi(counts))
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1,2,3,5")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "3,1")  # HIP's devices 0 and 1 are ROCr's 3 and 1: GPUs 5 and 2
    mi300x = {"kind": "gpu", "name": "AMD Instinct MI300X", "count": 2}
    counter, reason = open_counter(mi300x, ordinals=[0, 1])
    assert reason is None and counter.source == "amdsmi" and counter.handles == ["gpu5", "gpu2"]
    before, after = counter.read(), counter.read()
    assert counter.difference(before, after) == pytest.approx((2 * 10**6 + 0) * 15.3 / 1e6)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # HIP reads it where HIP_VISIBLE_DEVICES is not set: ROCr's 2
    assert open_counter(mi300x)[0].handles == ["gpu3"]
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # not installed
    for name in ("AMD Radeon RX 7900 XTX", "gfx90a"):
        assert open_counter({"kind": "gpu", "name": name})[1].startswith("amdsmi is not installed")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert open_counter({"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"})[1].startswith("nvidia-ml-py")


def test_an_amd_smi_that_cannot_load_rocms_library_is_a_reason_not_a_traceback(monkeypatch, tmp_path):
    (tmp_path / "amdsmi.py").write_text("raise OSError('libamd_smi.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    assert open_counter({"kind": "gpu", "name": "AMD Instinct MI300X"}) == (
        None, "amdsmi cannot be imported: OSError: libamd_smi.so: cannot open shared object file")


def test_without_a_counter_the_result_says_why_and_gives_no_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(energy, "RAPL_ROOT", str(tmp_path / "none"))
    monkeypatch.setattr(energy, "rapl_domains", lambda root=None: [])
    counter, reason = open_counter({"kind": "cpu", "name": "some CPU"})
    assert counter is None and "no readable powercap/RAPL counter" in reason
    assert EnergyMeter(counter, reason).section([]) == ({"source": None, "reason": reason}, [])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert open_counter({"kind": "gpu", "name": "NVIDIA A100"}) == (
        None, "nvidia-ml-py is not installed (pip install 'mtbench[energy]')")
    assert open_counter({"kind": "tpu", "name": "TPU v4"})[1] == "no energy counter known for tpu devices"


@pytest.mark.slow
def test_the_energy_of_a_run_of_two_processes_is_both_devices_joules():
    """Each process reads only its own GPU (`test_nvml_counts_only_the_devices_this_process_computes_on`), while
    tokens/s counts the global batch: process 0's device draws 10 J between readings, process 1's 20 J."""
    first, second = run_joined_probes("energy_processes_probe.py")
    assert first == second  # every process sums the same figures
    # Steps take 10 + 20 J each; the run, from the meter's start to its end (7 readings on), 70 + 140 J.
    assert first["joules"] == [30.0, 30.0, 30.0]
    assert first["section"]["processes"] == 2
    assert first["section"]["counts"] == "this process's recorded device only"
    assert first["section"]["steady"] == {"steps": 2, "joules": 60.0, "joules_per_1k_tokens": 60.0, "avg_watts": 30.0}
    assert first["section"]["run"]["joules"] == 210.0


class WrappingCounter(RecordedCounter):
    """A counter of one package that wraps at 100 J, as RAPL's wraps at its max_energy_range_uj."""

    def difference(self, before, after):
        return sum((b - a) % 100.0 for a, b in zip(before, after))


def test_a_run_longer_than_the_counters_wrap_sums_every_reading():
    """The counter wraps twice in the run, in a step and after the last: the run drew 10 + 80 + 5 + 50 + 80 = 225 J
    (two wraps and 25), where its start and end readings alone say 25 J."""
    clock = iter([0.0, 10.0])
    readings = [[0.0], [10.0], [90.0], [95.0], [45.0], [25.0]]  # start, around two steps, end
    meter = EnergyMeter(WrappingCounter(readings), clock=lambda: next(clock))
    history = []
    for step in (1, 2):
        history.append({"step": step, "first_of_shape": step == 1, "tokens": 1000, "seconds": 1.0,
                        "joules": meter.between(meter.read(), meter.read())})
    assert [h["joules"] for h in history] == [80.0, 50.0]
    section, _ = meter.section(history)
    assert section["run"]["joules"] == 225.0 and section["run"]["avg_watts"] == 22.5
