"""`pytest --cpu-costs FILE`: each test's CPU seconds, appended to FILE as one JSON line a test, for finding where
the suite's time goes. On a machine whose cores are busy all the time (two xdist workers on two cores), a test's
wall time says little: a two-process test takes CPU from the other worker, a test that waits takes none. This counts
what each test spent itself (`self_s`, its worker's process) and in the processes it started and waited for
(`children_s`: every `mtbench` run, probe and torchrun launch, with their own children), its fixtures' set-up
included (a shared run is counted by the test that made it). Records from every worker go to the same file."""

import json
import os
import resource
import time

import pytest


def pytest_addoption(parser):
    parser.addoption("--cpu-costs", metavar="FILE", default=None,
                     help="append each test's CPU seconds (its own and those of the processes it waited for) to "
                          "FILE, a JSON line a test")


def cpu_seconds(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-costs")
    if not path:
        return (yield)
    own, children = cpu_seconds(resource.RUSAGE_SELF), cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        # A worker's id from its session (its processes' environment may be an outer session's worker's).
        record = {"test": item.nodeid, "worker": getattr(item.config, "workerinput", {}).get("workerid", "main"),
                  "wall_s": round(time.perf_counter() - started, 3),
                  "self_s": round(cpu_seconds(resource.RUSAGE_SELF) - own, 3),
                  "children_s": round(cpu_seconds(resource.RUSAGE_CHILDREN) - children, 3)}
        # One write to a file opened for appending: the workers' lines do not interleave.
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, (json.dumps(record) + "\n").encode())
        finally:
            os.close(descriptor)
