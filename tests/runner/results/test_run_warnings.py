"""Runs whose timings may mislead say so: the machine's load recorded around training, the warnings a run
carries (steps that scatter, a loaded machine, steal time, an MFU peak measured under load) in every output,
compare's word on a ranking its repeats do not support, and the single-run table's other facts (cold or warm
compile, when the MFU peak was measured, how much of the test set was scored).

Real tiny runs give the results; the figures a warning is about are then set to chosen numbers."""

import csv
import io
import json
import shutil

import pytest
from rich.console import Console

from conftest import cpu_machine_only, device_kind, run_cli
from mtbench.figures import OTHERS_BOUND, SCATTER_BOUND, is_steady, run_warnings, scored_sentences_text
from mtbench.plugins.reporters.table_reporter import TableReporter, result_rows
from mtbench.runner.results.report import (LoadedRun, build_comparison, context_lines, table_cells, to_csv,
                                           stopped_comparison_warning, to_json_dict, to_markdown)
from mtbench.runner.results.schema import schema_errors


def copy(result):
    return json.loads(json.dumps(result))


def quiet(result):
    """`result` as if it ran on a quiet machine: steps that do not scatter, nobody else on the CPUs or the GPU, a
    peak measured at rest, and a model that translated."""
    quieted = copy(result)
    timing = quieted["timing"]
    timing["step_s_p90"] = timing["step_s_median"] * 1.2
    load = quieted["machine_load"]
    load["other_processes_percent"], load["steal_percent"], load["gpu_other_processes"] = 1.0, 0.0, []
    load["before_training"]["load_average"] = load["after_training"]["load_average"] = [0.5, 0.4, 0.3]
    quieted["utilization"]["peak_load_average"] = [0.3, 0.2, 0.1]
    quieted["utilization"]["peak_other_processes_percent"] = 1.0
    quieted["metrics"].pop("quality_warning", None)  # a tiny model may translate every sentence to nothing
    return quieted


def write(tmp_path, name, result):
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return str(path)


def rows(result):
    return {figure: value for _, figure, value in result_rows(result)}


def test_every_run_records_the_machine_load_around_training(tiny_runs):
    for run in tiny_runs.values():
        result = run["result"]
        assert schema_errors(result) == []
        load = result["machine_load"]
        assert load["cores"] >= 1
        before, after = load["before_training"], load["after_training"]
        assert before["at"] <= after["at"]
        assert len(before["load_average"]) == 3 and len(after["load_average"]) == 3
        assert 0 <= load["other_processes_percent"] <= 100 and 0 <= load["steal_percent"] <= 100
        if shutil.which("nvidia-smi") is None:  # no NVIDIA GPU: nothing to say of one
            assert load["gpu_other_processes"] is None
        else:
            assert load["gpu_other_processes"] is None or isinstance(load["gpu_other_processes"], list)
        # The MFU peak says when and under what load it was measured.
        utilization = result["utilization"]
        if device_kind(result["backend"]) == "cpu":  # a GPU's peak is its datasheet's
            assert utilization["peak_measured_at"] and len(utilization["peak_load_average"]) == 3


def test_a_quiet_run_carries_no_warning(tiny_runs):
    assert run_warnings(quiet(tiny_runs["jax"]["result"])) == []
    assert rows(quiet(tiny_runs["jax"]["result"]))["warnings"] == "none"


def test_an_extras_own_warning_joins_the_runs_and_its_table(tiny_runs):
    """An extra's record may say that what it did misleads a reader of the figures (fsdp holding most weights whole):
    its `warning` is the run's, named with the extra; a record without one, or not a dict, adds none."""
    result = quiet(tiny_runs["jax"]["result"])
    result["extras_record"] = {"fsdp": {"warning": "holds 34 of 36 weights whole"}, "loss-log": {"steps": 3},
                               "broken": "record failed"}
    assert run_warnings(result) == ["extra 'fsdp': holds 34 of 36 weights whole"]
    assert rows(result)["warnings"] == "extra 'fsdp': holds 34 of 36 weights whole"


def test_a_run_that_stopped_early_says_where_in_every_report(tiny_runs, tmp_path):
    """A partial result (Ctrl-C, a diverged loss) is reported beside complete ones: its warning says so, and the
    comparison's ranking does not rest on it unflagged."""
    result = quiet(tiny_runs["jax"]["result"])
    result.update(status="interrupted", status_reason="Ctrl-C (SIGINT)", history=result["history"][:37])
    steps = result["config"]["steps"]
    expected = f"interrupted after 37 of {steps} steps (Ctrl-C (SIGINT)): figures of a partial run"
    assert run_warnings(result) == [expected]
    assert rows(result)["warnings"] == expected
    comparison = build_comparison([LoadedRun(result, write(tmp_path, "partial.json", result)),
                                   LoadedRun(quiet(tiny_runs["torch"]["result"]), "torch.json")])
    assert expected in to_markdown(comparison)


def test_a_comparison_that_stopped_early_says_so_and_which_run_in_every_report(tiny_runs, tmp_path):
    """Ctrl-C while torch trained, before it wrote a result: the compare JSON holds jax's run alone. Its report, in
    every format, and the compare JSON's own summary say that the comparison is partial and name the run it stopped
    in; jax's column read `warnings: none`."""
    import os
    from mtbench.runner.orchestration.compare import CompareProgress, ComparePlan, interrupted
    from mtbench.runner.orchestration.runs import plan_runs
    from mtbench.runner.results.report import load_runs
    specs = plan_runs("jax,torch")
    plan = ComparePlan(specs, 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    os.makedirs(plan.runs_dir)
    progress = CompareProgress()
    jax = quiet(tiny_runs["jax"]["result"])
    progress.weights[specs[0].shape] = {"file": "w.npz", "sha256": jax["config"]["initial_weights_sha256"],
                                        "drawn_on": "jax"}
    progress.add(specs[0], 1, jax, write(tmp_path, "jax.json", jax), str(tmp_path / "jax.log"))
    progress.doing, progress.run = "run 'torch'", (specs[1], 1, plan.run_file(specs[1], 1), None)
    interrupted(plan, progress)

    expected = ("partial comparison: interrupted during run 'torch' (1 of 2 runs finished); the runs that did not "
                "finish are missing from it, or partial")
    combined = json.loads((tmp_path / "c.json").read_text())
    assert [entry["warnings"] for entry in combined["summary"]] == [[expected]]
    comparison = build_comparison(load_runs([plan.out]))
    assert [entry["warnings"] for entry in to_json_dict(comparison)["summary"]] == [[expected]]
    assert [row["warnings"] for row in csv.DictReader(io.StringIO(to_csv(comparison)))] == [expected]
    assert f"| warnings | {expected} |" in to_markdown(comparison)
    assert ["warnings", expected] in table_cells(comparison)[1]
    proc = run_cli("report", plan.out, env={"COLUMNS": "400"})
    assert proc.returncode == 0 and expected in proc.stdout, proc.stderr


def test_a_compare_json_of_a_stopped_comparison_leaves_the_comparison_it_was_made_of_as_it_was(tiny_runs, tmp_path):
    """The warning goes on the JSON's runs, not on the caller's comparison: made twice (a comparison written when
    it stopped, and again), the JSON says it once, and the comparison's runs carry no warning of the file's."""
    from mtbench.runner.results.compare_json import combined_json
    runs = [LoadedRun(quiet(tiny_runs[backend]["result"]), f"{backend}.json") for backend in ("jax", "torch")]
    comparison = build_comparison(runs)
    status = {"status": "failed", "status_reason": "run 'torch' failed (1 of 2 runs finished)"}
    first, second = (combined_json(comparison, [], status, {}) for _ in range(2))
    expected = [stopped_comparison_warning(status["status"], status["status_reason"])]
    assert expected[0].startswith("partial comparison: run 'torch' failed")
    assert [entry["warnings"] for entry in second["summary"]] == [expected, expected] == [
        entry["warnings"] for entry in first["summary"]]
    assert [run.warnings for group in comparison.groups for run in group.runs] == [(), ()]
    assert [entry["warnings"] for entry in to_json_dict(comparison)["summary"]] == [[], []]


def test_steps_that_scatter_past_the_bound_are_flagged(tiny_runs):
    result = quiet(tiny_runs["jax"]["result"])
    result["timing"]["step_s_median"], result["timing"]["step_s_p90"] = 0.0536, 0.0536 * SCATTER_BOUND
    assert run_warnings(result) == []  # at the bound, not past it
    result["timing"]["step_s_median"], result["timing"]["step_s_p90"] = 0.0536, 0.3455
    assert run_warnings(result) == ["steady steps scatter: p90 345.5 ms is 6.45x the median 53.6 ms (bound 1.5x)"]


def test_steady_steps_timed_in_too_few_windows_are_flagged(tiny_runs):
    """A run of a few steps is timed in one or two windows: its median and p90 are one or two clock readings, and
    say nothing of the spread. The history is cut where a run of fewer steps would have ended."""
    result = quiet(tiny_runs["jax"]["result"])
    history = result["history"]
    starts, i = [], 0  # where each steady window begins: a steady entry, then its `window_steps` - 1 fellows
    while i < len(history):
        if is_steady(history[i]):
            starts.append(i)
            i += history[i]["window_steps"]
        else:
            i += 1
    assert len(starts) > 3 and max(history[start]["window_steps"] for start in starts) > 1
    assert run_warnings(result) == []
    result["history"] = history[:starts[3]]  # three windows: no warning
    assert run_warnings(result) == []
    result["history"] = history[:starts[2]]
    steps = sum(1 for entry in result["history"] if is_steady(entry))
    assert run_warnings(result) == [f"few steady steps: {steps} steps in 2 timing windows (bound 3), too few for the "
                                    f"median and p90 to show a spread; give more --steps or a smaller --timing-window"]
    result["history"] = history[:starts[0] + 1]
    assert run_warnings(result) == ["few steady steps: 1 step in 1 timing window (bound 3), too few for the median "
                                    "and p90 to show a spread; give more --steps or a smaller --timing-window"]


def test_a_resumed_run_says_which_figures_are_its_last_processs(tiny_runs):
    """A run resumed from a checkpoint times its steps across processes, but its total time (and so its cost), its
    memory peaks and its compile cache are the process that finished it."""
    result = quiet(tiny_runs["jax"]["result"])
    result["timing"]["resumed_at_steps"] = [31]
    assert run_warnings(result) == ["resumed at step 31: total time, cost, memory peaks and the compile cache are the "
                                    "last process's (train time and the steps are the whole run's)"]
    result["timing"]["resumed_at_steps"] = [21, 41]
    assert run_warnings(result)[0].startswith("resumed at steps 21, 41: ")
    # Stopped in its evaluation after training, then resumed: no step of it trained after it resumed.
    last = result["history"][-1]["step"]
    result["timing"]["resumed_at_steps"] = [21, last + 1]
    assert run_warnings(result)[0].startswith(f"resumed at step 21 and resumed after the last step ({last:,}) to "
                                              f"evaluate: ")


def test_float32_matmuls_a_backend_did_not_report_setting_are_labelled_as_asked_only(tiny_runs):
    """A plugin backend whose `set_matmul_precision` reports nothing ran its framework's own float32 arithmetic,
    whatever was asked: its label must not read as if the asked precision had been set."""
    result = copy(tiny_runs["jax"]["result"])
    assert rows(result)["float32 matmuls"] == "highest (IEEE float32)"
    result["env"]["matmul_precision"]["reported"] = None
    assert rows(result)["float32 matmuls"] == "highest (IEEE float32), asked; the backend reported no setting"


def test_programs_compiled_after_the_warm_up_steps_are_flagged(tiny_runs):
    """A step that compiles past its shape's warm-up (JAX's fsdp step did, for its seed states' layout): its time
    is in no compile figure, and in the steady figures where its window was timed."""
    result = quiet(tiny_runs["jax"]["result"])
    history = result["history"]
    assert history[0]["first_of_shape"] and history[0]["compilations"] >= 1  # the warm-up step's own: no warning
    later = [entry for entry in history if not entry["first_of_shape"]]
    assert all(entry["compilations"] == 0 for entry in later)
    later[0]["compilations"] = 1
    assert run_warnings(result) == [f"1 program compiled after the warm-up steps (in the timing window from step "
                                    f"{later[0]['step']}): the compile time leaves it out, and the steps timed with "
                                    f"it are slower"]
    later[-1]["compilations"] = 2
    assert run_warnings(result)[0].startswith(f"3 programs compiled after the warm-up steps (in the timing windows "
                                              f"from step {later[0]['step']}, {later[-1]['step']}): the compile time "
                                              f"leaves them out")


def test_a_machine_loaded_by_other_processes_is_flagged(tiny_runs):
    result = quiet(tiny_runs["jax"]["result"])
    cores = result["machine_load"]["cores"]
    result["machine_load"]["other_processes_percent"] = OTHERS_BOUND
    assert run_warnings(result) == []
    result["machine_load"]["other_processes_percent"] = 62.4
    result["machine_load"]["before_training"]["load_average"] = [3.9, 2.1, 1.2]
    result["machine_load"]["after_training"]["load_average"] = [4.2, 2.5, 1.3]
    assert run_warnings(result) == [
        f"machine loaded: other processes used 62 % of the CPUs' time while the run trained (bound 10 %); load "
        f"average 3.9 before training, 4.2 after training, on {cores} cores"]
    # Where the OS does not tell other processes' time apart, a load average above the cores says it.
    result["machine_load"]["other_processes_percent"] = None
    result["machine_load"]["before_training"]["load_average"] = [cores + 1.9, 2.1, 1.2]
    assert run_warnings(result)[0].startswith(f"machine loaded: load average {cores + 1.9:g} before training")
    result["machine_load"]["before_training"]["load_average"] = [cores - 0.5, 2.1, 1.2]
    assert run_warnings(result) == []


def test_other_processes_on_the_runs_gpu_are_flagged(tiny_runs):
    result = quiet(tiny_runs["jax"]["result"])
    load = result["machine_load"]
    load["gpu_other_processes"] = [{"pid": 4242, "name": "/usr/bin/python3", "used_memory_mib": 20480,
                                    "seen": "both"}]
    assert run_warnings(result) == [
        "GPU shared: 1 other process held a context on this run's GPU as training began or ended (pid 4242 python3, "
        "20,480 MiB): its times may be shared"]
    assert rows(result)["machine load (training start -> end)"].split(", CPU clock")[0].endswith(
        ", other GPU processes: 1")
    load["gpu_other_processes"] += [{"pid": 100 + i, "name": "java" if i else "", "used_memory_mib": None,
                                     "seen": "after"} for i in range(4)]
    assert run_warnings(result) == [
        "GPU shared: 5 other processes held a context on this run's GPU as training began or ended (pid 4242 python3, "
        "20,480 MiB; pid 100; pid 101 java; and 2 more): its times may be shared"]
    assert ", other GPU processes: 5" in rows(result)["machine load (training start -> end)"]
    for nobody in ([], None):  # nothing else on the GPU; not known (no GPU, or pids nvidia-smi cannot match)
        load["gpu_other_processes"] = nobody
        assert run_warnings(result) == []
        assert "GPU" not in rows(result)["machine load (training start -> end)"]
    del load["gpu_other_processes"]  # a result written before it was recorded
    assert run_warnings(result) == []


def test_steal_time_and_a_peak_measured_under_load_are_flagged(tiny_runs):
    result = quiet(tiny_runs["jax"]["result"])
    cores = result["machine_load"]["cores"]
    result["machine_load"]["steal_percent"] = 12.5
    result["utilization"]["peak_load_average"] = [cores + 2.0, 1.0, 0.5]
    at = result["utilization"]["peak_measured_at"]
    assert run_warnings(result) == [
        "the hypervisor took 12.5 % of the CPUs' time while the run trained (steal; bound 5 %)",
        f"MFU peak measured under load: load average {cores + 2.0:g} on {cores} cores at {at}, so MFU reads high "
        f"(`mtbench env --calibrate` on a quiet machine measures it again)"]


def test_an_mfu_above_the_peak_names_the_peak_where_and_when_it_was_measured_and_how_to_measure_it_again(tiny_runs):
    """A peak measured on a busy machine and cached can sit below what a later quiet run reaches (52 GFLOP/s
    cached against 98 reached, 2026-11-26): MFU over 100 % says the peak is wrong, not the run fast, and names the
    peak, so that the reader knows which cached measurement to redo."""
    result = quiet(tiny_runs["jax"]["result"])
    utilization = result["utilization"]
    cores = result["machine_load"]["cores"]
    # The users' case: the peak was measured under load, and MFU read 123.1 %.
    utilization.update(mfu=1.231, peak_flops_per_s=52.4e9, peak_load_average=[cores + 1.5, 1.2, 0.9],
                       peak_cpus=2, peak_threads=None, peak_other_processes_percent=48.96)
    warnings = run_warnings(result)
    assert warnings == [
        f"MFU above 100 % (123.1 %): more than the peak it divides by, 52.4 GFLOP/s ({utilization['peak_source']}; "
        f"measured {utilization['peak_measured_at']} at load average {cores + 1.5:g} / 1.2 / 0.9 on 2 CPUs, other "
        f"processes 49 % of the CPUs), so that peak is too low (`mtbench env --calibrate` on a quiet machine "
        f"measures it again)"]
    assert rows(result)["warnings"] == warnings[0]
    assert utilization["peak_source"].startswith("measured: ")  # a CPU's peak is measured, not a datasheet's
    result["utilization"]["mfu"] = 0.55  # below 100 %: the peak's load alone is said
    assert [warning.split(":")[0] for warning in run_warnings(result)] == ["MFU peak measured under load"]
    utilization.update(mfu=1.05, peak_flops_per_s=989.4e12, peak_devices=8, peak_measured_at=None,
                       peak_source="NVIDIA H100 SXM datasheet, TF32 dense")
    assert run_warnings(result) == [
        "MFU above 100 % (105.0 %): more than the peak it divides by, 989.4 TFLOP/s x 8 devices (NVIDIA H100 SXM "
        "datasheet, TF32 dense), so the model's FLOPs are counted too high or the peak is not this device's"]


def test_a_test_set_that_is_the_training_data_is_flagged_and_unranks_the_comparison(tiny_runs):
    """40 of 40 test sources in the training data: the test scores measure recall, not translation."""
    jax, torch = quiet(tiny_runs["jax"]["result"]), quiet(tiny_runs["torch"]["result"])
    assert (jax["data"]["test_sources_in_train"], jax["data"]["test_sources_checked"]) == (0, 100)
    for result in (jax, torch):
        result["data"]["test_sources_in_train"], result["data"]["test_sources_checked"] = 40, 40
    warning = ("test set overlaps the training data: 40 of 40 test sources (100%) are also training sources (bound "
               "5%), so the test scores reward recalling training pairs as well as translating")
    assert run_warnings(jax) == [warning]
    comparison = build_comparison([LoadedRun(jax, "jax.json"), LoadedRun(torch, "torch.json")])
    header, cells = table_cells(comparison)
    assert next(row for row in cells if row[0] == "warnings")[1:] == [warning, warning]
    reason = comparison.ranking()["reason"]  # the two named fastest first
    assert any(f"{pair} carry warnings (see the warnings row)" in reason for pair in ("jax and torch", "torch and jax"))
    # A few sentences shared by chance, at the bound: no warning.
    jax["data"]["test_sources_in_train"], jax["data"]["test_sources_checked"] = 5, 100
    assert run_warnings(jax) == []
    del jax["data"]["test_sources_in_train"]  # a task that does not count it (a language model's splits)
    assert run_warnings(jax) == []


@pytest.mark.slow  # the shared data-parallel run, which no quick test needs otherwise: about 20 s
def test_the_table_names_how_many_devices_peaks_mfu_divides_by(tiny_runs, jax_data_parallel_run):
    """Two simulated devices share one CPU, whose measured peak spans its cores: one peak. Eight GPUs' MFU divides
    by eight peaks, which the table says (it printed one device's beside a share of eight's)."""
    parallel = jax_data_parallel_run["result"]
    utilization = parallel["utilization"]
    assert parallel["devices_used"] == 2 and utilization["peak_devices"] == 1
    assert utilization["mfu"] == pytest.approx(utilization["model_flops_per_s"] / utilization["peak_flops_per_s"])
    eight = copy(tiny_runs["jax"]["result"])
    eight["utilization"].update(peak_flops_per_s=989.4e12, peak_devices=8, mfu=0.505, peak_source="datasheet")
    assert rows(eight)["MFU (padded): model FLOP/s / peak"].startswith("50.5 % of 8 x 989.40 TFLOP/s (datasheet")
    del eight["utilization"]["peak_devices"]  # a result from before it was recorded
    assert rows(eight)["MFU (padded): model FLOP/s / peak"].startswith("50.5 % of 989.40 TFLOP/s (datasheet")


def test_a_result_written_before_the_load_was_recorded_gets_no_load_warning(tiny_runs):
    older = quiet(tiny_runs["torch"]["result"])
    del older["machine_load"]
    # a peak measured on the CPU before measurements kept their time and load (on a GPU machine the run divided
    # by its GPU's datasheet peak: made one measured here, as on a CPU machine)
    older["utilization"]["peak_source"] = "measured: 512x512 float32 matmul on torch, median of repeats"
    for recorded_since in ("peak_measured_at", "peak_load_average"):
        older["utilization"].pop(recorded_since, None)
    assert run_warnings(older) == []
    assert rows(older)["machine load (training start -> end)"] == "not recorded"
    assert "when and under what load not recorded" in rows(older)["MFU (padded): model FLOP/s / peak"]


@cpu_machine_only  # the peak MFU divides by, measured here; a GPU's is its datasheet's
def test_the_single_run_table_shows_load_warnings_compile_cache_peak_and_test_set(tiny_runs):
    result = tiny_runs["jax"]["result"]
    shown = rows(result)
    load = result["machine_load"]
    assert shown["machine load (training start -> end)"].startswith(
        f"load average {load['before_training']['load_average'][0]:g} -> "
        f"{load['after_training']['load_average'][0]:g} on {load['cores']} cores, other processes ")
    assert rows(quiet(result))["warnings"] == "none"
    stolen = quiet(result)
    stolen["machine_load"]["steal_percent"] = 9.0
    assert rows(stolen)["warnings"] == ("the hypervisor took 9 % of the CPUs' time while the run trained (steal; "
                                        "bound 5 %)")
    cache = result["timing"]["compile_cache"]
    assert shown["compile (first step of each shape)"].endswith(
        f" over 2 shapes, compile cache {cache['programs']} ({cache['hits']} hit{'s' * (cache['hits'] != 1)}, "
        f"{cache['misses']} miss{'es' * (cache['misses'] != 1)})")
    one_shape = copy(result)
    one_shape["timing"]["shapes_compiled"] = 1
    assert " over 1 shape, compile cache " in rows(one_shape)["compile (first step of each shape)"]
    utilization = result["utilization"]
    load_text = " / ".join(f"{value:g}" for value in utilization["peak_load_average"])
    # The CPUs its measuring process could run on: this test worker's share (one of 2 on this project's machines).
    cpus = utilization["peak_cpus"]
    assert isinstance(cpus, int) and cpus >= 1
    # and the threads of the framework that measured it, where its backend says (torch; JAX's XLA pool does not)
    threads = utilization["peak_threads"]
    assert (threads is None) == (" matmul on jax, median of repeats" in utilization["peak_source"]), utilization
    said = f", {threads} thread{'s' * (threads != 1)}" if threads else ""
    # and the CPUs' time other processes took as it measured (null in a peak cached before it was counted)
    others = utilization["peak_other_processes_percent"]
    said += "" if others is None else f", other processes {others:.0f} % of the CPUs"
    assert shown["MFU (padded): model FLOP/s / peak"].endswith(
        f"; measured {utilization['peak_measured_at']} at load average {load_text} on {cpus} CPU{'s' * (cpus > 1)}"
        f"{said})")
    # --max-len 48 drops test pairs on the tiny preset's tokenizer: the table says how many were scored of how many.
    scored, dropped = result["metrics"]["test_sentences_scored"], result["data"]["dropped"]["too_long"]["test"]
    assert dropped > 0 and scored + dropped == result["data"]["pairs"]["test"]
    assert shown["test sentences scored"] == f"{scored} of {scored + dropped} ({dropped} longer than --max-len 48)"


def test_the_scored_sentences_of_a_whole_test_set_and_of_a_partial_result(tiny_runs):
    whole = copy(tiny_runs["jax"]["result"])
    for counts in whole["data"]["dropped"].values():
        counts["test"] = 0
    whole["data"]["dropped_too_long"]["test"] = 0
    assert scored_sentences_text(whole) == f"{whole['metrics']['test_sentences_scored']} (the whole test set)"
    whole["metrics"]["test_sentences_scored"] = None  # a partial result translated nothing
    assert scored_sentences_text(whole) is None


def test_runs_of_other_lengths_say_each_how_many_test_sentences_it_scored(tiny_runs):
    """A --max-len sweep translates other sentences at each length: the first run's count stood for all of them,
    beside BLEU figures of different sentences."""
    long, short = copy(tiny_runs["jax"]["result"]), copy(tiny_runs["jax"]["result"])
    short["config"]["max_len"] = 32
    short["metrics"]["test_sentences_scored"] -= 20
    short["data"]["dropped"]["too_long"]["test"] += 20
    lines = context_lines(build_comparison([LoadedRun(long, "long.json"), LoadedRun(short, "short.json")]))
    said = [line for line in lines if "test sentences" in line]
    assert said == [f"test sentences scored of jax:max-len=48: {scored_sentences_text(long)}",
                    f"test sentences scored of jax:max-len=32: {scored_sentences_text(short)}",
                    "the runs scored different test sentences: their test figures (BLEU, chrF, loss) are not of the "
                    "same text"]
    assert scored_sentences_text(short).endswith("longer than --max-len 32)")
    again = copy(long)
    lines = context_lines(build_comparison([LoadedRun(long, "a.json"), LoadedRun(again, "b.json")], force=True))
    assert [line for line in lines if "test sentences" in line] == [
        f"test sentences scored: {scored_sentences_text(long)}"]


def test_an_80_column_table_folds_the_bleu_signature_instead_of_cutting_it(tiny_runs):
    result = tiny_runs["jax"]["result"]
    console = Console(file=io.StringIO(), width=80, record=True)
    TableReporter().report(result, console, complete=True)
    text = console.export_text()
    assert "…" not in text
    values = "".join(line.split("│")[3].strip() for line in text.splitlines() if line.count("│") == 4)
    assert result["metrics"]["bleu_signature"] in values


def repeats(result, tokens_per_s):
    """Repeats of one run with the chosen throughputs: its steps' times scaled to them, its steady windows too."""
    made = []
    for number, tokens in enumerate(tokens_per_s, start=1):
        repeat = quiet(result)
        slower = repeat["timing"]["tokens_per_s"] / tokens
        repeat["timing"]["tokens_per_s"] = tokens
        repeat["history"] = [{**entry, "seconds": entry["seconds"] * slower} for entry in repeat["history"]]
        made.append(LoadedRun(repeat, f"{result['backend']}-{number}.json"))
    return made


def test_a_ranking_whose_leader_is_not_faster_beyond_the_noise_is_not_reliable(tiny_runs):
    jax, torch = tiny_runs["jax"]["result"], tiny_runs["torch"]["result"]
    overlapping = build_comparison(repeats(jax, [40_100, 44_000, 43_000]) + repeats(torch, [43_500, 45_000, 44_800]))
    ranking = overlapping.ranking()
    assert ranking["order"] == ["torch", "jax"] and ranking["reliable"] is False
    line = "ranking not reliable: torch: no difference from jax in tokens/s beyond the noise ("
    assert any(text.startswith(line) for text in context_lines(overlapping))
    line = next(text for text in context_lines(overlapping) if text.startswith(line))
    assert to_json_dict(overlapping)["ranking"]["reason"] == line.removeprefix("ranking not reliable: ")
    assert f"- {line}" in to_markdown(overlapping)

    apart = build_comparison(repeats(jax, [40_100, 41_000, 40_500]) + repeats(torch, [43_500, 45_000, 44_800]))
    assert apart.ranking() == {"order": ["torch", "jax"], "reliable": True, "reason": None}
    assert not any(line.startswith("ranking") for line in context_lines(apart))
    # One repeat each, 0.2 % apart: within the noise of their windows, so the order is no ranking either.
    close = build_comparison(repeats(jax, [44_000]) + repeats(torch, [44_088]))
    assert close.ranking()["order"] == ["torch", "jax"] and close.ranking()["reliable"] is False


def test_warnings_reach_the_comparison_table_json_csv_and_markdown(tiny_runs, tmp_path):
    jax = quiet(tiny_runs["jax"]["result"])
    torch = quiet(tiny_runs["torch"]["result"])
    torch["timing"]["step_s_median"], torch["timing"]["step_s_p90"] = 0.0536, 0.3455
    torch["machine_load"]["other_processes_percent"] = 62.4
    expected = run_warnings(torch)
    assert len(expected) == 2
    comparison = build_comparison([LoadedRun(jax, "jax.json"), LoadedRun(torch, "torch.json")])
    header, cells = table_cells(comparison)
    warnings_row = next(row for row in cells if row[0] == "warnings")
    assert warnings_row[header.index("jax")] == "none"
    assert warnings_row[header.index("torch")] == "\n".join(expected)
    summary = {entry["label"]: entry for entry in to_json_dict(comparison)["summary"]}
    assert summary["jax"]["warnings"] == [] and summary["torch"]["warnings"] == expected
    assert "| warnings | none | " + "<br>".join(expected) + " |" in to_markdown(comparison)
    csv_rows = {row["label"]: row for row in csv.DictReader(io.StringIO(to_csv(comparison)))}
    assert csv_rows["torch"]["warnings"] == "; ".join(expected) and csv_rows["jax"]["warnings"] == ""
    # A warned run among the two fastest: the ranking is not reliable either.
    assert "torch carries warnings (see the warnings row)" in comparison.ranking()["reason"]

    # The same through `mtbench report`, from files.
    paths = [write(tmp_path, "jax.json", jax), write(tmp_path, "torch.json", torch)]
    proc = run_cli("report", *paths, "--format", "markdown")
    assert proc.returncode == 0, proc.stderr
    assert "<br>".join(expected) in proc.stdout
    assert f"- test sentences scored: {scored_sentences_text(jax)}" in proc.stdout


def test_repeats_name_their_own_warnings(tiny_runs):
    first, second = repeats(tiny_runs["jax"]["result"], [40_000, 41_000])
    second.result["machine_load"]["steal_percent"] = 9.0
    group = build_comparison([first, second]).groups[0]
    assert group.warnings() == ["#2: the hypervisor took 9 % of the CPUs' time while the run trained (steal; bound "
                                "5 %)"]


def test_the_compare_json_records_the_order_and_warnings_of_its_runs(compared, tmp_path):
    combined = compared["combined"]
    assert combined["status"] == "completed" and combined["status_reason"] is None
    assert [(run["label"], run["repeat"], run["position"]) for run in combined["runs"]] == \
        [("jax", 1, 1), ("torch", 1, 2)]
    assert all(run["status"] == "completed" and "machine_load" in run["result"] for run in combined["runs"])
    assert sorted(combined["ranking"]["order"]) == ["jax", "torch"]
    # One run's machine was shared with another guest: its own entry says so, in the JSON and the markdown.
    shared = copy(combined)
    for run in shared["runs"]:
        run["result"] = quiet(run["result"])
    shared["runs"][1]["result"]["machine_load"]["steal_percent"] = 9.0
    path = tmp_path / "shared.json"
    path.write_text(json.dumps(shared))
    stolen = "the hypervisor took 9 % of the CPUs' time while the run trained (steal; bound 5 %)"
    summary = {entry["label"]: entry for entry in json.loads(run_cli("report", str(path), "--format", "json").stdout)[
        "summary"]}
    assert (summary["jax"]["warnings"], summary["torch"]["warnings"]) == ([], [stolen])
    assert f"| warnings | none | {stolen} |" in run_cli("report", str(path), "--format", "markdown").stdout


@pytest.mark.parametrize("output_format", ["table", "json", "markdown", "csv"])
def test_a_complete_and_a_diverged_result_report_together(tiny_runs, tmp_path, output_format):
    jax_path = tiny_runs["jax"]["path"]
    diverged = copy(tiny_runs["torch"]["result"])
    diverged["status"], diverged["status_reason"] = "diverged", "the loss is nan at step 10"
    diverged["history"] = diverged["history"][:10]
    diverged["history"][-1]["loss"] = None
    diverged["timing"]["steps"] = 10
    for key in diverged["metrics"]:
        diverged["metrics"][key] = None
    diverged["hypotheses_file"] = diverged["references_file"] = None
    assert schema_errors(diverged) == []
    proc = run_cli("report", jax_path, write(tmp_path, "diverged.json", diverged), "--format", output_format)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr == ""
    if output_format == "json":
        def refuse(constant):
            raise ValueError(f"{constant} is not JSON")
        pair = json.loads(proc.stdout, parse_constant=refuse)["parity"]["pairs"][0]
        assert pair["diverged_at"] == 10 and pair["diverged_run"] == "torch"
        # the steps compared, those before the divergence (it said 10, the steps the shorter run took)
        assert pair["within_tolerance"] is False and pair["steps"] == 9 and pair["max_relative_difference"] < 0.01
    elif output_format in ("table", "markdown"):
        assert ("parity torch vs jax (float32): torch's loss is not finite from step 10, the other's is; over the 9 "
                "steps before, largest relative loss difference") in " ".join(proc.stdout.split())


def test_a_model_that_translated_nothing_is_flagged(tiny_runs):
    result = quiet(tiny_runs["jax"]["result"])
    result["metrics"]["quality_warning"] = "the model produced no words for any test sentence"
    assert run_warnings(result) == ["the model produced no words for any test sentence"]
    assert "no words" in rows(result)["warnings"]
