"""The energy a run draws, from the hardware's own counters: NVML's total-energy counter on NVIDIA GPUs (the
`nvidia-ml-py` package), AMD SMI's energy accumulator on AMD GPUs (ROCm's `amdsmi` package), the powercap/RAPL
package counters on CPUs where the system exposes them. Elsewhere the result says why there is no figure; it never
estimates one.

Counters are read at the edges of the timed steps (after the device is synchronised) and at the start and end of
the run. Each process of a run reads the counters of its own devices; the figures are summed over the processes,
so that a run's joules are those of every device whose tokens tokens/s counts. A RAPL counter wraps at
`max_energy_range_uj`; each difference is taken modulo that range, and the run's joules are summed reading by
reading, so a run longer than one wrap still adds up as long as it is read at least once per wrap (every timing
window is; an evaluation longer than one wrap between two readings would lose one).
"""

import os
import re
import time

from mtbench.figures import is_steady
from mtbench.plugins.api import Launch, ProcessGroup

RAPL_ROOT = "/sys/class/powercap"
ONE_PROCESS = ProcessGroup(Launch())


class Counter:
    """A monotonic energy counter over every device the run uses. `counts`: what its joules hold, and so what they
    leave out (a GPU's counter holds none of the host's work, which a backend may do more of than another)."""
    source = ""
    counts = ""

    def read(self):
        """The counter in joules, per device (a list)."""
        raise NotImplementedError

    def difference(self, before, after):
        """Joules between two readings, summed over devices."""
        return float(sum(b - a for a, b in zip(before, after)))


class RaplCounter(Counter):
    """The machine's CPU packages. `sharing`: the run's processes on this machine, each of which reads the same
    packages: each counts its share, so that the run's sum over its processes (`EnergyMeter.section`) counts the
    machine once."""
    source = "rapl"
    counts = "CPU packages only (not DRAM, GPUs or the rest of the machine)"

    def __init__(self, domains, sharing=1):
        self.domains = domains  # [(energy_uj path, max_energy_range_uj)]
        self.sharing = sharing

    def read(self):
        readings = []
        for path, _ in self.domains:
            with open(path) as f:
                readings.append(int(f.read()) / 1e6)
        return readings

    def difference(self, before, after):
        total = 0.0
        for (a, b), (_, wrap_uj) in zip(zip(before, after), self.domains):
            total += (b - a) % (wrap_uj / 1e6)
        return total / self.sharing


class NvmlCounter(Counter):
    source = "nvml"
    counts = "GPUs only (not the host's CPUs, memory or the rest of the machine)"

    def __init__(self, pynvml, handles):
        self.pynvml, self.handles = pynvml, handles

    def read(self):
        # Millijoules since the driver was loaded.
        return [self.pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3 for handle in self.handles]


class AmdSmiCounter(Counter):
    source = "amdsmi"
    counts = "GPUs only (not the host's CPUs, memory or the rest of the machine)"

    def __init__(self, amdsmi, handles):
        self.amdsmi, self.handles = amdsmi, handles

    def read(self):
        readings = []
        for handle in self.handles:
            count = self.amdsmi.amdsmi_get_energy_count(handle)
            # Ticks of `counter_resolution` microjoules each; ROCm before 6.2 named the ticks 'power'.
            ticks = count["energy_accumulator"] if "energy_accumulator" in count else count["power"]
            readings.append(ticks * count["counter_resolution"] / 1e6)
        return readings


def rapl_domains(root=RAPL_ROOT):
    """The package-level RAPL domains ('intel-rapl:N' or 'amd-rapl:N', not their subdomains) whose counters this
    process can read: [(energy_uj path, wrap range in µJ)]. A client machine's 'psys' zone, also top-level, holds the
    packages' energy and the platform's beside it: counted with them, it would count the packages twice."""
    if not os.path.isdir(root):
        return []
    domains = []
    for name in sorted(os.listdir(root)):
        prefix, _, rest = name.partition(":")
        if not prefix.endswith("rapl") or not rest or ":" in rest or _zone_name(root, name) == "psys":
            continue
        energy, wrap = os.path.join(root, name, "energy_uj"), os.path.join(root, name, "max_energy_range_uj")
        try:
            with open(energy) as f:
                int(f.read())
            with open(wrap) as f:
                domains.append((energy, int(f.read())))
        except (OSError, ValueError):
            continue
    return domains


def _zone_name(root, zone):
    try:
        with open(os.path.join(root, zone, "name")) as f:
            return f.read().strip()
    except OSError:
        return None


class NamedDevices(ValueError):
    """A visible-devices variable that names the process's GPUs by UUID (GPU-..., MIG-...), not by index."""

    def __init__(self, variable, names):
        super().__init__(f"{variable} names its GPUs ({','.join(names)}), not their indices")
        self.names = names


def _visible_gpu_indices(ordinals, variable="CUDA_VISIBLE_DEVICES"):
    """NVML numbers every GPU of the machine; `variable` (as indices) says which ones the process sees, and
    `ordinals` are devices as the process numbers the ones it sees. Raises `NamedDevices` where it names them."""
    visible = os.environ.get(variable)
    if not visible:
        return list(ordinals)
    entries = [entry.strip() for entry in visible.split(",")]
    seen = [entries[i] for i in ordinals if i < len(entries)]
    if all(entry.isdigit() for entry in seen):
        return [int(entry) for entry in seen]
    raise NamedDevices(variable, seen)


def _visible_amd_gpu_indices(ordinals):
    """As `_visible_gpu_indices`, for AMD SMI's numbering: HIP picks among the GPUs ROCr lets it see
    (HIP_VISIBLE_DEVICES, else CUDA_VISIBLE_DEVICES, as HIP reads them), ROCr among the machine's
    (ROCR_VISIBLE_DEVICES)."""
    hip = "HIP_VISIBLE_DEVICES" if os.environ.get("HIP_VISIBLE_DEVICES") else "CUDA_VISIBLE_DEVICES"
    return _visible_gpu_indices(_visible_gpu_indices(ordinals, hip), "ROCR_VISIBLE_DEVICES")


def open_counter(device, ordinals=(0,), processes_on_machine=1):
    """(Counter or None, reason when None) for the run's device (`Backend.device_info()`): on GPUs, the counters
    of the devices this process computes on (`ordinals`, as it numbers its visible devices), not every GPU of
    the machine; on CPUs, this process's share of the machine's packages, which its `processes_on_machine` (the
    run's processes on this machine) all read."""
    kind, name = device.get("kind"), device.get("name") or ""
    if kind == "gpu" and is_amd_gpu(name):
        return _amdsmi_counter(name, ordinals)
    if kind == "gpu":
        try:
            import pynvml
        except ImportError:
            return None, "nvidia-ml-py is not installed (pip install 'mtbench[energy]')"
        try:
            pynvml.nvmlInit()
            handles = _refuse_mig(pynvml, _nvml_handles(pynvml, ordinals))
            counter = NvmlCounter(pynvml, handles)
            counter.read()
        except Exception as error:  # pynvml.NVMLError_NotSupported on GPUs older than Volta, no driver, ...
            return None, (f"NVML's energy counter cannot be read on {name or 'this GPU'}: "
                          f"{type(error).__name__}: {error}")
        return counter, None
    if kind == "cpu":
        domains = rapl_domains()
        if domains:
            return RaplCounter(domains, processes_on_machine), None
        return None, (f"no readable powercap/RAPL counter under {RAPL_ROOT} (a virtual machine or container "
                      f"often hides them; on Linux hosts they may need read permission on energy_uj)")
    return None, f"no energy counter known for {kind} devices"


def _nvml_handles(pynvml, ordinals):
    """NVML's handles of the GPUs this process computes on, named by index or by (a prefix of) their UUID, as CUDA
    takes them. A MIG instance has no energy counter of its own: NVML's counts the whole GPU, which the run would
    claim."""
    try:
        indices = _visible_gpu_indices(ordinals)
        _refuse_fastest_first(pynvml)
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    except NamedDevices as named:
        if any(name.startswith("MIG-") for name in named.names):
            raise LookupError(f"the process computes on a MIG instance ({','.join(named.names)}), and NVML "
                              f"counts the energy of the whole GPU") from None
        every_gpu = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(handle)) for handle in every_gpu]
        handles = []
        for name in named.names:
            found = [handle for handle, uuid in zip(every_gpu, uuids) if uuid.startswith(name)]
            if len(found) != 1:
                raise LookupError(f"CUDA_VISIBLE_DEVICES names {name}, which {len(found)} of the machine's GPUs' "
                                  f"UUIDs start with") from None
            handles += found
        return handles


def _refuse_fastest_first(pynvml):
    """CUDA numbers a machine's GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML by PCI bus: the two
    agree where the GPUs are alike, and on a machine of different GPUs an index could name another GPU than the
    one the process computes on, whose counter the run would claim."""
    if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return
    names = sorted({_text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(pynvml.nvmlDeviceGetCount())})
    if len(names) > 1:
        raise LookupError(f"the machine's GPUs differ ({', '.join(names)}), which CUDA numbers fastest first and "
                          f"NVML by PCI bus (set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name the GPUs by UUID in "
                          f"CUDA_VISIBLE_DEVICES)")


def _refuse_mig(pynvml, handles):
    """`handles`, unless one is a GPU split into MIG instances: a container given an instance (by
    NVIDIA_VISIBLE_DEVICES, with no CUDA_VISIBLE_DEVICES to say so) sees it as device 0, and NVML's index 0 is then
    the whole GPU, whose counter holds the other instances' work too."""
    for handle in handles:
        try:
            current_mode = pynvml.nvmlDeviceGetMigMode(handle)[0]
        except Exception:  # noqa: BLE001 (pynvml.NVMLError_NotSupported: a GPU without MIG)
            continue
        if current_mode == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
            raise LookupError("the GPU is split into MIG instances, one of which the process computes on, and NVML "
                              "counts the energy of the whole GPU")
    return handles


def _text(value):
    """NVML's strings, bytes in older nvidia-ml-py."""
    return value.decode() if isinstance(value, bytes) else value


def is_amd_gpu(name):
    """Whether a GPU so named (torch's and JAX's names on ROCm: 'AMD Instinct MI300X', 'AMD Radeon RX 7900 XTX',
    or its architecture, 'gfx942') is AMD's."""
    return re.search(r"\b(AMD|Instinct|Radeon|gfx\d+[a-f]?)\b", name, re.IGNORECASE) is not None


def _amdsmi_counter(name, ordinals):
    try:
        import amdsmi
    except ImportError:
        return None, "amdsmi is not installed (ROCm's AMD SMI: pip install amdsmi, of the machine's ROCm version)"
    except Exception as error:  # its wrapper loads ROCm's libamd_smi.so as it is imported
        return None, f"amdsmi cannot be imported: {type(error).__name__}: {error}"
    try:
        amdsmi.amdsmi_init()
        every_gpu = amdsmi.amdsmi_get_processor_handles()
        counter = AmdSmiCounter(amdsmi, [every_gpu[i] for i in _visible_amd_gpu_indices(ordinals)])
        counter.read()
    except Exception as error:  # no driver, a GPU without the counter, an index past the machine's GPUs
        return None, f"AMD SMI's energy counter cannot be read on {name}: {type(error).__name__}: {error}"
    return counter, None


class EnergyMeter:
    """Reads a counter at the run's edges and around each timed step, and sums what it read."""

    def __init__(self, counter, reason=None, clock=time.perf_counter):
        self.counter, self.reason, self.clock = counter, reason, clock
        # The run's joules, summed reading by reading: a counter that wraps (RAPL's) wraps between two readings at
        # most once, where the run's start and end may lie several wraps apart.
        self.last_reading, self.run_joules = None, 0.0
        self.read()
        self.run_start_s = clock()

    def read(self):
        if self.counter is None:
            return None
        reading = self.counter.read()
        if self.last_reading is not None:
            self.run_joules += self.counter.difference(self.last_reading, reading)
        self.last_reading = reading
        return reading

    def between(self, before, after):
        """Joules between two readings of this meter; None without a counter."""
        if before is None or after is None:
            return None
        return self.counter.difference(before, after)

    def section(self, history, processes=ONE_PROCESS, resumed_at_steps=()):
        """(the result's `energy` section, `history` with each step's joules summed over the processes): the
        steady steps (those timed apart from compilation and the host-sync probe) and the run so far, from the
        meter's start (once the model is built), over every process of the run (`processes`; every process calls
        this at the same point: the sum is a collective). `resumed_at_steps`: where each --resume continued the
        run; the run's joules are this process's, so its tokens are those of the steps from the last of them."""
        run_end, run_seconds = self.read(), self.clock() - self.run_start_s
        first = max(resumed_at_steps, default=0)
        run_joules = None if run_end is None else self.run_joules
        counted = processes.sum([self.counter is not None, run_joules or 0.0])
        if self.counter is None:
            return {"source": None, "reason": self.reason}, history
        if counted[0] < processes.world_size:
            return {"source": None, "reason": f"{processes.world_size - int(counted[0])} of the run's "
                                              f"{processes.world_size} processes have no energy counter"}, history
        run_joules = counted[1]
        history = joules_of_every_process(history, processes, first)
        # As the timing's steady steps: the host-sync probe's is slowed by its counting, differently on each backend.
        steady = [h for h in history if is_steady(h) and h.get("joules") is not None]
        steady_joules = sum(h["joules"] for h in steady)
        steady_seconds = sum(h["seconds"] for h in steady)
        steady_tokens = sum(h["tokens"] for h in steady)
        run_tokens = sum(h["tokens"] for h in history if h["step"] >= first)
        return {
            "source": self.counter.source,
            "reason": None,
            "counts": self.counter.counts,
            "processes": processes.world_size,
            "clock": "counter read after the device is synchronised, at each timing window's edges and the run's",
            "steady": {"steps": len(steady), "joules": steady_joules,
                       "joules_per_1k_tokens": _per_1k(steady_joules, steady_tokens),
                       "avg_watts": steady_joules / steady_seconds if steady_seconds else None},
            "run": {"joules": run_joules, "seconds": run_seconds,
                    "joules_per_1k_tokens": _per_1k(run_joules, run_tokens),
                    "avg_watts": run_joules / run_seconds if run_seconds else None},
        }, history


def joules_of_every_process(history, processes, first_own_step=0):
    """`history` with the joules of each step from `first_own_step` on (the steps this process trained: it resumed
    there) summed over the processes; the steps before it came from a checkpoint, whose joules were summed when
    it was written (`save_checkpoint`). Every process calls it at the same point (the sum is a collective)."""
    own = [index for index, h in enumerate(history) if h["step"] >= first_own_step]
    sums = processes.sum([history[index].get("joules") or 0.0 for index in own]) if own else []
    summed = list(history)
    for index, joules in zip(own, sums):
        if history[index].get("joules") is not None:
            summed[index] = {**history[index], "joules": float(joules)}
    return summed


def _per_1k(joules, tokens):
    return joules / tokens * 1000 if tokens else None
