"""`--profile N`: the backend's own profiler traces N steady steps, which the trace names one by one, which hold the
step's work, which are timed apart from the figures, and which train as unprofiled steps do."""

import collections
import gzip
import json
import os
import re

import pytest

from conftest import CPU_ONLY, TINY_COMPARE, run_cli
from result_keys import undocumented_keys

PROFILED = 4
STEP_EVENT = re.compile(r"^mtbench train step (\d+)$")


def trace_events(profile):
    """The events of the trace's Perfetto/Chrome file: torch's trace.json, JAX's perfetto_trace.json.gz."""
    names = [name for name in profile["files"] if name.endswith(("trace.json", "perfetto_trace.json.gz"))]
    assert len(names) == 1, profile["files"]
    path = os.path.join(profile["directory"], names[0])
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_profiled_steps_are_traced_one_by_one_timed_apart_and_train_as_unprofiled_ones(backend, cpu_compared_runs,
                                                                                        cache_dir, tmp_path):
    out = str(tmp_path / "profiled.json")
    # Timing windows shorter than the profile: its steps still share one window.
    proc = run_cli("train", "--backend", backend, *TINY_COMPARE, "--profile", str(PROFILED), "--timing-window", "2",
                   "--measure-only", "--cache-dir", cache_dir, "--out", out, env=CPU_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        result = json.load(f)
    history, profile = result["history"], result["profile"]

    # The first steady steps after the host-wait probe's, all asked for, in one window of their own.
    probe = [h["step"] for h in history if h.get("host_sync_probe")]
    profiled = [h for h in history if h.get("profiled")]
    assert [h["step"] for h in profiled] == profile["steps"] == list(range(probe[0] + 1, probe[0] + 1 + PROFILED))
    assert profile["asked"] == PROFILED and {h["window_steps"] for h in profiled} == {PROFILED}
    assert profile["directory"].startswith(out.removesuffix(".json") + ".run" + os.sep + "profile")

    # The trace names each profiled step once, and holds the step's own work.
    events = trace_events(profile)
    steps = collections.Counter(int(m.group(1)) for e in events if (m := STEP_EVENT.match(str(e.get("name", "")))))
    assert steps == {step: 1 for step in profile["steps"]}
    names = collections.Counter(str(e.get("name", "")) for e in events)
    if backend == "torch":
        assert sum(names[op] for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")) >= PROFILED
    else:  # the jitted step, dispatched once a step
        assert sum(count for name, count in names.items() if name.startswith("PjitFunction")) >= PROFILED

    # Where the profiled window's time went, read from the trace: on a CPU the host's operators (torch's aten ops,
    # JAX's XLA ops), each called as often as the trace holds it, once a step or more, for no longer than it ran.
    operations = profile["operations"]
    assert operations["on"] == "host" and "kinds" not in operations   # a host's operators are not sorted by name
    assert operations["window_s"] == pytest.approx(sum(h["seconds"] for h in profiled), rel=1e-6)
    assert 0 < operations["busy_s"] <= operations["window_s"] and operations["busy_share"] <= 1
    top = operations["top"]
    assert [t["seconds"] for t in top] == sorted((t["seconds"] for t in top), reverse=True)
    assert sum(t["share"] for t in top) <= 1 + 1e-9
    durations = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and (e.get("cat") == "cpu_op" if backend == "torch" else "hlo_op" in e.get("args", {})):
            durations[e["name"]].append(e["dur"] / 1e6)
    for t in top:
        assert t["calls"] == len(durations[t["name"]]) and t["calls"] % PROFILED == 0, t
        assert 0 < t["seconds"] <= sum(durations[t["name"]]) + 1e-9, t
    if backend == "torch":
        assert "aten::mm" in [t["name"] for t in top[:3]]

    # Timed apart: in no steady figure, nor in the training time.
    warmups = [h for h in history if h["first_of_shape"]]
    assert result["timing"]["steady_steps"] == len(history) - len(warmups) - len(probe) - PROFILED
    assert result["timing"]["profiled_s"] > 0
    assert f"profile   steps {profile['steps'][0]}-{profile['steps'][-1]} ({PROFILED} of {PROFILED} asked)" in \
        proc.stdout
    per_step = operations["busy_s"] / PROFILED
    assert f"profile   host busy {per_step * 1e3:.1f} ms a step " \
           f"({per_step / result['timing']['step_s_median'] * 100:.0f} % of a steady step; " \
           f"{operations['busy_share'] * 100:.0f} % of the profiled window); longest: {top[0]['name']} " in proc.stdout

    assert undocumented_keys(result) == []
    table = run_cli("report", out, "--report", "table", env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert any("profile (--profile)" in line and f"steps {profile['steps'][0]}-" in line
               for line in table.stdout.splitlines()), table.stdout
    assert f"profile of {backend}: steps {profile['steps'][0]}-{profile['steps'][-1]} in {profile['directory']}" in \
        table.stdout.replace("\n", "")
    assert any("profiled steps' time" in line and "host busy" in line for line in table.stdout.splitlines())

    # Trained as unprofiled steps: the losses of the same run without --profile.
    unprofiled = cpu_compared_runs[backend]["result"]["history"]
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in unprofiled], rel=1e-6)


@pytest.mark.slow
def test_a_run_without_a_steady_step_left_says_so(cache_dir, tmp_path):
    out = str(tmp_path / "short.json")
    proc = run_cli("train", "--backend", "jax", "--model", "gpt", "--preset", "tiny", "--block-size", "16",
                   "--steps", "2", "--profile", "3", "--measure-only", "--cache-dir", cache_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        result = json.load(f)
    assert [h["step"] for h in result["history"] if h.get("profiled")] == []
    assert result["profile"]["steps"] == [] and "no steady step was left" in result["profile"]["why_not"]
    assert "profile   none: no steady step was left to profile" in proc.stdout
    assert not os.path.exists(out.removesuffix(".json") + ".run/profile")
    assert undocumented_keys(result) == []
