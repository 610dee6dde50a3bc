"""How busy the machine was around a run: its load average and the CPUs' clock as training begins and as it ends,
and between the two the share of the CPUs' time that other processes used and that a hypervisor gave to other
guests (steal). Runs of a comparison train one after the other, so a burst of another job's load lands on one of
them: these figures let the result say so. Whatever the OS does not give (/proc/stat outside Linux, a CPU clock on
most macOS machines) is None.

The load average is a moving average over a minute: it counts this run's own threads and, right after another
run, that run's too. The CPU time other processes used while this run trained, from /proc/stat less the run's processes'
on the machine (each one's own and its descendants', getrusage and /proc), is what tells a loaded machine from a
busy run.

On a GPU the contention that matters most is another process on the run's GPU: nvidia-smi's compute
processes, as training begins and as it ends, tell those on the GPUs where the run's own processes are listed."""

import datetime
import glob
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass

from mtbench.runner.measurement.gathered import every_process

# /proc/stat's aggregate "cpu" line: time in USER_HZ ticks since boot, in this order (guest time is already
# counted in user and nice, so it is left out of the total).
PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def load_average():
    """[1, 5, 15 minute] load averages of the host, or None where the OS reports none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_ticks(path="/proc/stat", cpus=None):
    """{PROC_STAT_FIELDS name: ticks since boot} of all CPUs together (of those numbered in `cpus` where given), or
    None where there is no /proc/stat (or it lists none of `cpus`). Kernels before 2.6.11 give no steal field: it
    reads None."""
    names = {"cpu"} if cpus is None else {f"cpu{cpu}" for cpu in cpus}
    try:
        with open(path, encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return None
    found = [[int(value) for value in fields[1:len(PROC_STAT_FIELDS) + 1]] for fields in lines
             if fields and fields[0] in names]
    if not found:
        return None
    return {name: None if any(len(values) <= index for values in found) else sum(values[index] for values in found)
            for index, name in enumerate(PROC_STAT_FIELDS)}


def cpu_mhz(sysfs="/sys/devices/system/cpu", cpuinfo="/proc/cpuinfo"):
    """The CPUs' mean current clock in MHz: cpufreq's scaling_cur_freq (kHz) where the kernel exposes it, else the
    'cpu MHz' lines of /proc/cpuinfo (many virtual machines give only those, often the nominal clock); None
    where neither exists."""
    clocks = []
    for path in glob.glob(os.path.join(sysfs, "cpu[0-9]*", "cpufreq", "scaling_cur_freq")):
        try:
            with open(path, encoding="ascii") as f:
                clocks.append(int(f.read()) / 1000)
        except (OSError, ValueError):
            continue
    if not clocks:
        try:
            with open(cpuinfo, encoding="utf-8", errors="replace") as f:
                clocks = [float(line.split(":", 1)[1]) for line in f if line.lower().startswith("cpu mhz")]
        except (OSError, ValueError, IndexError):
            clocks = []
    return round(sum(clocks) / len(clocks), 1) if clocks else None


@dataclass
class LoadSample:
    """The machine's load at one moment."""
    at: str              # ISO 8601, local time with its offset
    load_average: list   # [1, 5, 15 minute], or None
    cpu_mhz: float       # or None
    ticks: dict          # cpu_ticks(), or None
    own_cpu_s: float     # CPU seconds this process and those it started have used (`own_cpu_seconds`)
    gpu_others: list = None  # `other_gpu_processes()` on the run's GPUs; None: unknown, or no GPU

    def record(self):
        return {"at": self.at, "load_average": self.load_average, "cpu_mhz": self.cpu_mhz}


def own_cpu_seconds(proc="/proc"):
    """CPU seconds this process and the processes it started have used: its own threads', its children's that
    ended (getrusage), and those of its descendants still running or not yet waited for (/proc; torch.compile's
    compile workers run beside the process, and their work is the run's, not another job's)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage) + descendants_cpu_seconds(os.getpid(), proc)


def descendant_pids(pid, proc="/proc"):
    """The pids of the processes below `pid` that /proc lists (running, or ended and not yet waited for), children
    before grandchildren; empty where /proc does not list them. A process's children are listed per thread (each
    thread's `children` file names those it started), so every thread's is read."""
    found, pending, seen = [], [pid], {pid}
    while pending:
        parent = pending.pop()
        for children in glob.glob(f"{proc}/{parent}/task/*/children"):
            try:
                with open(children) as f:
                    listed = [int(child) for child in f.read().split()]
            except OSError:  # the thread or the process ended meanwhile
                continue
            for child in listed:
                if child not in seen:
                    seen.add(child)
                    pending.append(child)
                    found.append(child)
    return found


def descendants_cpu_seconds(pid, proc="/proc"):
    """CPU seconds of the processes below `pid` still in /proc (running, or ended and not yet waited for): each
    one's own and its ended children's (stat's utime, stime, cutime, cstime); 0 where /proc does not list them."""
    total, ticks = 0.0, os.sysconf("SC_CLK_TCK")
    for child in descendant_pids(pid, proc):
        try:
            with open(f"{proc}/{child}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15]) / ticks  # utime, stime, cutime, cstime
    return total


def own_pids(own_processes=1, proc="/proc"):
    """The pids of the run's processes on this machine: this process and its descendants (compile workers) or,
    where the run has several local processes, which a launcher started, the launcher and all below it."""
    root = os.getpid() if own_processes <= 1 else os.getppid()
    return {os.getpid(), root, *descendant_pids(root, proc)}


def gpu_compute_processes(nvidia_smi="nvidia-smi", timeout_s=5):
    """The compute processes on the machine's NVIDIA GPUs, as nvidia-smi lists them: one {gpu_uuid, pid, name,
    used_memory_mib} each (memory null where nvidia-smi gives none, "[N/A]" under some drivers and in
    containers); None where nvidia-smi is missing, fails or hangs (a wedged driver: the run must not wait on
    it)."""
    try:
        query = subprocess.Popen([nvidia_smi, "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                                  "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    try:
        listed, _ = query.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        query.kill()
        try:  # one stuck in the kernel on a wedged driver does not die: it is left behind, not waited for
            query.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        return None
    if query.returncode != 0:
        return None
    processes = []
    for line in listed.splitlines():
        raw = line.split(",")
        fields = [field.strip() for field in raw]
        if len(fields) < 4:  # "No running processes found" and the like
            continue
        try:
            pid = int(fields[1])
        except ValueError:
            continue
        try:
            memory = int(float(fields[-1]))
        except ValueError:
            memory = None
        # A process name holding commas spans several fields: the memory is the last.
        processes.append({"gpu_uuid": fields[0], "pid": pid, "name": ",".join(raw[2:-1]).strip(),
                          "used_memory_mib": memory})
    return processes


def other_gpu_processes(processes, pids):
    """Of `gpu_compute_processes()`, those not among `pids` (the run's own) on a GPU where one of `pids` is listed,
    as {pid, name, used_memory_mib}; None where none of `pids` is listed: the run computes on no GPU, or
    nvidia-smi sees another PID namespace (a container's), where the run's processes cannot be told apart and a
    list would be a false alarm."""
    if processes is None:
        return None
    gpus = {process["gpu_uuid"] for process in processes if process["pid"] in pids}
    if not gpus:
        return None
    return [{key: process[key] for key in ("pid", "name", "used_memory_mib")} for process in processes
            if process["gpu_uuid"] in gpus and process["pid"] not in pids]


def sample_load(own_processes=1, nvidia_smi="nvidia-smi", cpus=None):
    """The machine's load now; `own_processes` as `machine_load`'s. nvidia-smi runs only where it is installed
    (elsewhere a subprocess would only find what `shutil.which` does, that there is no NVIDIA GPU), and not at all
    with `nvidia_smi=None` (a measurement on the CPU). `cpus`: the CPUs whose time to count (`cpu_ticks`), all by
    default."""
    sample = LoadSample(datetime.datetime.now().astimezone().isoformat(timespec="seconds"), load_average(),
                        cpu_mhz(), cpu_ticks(cpus=cpus), own_cpu_seconds())
    if nvidia_smi and shutil.which(nvidia_smi) is not None:
        sample.gpu_others = other_gpu_processes(gpu_compute_processes(nvidia_smi), own_pids(own_processes))
    return sample


def gpu_other_processes(before, after):
    """The other processes on the run's GPUs in either of two samples' `gpu_others`, once each by pid, with when
    they were seen ("before", "after" or "both") and the larger memory; None where neither sample knows."""
    if before is None and after is None:
        return None
    merged = {}
    for moment, processes in (("before", before), ("after", after)):
        for process in processes or []:
            seen = merged.get(process["pid"])
            if seen is None:
                merged[process["pid"]] = {**process, "seen": moment}
                continue
            seen["seen"] = "both" if seen["seen"] != moment else moment
            memories = [m for m in (seen["used_memory_mib"], process["used_memory_mib"]) if m is not None]
            seen["used_memory_mib"] = max(memories) if memories else None
            seen["name"] = seen["name"] or process["name"]
    return list(merged.values())


def _elapsed_ticks(before, after):
    return sum(after[name] - before[name] for name in PROC_STAT_FIELDS if after[name] is not None)


def steal_percent(before, after):
    """The share of all CPUs' time between two `cpu_ticks()` that the hypervisor gave to other guests (steal), in
    percent; None where the OS counts no steal time or no time passed."""
    if not before or not after or before.get("steal") is None or after.get("steal") is None:
        return None
    total = _elapsed_ticks(before, after)
    return round(100 * (after["steal"] - before["steal"]) / total, 2) if total > 0 else None


def other_processes_percent(before, after, ticks_per_s=None, own_cpu_s=None):
    """The share of all CPUs' time between two `LoadSample`s that processes other than this one used (busy
    time from /proc/stat less this process's CPU time, or less `own_cpu_s`: the CPU seconds of every process of
    the run on the machine, `machine_cpu_seconds`), in percent; None without /proc/stat."""
    if not before.ticks or not after.ticks:
        return None
    total = _elapsed_ticks(before.ticks, after.ticks)
    if total <= 0:
        return None
    busy = total - sum(after.ticks[name] - before.ticks[name] for name in ("idle", "iowait", "steal")
                       if after.ticks[name] is not None)
    own = after.own_cpu_s - before.own_cpu_s if own_cpu_s is None else own_cpu_s
    return round(max(0.0, 100 * (busy - own * (ticks_per_s or os.sysconf("SC_CLK_TCK"))) / total), 2)


def machine_load(before, after, own_processes=1, run_cpu_s=None):
    """The result's `machine_load` section from the samples taken as training began and as it ended: the cores
    the load average is measured against, each sample, and in between the CPU time other processes took and the
    steal time, and the other processes holding a context on the run's GPUs. `own_processes`: the run's processes
    on this machine; `run_cpu_s`: the CPU seconds they used between their samples (`machine_cpu_seconds`), without
    which, where there are several, other processes' time is not told apart from theirs (None)."""
    if run_cpu_s is None and own_processes == 1:
        run_cpu_s = after.own_cpu_s - before.own_cpu_s
    return {"cores": os.cpu_count(), "before_training": before.record(), "after_training": after.record(),
            "other_processes_percent": None if run_cpu_s is None else other_processes_percent(
                before, after, own_cpu_s=run_cpu_s),
            "run_processes_cpu_s": None if run_cpu_s is None else round(run_cpu_s, 3),
            "steal_percent": steal_percent(before.ticks, after.ticks),
            "gpu_other_processes": gpu_other_processes(before.gpu_others, after.gpu_others)}


def sample_load_together(processes, own_processes=1, nvidia_smi="nvidia-smi"):
    """`sample_load` taken by every process of a run at one moment (after a barrier), so that each one's CPU time
    between two such samples spans the interval the others' do. Every process must call it at the same point."""
    if processes.world_size > 1:
        processes.barrier()
    return sample_load(own_processes, nvidia_smi)


def machine_cpu_seconds(before, after, processes, launch):
    """The CPU seconds that the run's processes on this machine used between their samples `before` and `after`
    (`sample_load_together`'s; each process's own and its descendants'), summed over them: launchers number a
    machine's processes one after another, from this process's rank less its local rank. Every process must call
    it at the same point."""
    each = every_process(processes, after.own_cpu_s - before.own_cpu_s)
    first = processes.rank - launch.local_rank
    return sum(each[first:first + launch.local_processes])


def machine_load_of_run(before, processes, launch, nvidia_smi="nvidia-smi"):
    """The run's `machine_load` section, from `before` (`sample_load_together`'s as training began) and a sample
    every process takes now, other processes' CPU time told apart from all of the run's processes' on this
    machine. Every process must call it at the same point."""
    after = sample_load_together(processes, launch.local_processes, nvidia_smi)
    return machine_load(before, after, launch.local_processes, machine_cpu_seconds(before, after, processes, launch))
