"""Runs of several processes in a comparison: named with their process count, and set against the one-process
run they scale (`compare --matrix 'torch;torch+ddp@2'` runs them; `report` reads their results)."""

import copy
import csv
import io
import json

import pytest

from conftest import run_cli
from mtbench import MtbenchError
from mtbench.plugins import manager
from mtbench.runner.orchestration.environments import check_runs
from mtbench.runner.orchestration.runs import RunSpec, parse_run_spec
from mtbench.runner.results.report import SCALING_TITLE, ideal_speedup


def two_process_copy(result, extra, tokens_factor, device_kind, machines):
    """`result` as if `extra` had trained it over 2 processes (one device each) on `machines`, `tokens_factor` times as
    fast; both on a `device_kind` (`result` changed in place to one device of that kind)."""
    result["env"]["device"]["kind"], result["devices_used"] = device_kind, 1
    result["utilization"]["peak_devices"] = 1
    scaled = copy.deepcopy(result)
    scaled["extras"] = [*scaled["extras"], extra]
    scaled["processes"] = {"world_size": 2, "processes": 2, "devices_per_process": 1, "launcher": "torchrun",
                           "collectives": "gloo", "coordinator": "localhost:29500", "spanned_by": [extra],
                           "machines": machines}
    scaled["devices_used"] = 2
    scaled["utilization"]["peak_devices"] = machines if device_kind == "cpu" else 2  # as the run records it
    if device_kind == "gpu":  # the backend's device count: every GPU one process sees, or JAX's of the run's processes
        result["env"]["device"]["count"], scaled["env"]["device"]["count"] = 8, 2
    scaled["timing"]["tokens_per_s"] *= tokens_factor
    for entry in scaled["history"]:  # the timed steps too, whose windows speed-ups and scaling read
        entry["seconds"] /= tokens_factor
    return scaled


# 1.5x the tokens/s of one process, on 2 processes: 75 % of linear scaling over 2 GPUs or 2 machines' CPUs; on the
# CPUs of one machine, which the 2 processes share, 150 % of the one process's.
@pytest.mark.parametrize("device_kind, machines, ideal, efficiency", [("gpu", 1, 2, 0.75), ("cpu", 2, 2, 0.75),
                                                                       ("cpu", 1, 1, 1.5)])
def test_report_sets_a_two_process_run_against_its_one_process_run_on_the_devices_they_use(
        tiny_runs, tmp_path, device_kind, machines, ideal, efficiency):
    one = copy.deepcopy(tiny_runs["torch"]["result"])
    two = two_process_copy(one, "ddp", 1.5, device_kind, machines)
    paths = []
    for name, result in (("one", one), ("two", two), ("jax", tiny_runs["jax"]["result"])):
        paths.append(str(tmp_path / f"{name}.json"))
        with open(paths[-1], "w") as f:
            json.dump(result, f)
    proc = run_cli("report", *paths, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["scaling"] == {"torch+ddp@2": {"processes": 2, "devices": 2, "against": "torch",
                                                 "ideal_speedup": ideal, "efficiency": pytest.approx(efficiency),
                                                 "above_ideal": efficiency > 1}}
    assert [entry["processes"] for entry in report["summary"]] == [1, 2, 1]
    if device_kind == "gpu":  # the GPUs each run trained on, not the count its backend reported (8, 2)
        name = one["env"]["device"]["name"]
        assert [entry["hardware"] for entry in report["summary"][:2]] == [f"1x {name}", f"2x {name}"]
    proc = run_cli("report", *paths, "--format", "markdown")
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| scaling efficiency"))
    flag = ": above the ideal, distrust it (see the warnings row)" if efficiency > 1 else ""
    assert [cell.strip() for cell in row.strip("|").split("|")] == [
        "scaling efficiency (of the one-process run's tokens/s x the ratio of devices)", "",
        f"{efficiency:.0%} of {ideal}x torch{flag}", ""]
    for result in (one, two):  # results from before the peak's devices were recorded: the same rule on the devices
        del result["utilization"]["peak_devices"]
    assert ideal_speedup(two, one) == ideal


def test_a_scaling_efficiency_above_the_ideal_is_warned_of_beside_the_runs_other_warnings(tiny_runs):
    """2 processes on one machine's CPU at 1.5x the one process's tokens/s: 150 % of the ideal (they share its
    cores), which scaling cannot give; its one-process run was slowed. At 75 % of 2 machines' ideal, nothing."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, table_cells, to_csv, to_json_dict
    one = copy.deepcopy(tiny_runs["torch"]["result"])
    two = two_process_copy(one, "ddp", 1.5, "cpu", 1)
    compared = build_comparison([LoadedRun(one, "one.json"), LoadedRun(two, "two.json")])
    scaled = compared.groups[1]
    warning = ("scaling efficiency above 100 % (150% of 1x torch): the one-process run was likely slowed (its threads "
               "contending for the cores, a loaded machine); distrust the efficiency")
    assert compared.warnings(scaled) == [*scaled.warnings(), warning]
    assert warning not in scaled.warnings() and compared.warnings(compared.groups[0]) == compared.groups[0].warnings()
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title["warnings"][1].endswith(warning)
    assert to_json_dict(compared)["summary"][1]["warnings"][-1] == warning
    assert list(csv.DictReader(io.StringIO(to_csv(compared))))[1]["warnings"].endswith(warning)
    warned = "torch+ddp@2 and torch carry" if compared.groups[0].warnings() else "torch+ddp@2 carries"
    assert f"{warned} warnings (see the warnings row)" in compared.ranking()["reason"]
    one = copy.deepcopy(tiny_runs["torch"]["result"])
    two = two_process_copy(one, "ddp", 1.5, "cpu", 2)  # 2 machines: 75 % of 2x
    compared = build_comparison([LoadedRun(one, "one.json"), LoadedRun(two, "two.json")])
    assert compared.warnings(compared.groups[1]) == compared.groups[1].warnings()


def one_process_over_devices(extra, devices, tokens_factor, device_kind):
    """A synthetic JAX run of one device (`verdicts`' tests' kind) and the same run with `extra` over `devices`
    devices of its one process, `tokens_factor` times as fast, on a `device_kind`."""
    from test_verdicts import result
    one, spread = result(noise=0.0), result(extras=(extra,), step_s=0.015 / tokens_factor, noise=0.0)
    for run, count in ((one, 1), (spread, devices)):
        run["env"]["device"] = {"kind": device_kind, "name": "CPU" if device_kind == "cpu" else "NVIDIA H100"}
        run["devices_used"] = count
        # A CPU's simulated devices share its cores, whose one peak MFU divides by (`utilization.peak_devices`).
        run["utilization"] = {"peak_devices": 1 if device_kind == "cpu" else count}
    spread["extras_record"] = {extra: {"devices": devices}}
    spread["processes"] = {"world_size": 1, "processes": 1, "devices_per_process": devices, "launcher": "single",
                           "spanned_by": [extra], "machines": 1}
    return one, spread


@pytest.mark.parametrize("extra, device_kind, ideal, efficiency", [
    ("data-parallel", "cpu", 1, 1.5), ("data-parallel", "gpu", 2, 0.75), ("fsdp", "gpu", 2, 0.75)])
def test_a_jax_run_over_the_devices_of_one_process_scales_its_one_device_run(extra, device_kind, ideal, efficiency):
    """`compare --matrix 'torch;jax;torch+ddp@2;jax+data-parallel'` gave torch+ddp@2 a scaling efficiency and
    jax+data-parallel, one process over 2 simulated devices, none: JAX scales over devices, not processes. Its
    figure is against the one-device run, its ideal the devices' ratio (a CPU's simulated devices share its cores:
    1x). One above 100 % is flagged where it is shown, not only in the warnings row (a MarianMT compare's `657% of
    1x torch` read plainly in its row)."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, table_cells, to_json_dict
    one, spread = one_process_over_devices(extra, 2, 1.5, device_kind)
    compared = build_comparison([LoadedRun(one, "one.json"), LoadedRun(spread, "spread.json")])
    label = compared.groups[1].label
    assert label == f"jax+{extra}"
    above = efficiency > 1
    assert compared.scaling(compared.groups[1]) == {"processes": 1, "devices": 2, "against": "jax",
                                                    "ideal_speedup": ideal, "efficiency": pytest.approx(efficiency),
                                                    "above_ideal": above}
    assert compared.scaling(compared.groups[0]) is None
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    flag = ": above the ideal, distrust it (see the warnings row)" if above else ""
    assert by_title[SCALING_TITLE] == ["", f"{efficiency:.0%} of {ideal}x jax{flag}"]
    warned = [text for text in compared.warnings(compared.groups[1]) if text.startswith("scaling efficiency")]
    assert warned == ([f"scaling efficiency above 100 % ({efficiency:.0%} of {ideal}x jax): the one-process run was "
                       f"likely slowed (its threads contending for the cores, a loaded machine); distrust the "
                       f"efficiency"] if above else [])
    assert to_json_dict(compared)["scaling"][label]["above_ideal"] is above
    # One device is no scaling: the extra over the one device there is.
    compared = build_comparison([LoadedRun(run, f"{number}.json")
                                 for number, run in enumerate(one_process_over_devices(extra, 1, 1.0, device_kind))])
    assert compared.scaling(compared.groups[1]) is None


def test_a_pipeline_on_either_schedule_scales_the_one_process_run(tiny_runs):
    """`torch+pipeline-parallel@2:pipeline-schedule=gpipe` had no scaling efficiency beside the 1F1B run's: its
    schedule, an option of the extra that spans its processes, differed from the one-process run's default."""
    from mtbench.runner.results.report import LoadedRun, build_comparison
    one = copy.deepcopy(tiny_runs["torch"]["result"])
    runs = [LoadedRun(one, "one.json")]
    for schedule in ("1f1b", "gpipe"):
        two = two_process_copy(one, "pipeline-parallel", 1.5, "cpu", 2)
        two["config"].update(pipeline_schedule=schedule, pipeline_micro_batches=4)
        runs.append(LoadedRun(two, f"{schedule}.json"))
    compared = build_comparison(runs)
    assert [compared.scaling(group)["against"] for group in compared.groups[1:]] == ["torch", "torch"]


def test_matrix_entries_name_their_process_count():
    assert parse_run_spec("torch+ddp@2:d-model=64") == RunSpec("torch", ("ddp",), (("d_model", 64),), 2)
    assert parse_run_spec("torch+ddp@2:d-model=64").label == "torch+ddp@2:d-model=64"
    assert parse_run_spec("jax").processes == 1
    with pytest.raises(MtbenchError, match="'@two' in 'torch@two' is not a number of processes"):
        parse_run_spec("torch@two")


def test_a_compare_run_of_several_processes_needs_an_extra_over_them():
    registry = manager.registry()
    check_runs([RunSpec("torch", ("ddp",), (), 2), RunSpec("jax", ("data-parallel",), (), 2)], registry)
    with pytest.raises(MtbenchError, match="run 'torch@2': 2 processes were launched, but no extra of this run "
                                           r"trains one model over them \(--extra ddp or --extra fsdp or --extra tensor-parallel "
                                           r"or --extra pipeline-parallel\)"):
        check_runs([RunSpec("torch", (), (), 2)], registry)


def test_a_process_with_a_share_of_the_cores_runs_on_the_same_machine(tiny_runs):
    """Two local processes each get half the CPUs (`processes.cpu_share`): their hardware is still the machine's,
    so the scaling row finds the one-process run to divide by."""
    import copy

    from mtbench.figures import hardware
    # Counts of their own, not the test process's: a pinned worker's run would record 1 CPU, as its share does.
    one = copy.deepcopy(tiny_runs["jax"]["result"])
    one["env"]["cpu_count"] = 4
    one["env"]["device"].pop("threads", None)
    two = copy.deepcopy(one)
    two["env"]["cpu_count"] = 2
    two["processes"] = {**(two.get("processes") or {}), "world_size": 2,
                        "cpu_share": {"cpus": [0, 1], "threads": 2, "of_cpus": 4, "local_processes": 2}}
    assert hardware(two) == hardware(one) and hardware(one).endswith(", 4 cores")
    from mtbench.figures import cores_text
    assert cores_text(two) == "pinned to 2 of 4 cores, 2 threads (2 processes on the machine)"
    assert cores_text(one) == "every core it may use (4)"
