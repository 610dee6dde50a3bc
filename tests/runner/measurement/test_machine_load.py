"""The machine's load around a run: read from the OS where it gives it, None where it does not, and the
arithmetic of steal time and of the CPU time other processes took."""

import os
import sys

import pytest

from conftest import run_joined_probes
from mtbench.plugins.api import Launch, ProcessGroup
from mtbench.runner.measurement import load
from mtbench.runner.measurement.load import (LoadSample, cpu_mhz, cpu_ticks, descendant_pids, gpu_compute_processes,
                                             load_average, machine_cpu_seconds, machine_load, other_gpu_processes,
                                             other_processes_percent, own_pids, sample_load, steal_percent)

on_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


@on_linux
def test_a_sample_reads_this_machine():
    sample = sample_load()
    assert len(sample.load_average) == 3 and all(value >= 0 for value in sample.load_average)
    assert set(sample.ticks) == {"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}
    assert sample.ticks["idle"] > 0 and sample.own_cpu_s > 0
    assert sample.cpu_mhz is None or sample.cpu_mhz > 100
    assert sample.record() == {"at": sample.at, "load_average": sample.load_average, "cpu_mhz": sample.cpu_mhz}


@on_linux
def test_the_section_spans_the_time_between_two_samples():
    before = sample_load()
    sum(i * i for i in range(2_000_000))  # this process's own work is not another process's
    after = sample_load()
    section = machine_load(before, after)
    # The work was counted as this process's (the arithmetic that takes it off: the test below).
    assert after.own_cpu_s - before.own_cpu_s > 0.01
    assert section["cores"] == os.cpu_count()
    assert section["before_training"]["at"] <= section["after_training"]["at"]
    assert 0 <= section["other_processes_percent"] <= 100
    assert 0 <= section["steal_percent"] <= 100
    assert machine_load(before, sample_load(), own_processes=2)["other_processes_percent"] is None


def test_the_ticks_of_some_cpus_are_their_own_lines_summed(tmp_path):
    """A measurement pinned to some CPUs counts their time alone: a neighbour elsewhere takes nothing from it."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  30 0 6 300 3 0 0 9\ncpu0 10 0 1 100 1 0 0 3\ncpu1 15 0 2 90 1 0 0 4\n"
                    "cpu2 5 0 3 110 1 0 0 2\nintr 12345\n")
    assert cpu_ticks(str(stat))["user"] == 30
    assert cpu_ticks(str(stat), cpus=[1]) == {"user": 15, "nice": 0, "system": 2, "idle": 90, "iowait": 1, "irq": 0,
                                              "softirq": 0, "steal": 4}
    assert cpu_ticks(str(stat), cpus=[0, 2]) == {"user": 15, "nice": 0, "system": 4, "idle": 210, "iowait": 2,
                                                 "irq": 0, "softirq": 0, "steal": 5}
    assert cpu_ticks(str(stat), cpus=[7]) is None


def test_what_the_os_does_not_give_is_none(tmp_path):
    assert cpu_ticks(str(tmp_path / "no-stat")) is None
    assert cpu_mhz(sysfs=str(tmp_path), cpuinfo=str(tmp_path / "no-cpuinfo")) is None
    old_kernel = tmp_path / "stat"
    old_kernel.write_text("cpu  10 0 5 100 1 0 0\ncpu0 10 0 5 100 1 0 0\n")
    assert cpu_ticks(str(old_kernel))["steal"] is None
    assert steal_percent(cpu_ticks(str(old_kernel)), cpu_ticks(str(old_kernel))) is None
    quiet = LoadSample("t", None, None, None, 1.0)
    assert other_processes_percent(quiet, quiet) is None
    assert machine_load(quiet, quiet)["steal_percent"] is None


def test_load_average_is_rounded_or_none(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (3.91234, 2.0, 1.5))
    assert load_average() == [3.91, 2.0, 1.5]

    def unavailable():
        raise OSError("no load average")
    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert load_average() is None


def test_cpu_clock_prefers_cpufreq_over_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu MHz\t\t: 2600.000\nprocessor\t: 1\ncpu MHz\t\t: 2400.000\n")
    assert cpu_mhz(sysfs=str(tmp_path / "sys"), cpuinfo=str(cpuinfo)) == 2500.0
    for number, khz in enumerate((3_000_000, 1_000_000)):
        folder = tmp_path / "sys" / f"cpu{number}" / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "scaling_cur_freq").write_text(f"{khz}\n")
    assert cpu_mhz(sysfs=str(tmp_path / "sys"), cpuinfo=str(cpuinfo)) == 2000.0


def ticks(user=0, system=0, idle=0, iowait=0, steal=0):
    return {"user": user, "nice": 0, "system": system, "idle": idle, "iowait": iowait, "irq": 0, "softirq": 0,
            "steal": steal}


def test_steal_and_other_processes_are_shares_of_the_cpus_time():
    # 1000 ticks pass on all CPUs: 600 busy, 300 idle, 100 stolen; this process used 2 s = 200 ticks of them.
    before = LoadSample("t0", [1.0, 1.0, 1.0], None, ticks(user=1000, idle=5000), 10.0)
    after = LoadSample("t1", [3.9, 2.0, 1.0], None, ticks(user=1500, system=100, idle=5300, steal=100), 12.0)
    assert steal_percent(before.ticks, after.ticks) == 10.0
    assert other_processes_percent(before, after, ticks_per_s=100) == 40.0
    # This process alone kept the CPUs busy: nobody else took anything.
    alone = LoadSample("t1", None, None, ticks(user=1600, idle=5400), 16.0)
    assert other_processes_percent(before, alone, ticks_per_s=100) == 0.0


def test_a_machines_processes_add_their_cpu_time_and_no_other_machines(monkeypatch):
    # Two machines of two processes each, as torchrun numbers them: ranks 0 and 1 on the first, 2 and 3 on the second.
    cpu_s = [1.0, 2.0, 4.0, 8.0]

    def gathered(processes, value):  # every process's own seconds, as the gather over the four hands them out
        assert value == cpu_s[processes.rank]
        return list(cpu_s)

    monkeypatch.setattr(load, "every_process", gathered)
    for rank, local_rank, machine_s in [(0, 0, 3.0), (1, 1, 3.0), (2, 0, 12.0), (3, 1, 12.0)]:
        before = LoadSample("t0", None, None, None, 100.0)
        after = LoadSample("t1", None, None, None, 100.0 + cpu_s[rank])
        launch = Launch(process_id=rank, num_processes=4, local_rank=local_rank, local_processes=2)
        assert machine_cpu_seconds(before, after, ProcessGroup(launch), launch) == machine_s
    # One process: its own.
    monkeypatch.undo()
    assert machine_cpu_seconds(before, after, ProcessGroup(Launch()), Launch()) == 8.0


def test_the_run_processes_cpu_time_is_not_another_processes():
    # 1000 ticks pass on all CPUs, 600 of them busy: this process used 1 s (100 ticks), the run's other process on
    # the machine 4 s (400 ticks): 10 % was another job's, not 50 %.
    before = LoadSample("t0", None, None, ticks(user=1000, idle=5000), 10.0)
    after = LoadSample("t1", None, None, ticks(user=1600, idle=5400), 11.0)
    assert other_processes_percent(before, after, ticks_per_s=100) == 50.0
    assert other_processes_percent(before, after, ticks_per_s=100, own_cpu_s=5.0) == 10.0
    section = machine_load(before, after, own_processes=2, run_cpu_s=5.0)
    assert section["run_processes_cpu_s"] == 5.0 and section["other_processes_percent"] is not None
    unknown = machine_load(before, after, own_processes=2)
    assert unknown["other_processes_percent"] is None and unknown["run_processes_cpu_s"] is None


@on_linux
def test_two_processes_of_a_run_count_each_others_cpu_time_as_the_runs():
    """Two processes joined over gloo take their samples together: process 1 spins for a second between them while
    process 0 waits; both count that second as the run's, not another process's."""
    first, second = run_joined_probes("machine_load_probe.py")
    assert second["spun_s"] >= 1.0 and first["own_cpu_s"] < 0.5
    for probe in (first, second):
        section = probe["section"]
        assert section["run_processes_cpu_s"] >= second["spun_s"]
        assert 0 <= section["other_processes_percent"] <= 100
    assert first["section"]["run_processes_cpu_s"] == second["section"]["run_processes_cpu_s"]


@on_linux
def test_the_work_of_the_processes_a_run_started_is_its_own():
    """torch.compile's compile workers run beside the process: their CPU time is the run's, counted while they
    run, once they have ended and once they were waited for, not another process's."""
    import subprocess
    import time

    from mtbench.runner.measurement.load import own_cpu_seconds
    before = own_cpu_seconds()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
                                                   "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        for _ in range(100):  # until its half second of work is done (it then sleeps, still running)
            time.sleep(0.1)
            if own_cpu_seconds() - before >= 0.5:
                break
        assert own_cpu_seconds() - before >= 0.5  # a child still running
    finally:
        busy.kill()
    busy.wait()
    assert own_cpu_seconds() - before >= 0.5  # ended and waited for: getrusage's children


def fake_nvidia_smi(tmp_path, listing, exit_code=0):
    """An executable that answers nvidia-smi's compute-apps query with `listing` (and `exit_code`), and records
    the arguments it was called with beside it."""
    script = tmp_path / "nvidia-smi"
    (tmp_path / "listing.csv").write_text(listing)
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\ncat "{tmp_path}/listing.csv"\nexit {exit_code}\n')
    script.chmod(0o755)
    return str(script)


@on_linux  # the fake nvidia-smi is a shell script
def test_other_processes_on_the_runs_gpu_are_told_apart_from_its_own_and_other_gpus(tmp_path):
    own = os.getpid()
    smi = fake_nvidia_smi(tmp_path, f"GPU-A, {own}, /usr/bin/python3, 1024\n"
                                    "GPU-A, 4242, /opt/conda/bin/python3, 20480\n"
                                    "GPU-B, 5151, /usr/bin/java, 512\n")
    listed = gpu_compute_processes(smi)
    assert (tmp_path / "args").read_text().split() == [
        "--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"]
    assert listed == [{"gpu_uuid": "GPU-A", "pid": own, "name": "/usr/bin/python3", "used_memory_mib": 1024},
                      {"gpu_uuid": "GPU-A", "pid": 4242, "name": "/opt/conda/bin/python3", "used_memory_mib": 20480},
                      {"gpu_uuid": "GPU-B", "pid": 5151, "name": "/usr/bin/java", "used_memory_mib": 512}]
    # GPU-B's process is on another GPU, not the run's.
    assert other_gpu_processes(listed, own_pids()) == [
        {"pid": 4242, "name": "/opt/conda/bin/python3", "used_memory_mib": 20480}]
    # GPU-A's processes both the run's: nothing else on its GPU, whatever computes on GPU-B.
    assert other_gpu_processes(listed, {own, 4242}) == []
    # The run also on GPU-B (a rank there): GPU-A's other process is still another's.
    assert [p["pid"] for p in other_gpu_processes(listed, {own, 5151})] == [4242]


@on_linux
def test_a_listing_that_cannot_be_matched_to_the_run_says_unknown(tmp_path):
    """A container's nvidia-smi lists the host's pids: none is the run's, and a list would be a false alarm."""
    smi = fake_nvidia_smi(tmp_path, "GPU-A, 4242, python3, 20480\nGPU-B, 5151, java, 512\n")
    listed = gpu_compute_processes(smi)
    assert [p["pid"] for p in listed] == [4242, 5151]
    assert other_gpu_processes(listed, own_pids()) is None
    assert other_gpu_processes(None, own_pids()) is None


@on_linux
def test_nvidia_smi_missing_or_failing_gives_none(tmp_path):
    assert gpu_compute_processes(str(tmp_path / "no-nvidia-smi")) is None
    failing = fake_nvidia_smi(tmp_path, f"GPU-A, {os.getpid()}, python3, 1024\n", exit_code=1)
    assert gpu_compute_processes(failing) is None
    hanging = tmp_path / "hanging-nvidia-smi"
    hanging.write_text("#!/bin/sh\nexec sleep 30\n")
    hanging.chmod(0o755)
    assert gpu_compute_processes(str(hanging), timeout_s=0.5) is None


@on_linux
def test_the_listing_is_parsed_robustly(tmp_path):
    smi = fake_nvidia_smi(tmp_path, "No running processes found\n"
                                    "GPU-A, 4242, python3, [N/A]\n"
                                    "GPU-A, [N/A], ghost, 10\n"
                                    "\n"
                                    "GPU-A, 77, my,odd name, 300\n")
    assert gpu_compute_processes(smi) == [
        {"gpu_uuid": "GPU-A", "pid": 4242, "name": "python3", "used_memory_mib": None},
        {"gpu_uuid": "GPU-A", "pid": 77, "name": "my,odd name", "used_memory_mib": 300}]
    assert gpu_compute_processes(fake_nvidia_smi(tmp_path, "")) == []


@on_linux
def test_a_sample_records_the_other_gpu_processes_only_where_nvidia_smi_is_installed(tmp_path, monkeypatch):
    smi = fake_nvidia_smi(tmp_path, f"GPU-A, {os.getpid()}, python3, 1024\nGPU-A, 4242, python3, 20480\n")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert sample_load(nvidia_smi="nvidia-smi").gpu_others == [
        {"pid": 4242, "name": "python3", "used_memory_mib": 20480}]
    assert sample_load(nvidia_smi=smi).gpu_others == [{"pid": 4242, "name": "python3", "used_memory_mib": 20480}]
    assert sample_load(nvidia_smi="no-such-nvidia-smi").gpu_others is None


def test_the_section_lists_each_other_gpu_process_once_with_when_it_was_seen():
    def sample(gpu_others):
        return LoadSample("t", None, None, None, 1.0, gpu_others)
    began = [{"pid": 4242, "name": "python3", "used_memory_mib": 1024},
             {"pid": 77, "name": "java", "used_memory_mib": None}]
    ended = [{"pid": 4242, "name": "python3", "used_memory_mib": 20480},
             {"pid": 99, "name": "", "used_memory_mib": 8}]
    assert machine_load(sample(began), sample(ended))["gpu_other_processes"] == [
        {"pid": 4242, "name": "python3", "used_memory_mib": 20480, "seen": "both"},
        {"pid": 77, "name": "java", "used_memory_mib": None, "seen": "before"},
        {"pid": 99, "name": "", "used_memory_mib": 8, "seen": "after"}]
    assert machine_load(sample(None), sample(ended[1:]))["gpu_other_processes"] == [
        {"pid": 99, "name": "", "used_memory_mib": 8, "seen": "after"}]
    assert machine_load(sample([]), sample([]))["gpu_other_processes"] == []
    assert machine_load(sample(None), sample(None))["gpu_other_processes"] is None
    quiet = LoadSample("t", None, None, None, 1.0)  # made as before the GPU was looked at
    assert machine_load(quiet, quiet)["gpu_other_processes"] is None


@on_linux
def test_the_processes_a_run_started_are_its_own():
    import subprocess
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert sleeper.pid in descendant_pids(os.getpid())
        assert sleeper.pid in own_pids()
        assert sleeper.pid not in descendant_pids(sleeper.pid)
        # Ranks a launcher started: its (this process's parent's) descendants, this process among them.
        launched = own_pids(own_processes=2)
        assert {os.getppid(), os.getpid(), sleeper.pid} <= launched
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sleeper.pid not in descendant_pids(os.getpid())  # waited for: gone from /proc
