"""The host's environment as a result records it: the CPU time a control group allows (a container's --cpus), read
from cgroup v2 and v1 as the kernel lays them out, and named in the hardware a run is identified by."""

import pytest

from mtbench.figures import hardware
from mtbench.runner.measurement.environment import cpu_quota, host_environment


def cgroups(tmp_path, membership, files):
    """A /sys/fs/cgroup of `files` ({path under it: text}) and a /proc/self/cgroup of `membership`."""
    for name, text in files.items():
        path = tmp_path / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "membership").write_text(membership)
    return {"cgroups": str(tmp_path / "cgroup"), "membership": str(tmp_path / "membership")}


@pytest.mark.parametrize("membership, files, expected", [
    # v2, a container's view: its group is the mount's root
    ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    # v2 on a host: the process's own group
    ("0::/ci.slice/job-7\n", {"ci.slice/job-7/cpu.max": "200000 100000\n", "cpu.max": "max 100000\n"}, 2.0),
    # v1, the controllers mounted together and apart (this project's machines: `-1`, none)
    ("4:cpu,cpuacct:/docker/abc\n2:memory:/docker/abc\n",
     {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"},
     0.5),
    ("1:cpu:/\n2:cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ("0::/\n", {}, None),  # no controller files (another OS's layout)
])
def test_a_control_groups_quota_is_read_in_cpus(tmp_path, membership, files, expected):
    assert cpu_quota(**cgroups(tmp_path, membership, files)) == expected


def test_a_quota_below_the_cores_is_part_of_the_hardware_a_run_is_held_to():
    """Two CI containers of one 8-core machine given --cpus 2 and --cpus 8 were one machine to the gate."""
    env = {"device": {"kind": "cpu", "name": "AMD EPYC"}, "cpu_count": 8, "cpu_quota": 2.0}
    assert hardware({"env": env}) == "AMD EPYC, 8 cores (a quota of 2 CPUs)"
    assert hardware({"env": {**env, "cpu_quota": 8.0}}) == hardware({"env": {**env, "cpu_quota": None}}) == \
        "AMD EPYC, 8 cores"
    assert hardware({"env": {**env, "cpu_count": 1, "cpu_quota": None}}) == "AMD EPYC, 1 core"
    assert "cpu_quota" in host_environment()  # recorded with every result, null where none is set
