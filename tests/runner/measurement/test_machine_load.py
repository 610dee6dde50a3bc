"""The machine's load around a run: read from the OS where it gives it, None where it does not, and the
arithmetic of steal time and of the CPU time other processes took."""

import os
import sys

import pytest

from mtbench.runner.measurement.load import (LoadSample, cpu_mhz, cpu_ticks, load_average, machine_load,
                                             other_processes_percent, sample_load, steal_percent)

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
