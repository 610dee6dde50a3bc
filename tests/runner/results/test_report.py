"""`mtbench report` and `mtbench env`: every format carries the results' own numbers, runs that do not compare
are refused, and the plot shows the runs' real series."""

import copy
import csv
import io
import json
import math
import os
import re
import struct
import subprocess
import sys

import pytest

from conftest import assert_refused_in_one_line, cli_environment, device_kind, keras_on_jax, python_path, run_cli
from mtbench.figures import FIGURES, shown_figures

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tiny_runs):
    """The two single-run results (jax, torch) as files and as dicts."""
    return {backend: (run["path"], run["result"]) for backend, run in tiny_runs.items()}


def report(*args, **kwargs):
    proc = run_cli("report", *args, **kwargs)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_json_output_carries_the_results_figures(results):
    data = json.loads(report(results["jax"][0], results["torch"][0], "--format", "json"))
    assert [entry["label"] for entry in data["summary"]] == ["jax", "torch"]
    for entry in data["summary"]:
        result = results[entry["label"]][1]
        assert entry["repeats"] == 1 and entry["dtype"] == "float32"
        assert entry["train_step"] == result["train_step"] and entry["matmul_precision"] == "highest (IEEE float32)"
        assert entry["attention"] == result["model"]["attention"]["causal"]
        for figure in FIGURES:
            stat = entry["figures"][figure.key]
            assert stat["median"] == stat["low"] == stat["high"] == figure.value(result), figure.key
        # Read from the result's own fields, not through the figures' accessors that the report uses.
        timing, metrics = result["timing"], result["metrics"]
        raw = {"compile_s": timing["compile_s"], "step_s_median": timing["step_s_median"],
               "step_s_p90": timing["step_s_p90"], "tokens_per_s": timing["tokens_per_s"], "total_s": timing["total_s"],
               "translate_s": timing["phases_s"]["translate"], "mfu": result["utilization"]["mfu"],
               "mfu_real_tokens": result["utilization"]["mfu_real_tokens"],
               "peak_host_bytes": result["memory"]["peak_host_bytes"], "train_loss": metrics["train_loss"],
               "val_loss": metrics["val_loss"], "test_accuracy": metrics["test_accuracy"], "chrf": metrics["chrf"]}
        assert {key: entry["figures"][key]["median"] for key in raw} == raw
    tokens = {b: results[b][1]["timing"]["tokens_per_s"] for b in ("jax", "torch")}
    assert data["speedups"] == {"jax": 1.0, "torch": pytest.approx(tokens["torch"] / tokens["jax"])}
    assert data["parity"]["passed"] is True and data["parity"]["pairs"][0]["run"] == "torch"


def test_baseline_option_sets_the_speedups_reference(results):
    data = json.loads(report(results["jax"][0], results["torch"][0], "--format", "json", "--baseline", "torch"))
    tokens = {b: results[b][1]["timing"]["tokens_per_s"] for b in ("jax", "torch")}
    assert data["baseline"] == "torch"
    assert data["speedups"] == {"jax": pytest.approx(tokens["jax"] / tokens["torch"]), "torch": 1.0}
    assert data["parity"]["pairs"][0]["reference"] == "torch"


def test_repeats_of_a_run_show_median_and_range_of_every_timing(results, tmp_path):
    """Two results of the same backend and configuration are repeats of one run."""
    jax_path, jax_result = results["jax"]
    slower = json.loads(json.dumps(jax_result))
    for key in ("compile_s", "step_s_median", "step_s_p90", "train_s", "total_s"):
        slower["timing"][key] *= 2
    slower["timing"]["tokens_per_s"] /= 2
    slower_path = tmp_path / "slower.json"
    slower_path.write_text(json.dumps(slower))
    paths = [jax_path, str(slower_path), results["torch"][0]]

    data = json.loads(report(*paths, "--format", "json"))
    jax_entry = data["summary"][0]
    assert jax_entry["label"] == "jax" and jax_entry["repeats"] == 2
    tokens = jax_entry["figures"]["tokens_per_s"]
    original = jax_result["timing"]["tokens_per_s"]
    assert (tokens["low"], tokens["high"]) == (original / 2, original)
    assert tokens["median"] == pytest.approx(0.75 * original)

    header, rows = parse_markdown_table(report(*paths, "--format", "markdown"))
    assert header == ["figure", "jax", "torch"] and rows["runs (repeats)"] == ["2", "1"]
    for figure in shown_figures([jax_result]):
        cell = rows[figure.title][0]
        if figure.value(jax_result) is None:  # energy on a machine without a counter, cost without a price
            assert cell == "n/a", (figure.key, cell)
        elif figure.is_timing:
            low, high = (figure.text(v) for v in sorted([figure.value(jax_result), figure.value(slower)]))
            assert cell.endswith(f" ({low}–{high})"), (figure.key, cell)
        else:
            assert "–" not in cell, (figure.key, cell)


def test_one_run_given_twice_is_refused_not_counted_as_two_repeats(results, tmp_path):
    """A file named twice, or a byte-identical copy, would be two repeats whose spread is zero."""
    jax_path, jax_result = results["jax"]
    copy = tmp_path / "copy.json"
    copy.write_text(json.dumps(jax_result))
    for paths in ([jax_path, jax_path], [jax_path, results["torch"][0], str(copy)]):
        proc = run_cli("report", *paths)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"Error: {jax_path} and {paths[-1]} hold the same run (created {jax_result['created']}); give each run "
            f"once"], proc.stderr


def test_csv_output_carries_the_results_figures(results):
    rows = list(csv.DictReader(io.StringIO(report(results["jax"][0], results["torch"][0], "--format", "csv"))))
    assert [row["label"] for row in rows] == ["jax", "torch"]
    for row in rows:
        result = results[row["label"]][1]
        assert row["backend"] == result["backend"] and row["repeats"] == "1"
        assert row["train_step"] == result["train_step"] and row["matmul_precision"].startswith("highest")
        framework = result["backend"]
        assert row["versions"].startswith(f"{framework} {result['env']['backend_versions'][framework]}")
        assert f"keras {result['env']['keras']}" in row["versions"]
        energy = result["energy"]  # this machine's counter, or why it has none
        assert row["energy_counter"] == (f"{energy['source']}: {energy['counts']}" if energy["source"]
                                         else f"none: {energy['reason']}")
        assert row["loss_scaling"] == "none"  # float32
        # Read from the result's own fields, not through the figures' accessors that the report uses.
        raw = {"compile_s": result["timing"]["compile_s"], "tokens_per_s": result["timing"]["tokens_per_s"],
               "train_s": result["timing"]["train_s"], "total_s": result["timing"]["total_s"],
               "mfu": result["utilization"]["mfu"], "peak_host_bytes": result["memory"]["peak_host_bytes"],
               "test_loss": result["metrics"]["test_loss"], "bleu": result["metrics"]["bleu"],
               "chrf": result["metrics"]["chrf"]}
        assert {key: float(row[key]) for key in raw} == raw
        for figure in FIGURES:
            value = figure.value(result)
            keys = [figure.key] + ([f"{figure.key}_min", f"{figure.key}_max"] if figure.is_timing else [])
            for key in keys:
                assert (row[key] == "") if value is None else (float(row[key]) == value), key
    # `train`'s table names the run's own framework (it named every framework installed) and mtbench's commit.
    from mtbench.plugins.reporters.table_reporter import result_rows
    torch_env = results["torch"][1]["env"]
    [versions] = [value for _, figure, value in result_rows(results["torch"][1]) if figure == "versions"]
    assert versions.startswith(f"torch {torch_env['backend_versions']['torch']}, keras ") and "jax" not in versions
    commit = torch_env["mtbench_git_commit"]
    dirty = "-dirty" if commit and commit.endswith("-dirty") else ""
    assert versions.endswith(f"mtbench {torch_env['mtbench']}" + (f" (git {commit[:12]}{dirty})" if commit else ""))


def parse_markdown_table(text):
    """{first cell: [other cells]} of the markdown table's body, and its header."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    header, body = cells[0], cells[2:]
    return header, {row[0]: row[1:] for row in body}


def tiny_layer_norms():
    """The layer norms of the `tiny` translation model, as Keras lists its layers."""
    keras = keras_on_jax()
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    model = build_transformer(PRESETS["tiny"])
    return [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.LayerNormalization)]


def test_markdown_output_carries_the_results_figures(results):
    text = report(results["jax"][0], results["torch"][0], "--format", "markdown")
    header, rows = parse_markdown_table(text)
    assert header == ["figure", "jax", "torch"]
    # Translation's quality figures, and none of another task's (a language model's perplexity).
    assert "BLEU (test)" in rows and "validation perplexity" not in rows
    for column, backend in enumerate(("jax", "torch")):
        result = results[backend][1]
        for figure in shown_figures([result]):
            cell, value = rows[figure.title][column], figure.value(result)
            if value is None:
                assert cell == "n/a"
            else:  # the cell is the raw value, scaled and rounded as the figure says
                shown = float(cell.replace(",", ""))
                assert shown == pytest.approx(value * figure.display_scale, abs=0.51 * 10 ** -figure.decimals)
    assert rows["dtype"] == ["float32", "float32"]
    # What ran, beside the figures: the step, the attention kernels and the float32 arithmetic of each run.
    assert rows["train step"] == ["jax-jit-stateless", "torch-eager"]
    assert rows["attention"] == ["xla (unfused)", "aten (unfused)"]
    assert rows["float32 matmuls"] == ["highest (IEEE float32)"] * 2
    # Each layer norm's statistics (JAX's steps in one pass as the mean of squares, torch's kernel Welford's) and
    # what carried out the update: the arithmetic that differs by the backend, a row each.
    norms = len(tiny_layer_norms())
    assert rows["layer norm statistics"] == [
        "one pass: the variance as the mean of squares less the squared mean, in float32 or wider "
        f"({norms} of {norms} layer norms)",
        f"Welford's one pass, in float32 (torch's layer_norm; {norms} of {norms} layer norms)"]
    # (the fused kernel's calls counted against torch's profiler: tests/plugins/backends/test_torch_step_honesty.py)
    assert rows["optimizer update"][0] == "Keras's AdamW (`stateless_apply`), compiled into the step"
    assert re.fullmatch(r"Keras's AdamW by torch's fused AdamW kernel, (1 call|2 calls) a step \(one a parameter "
                        r"group\)", rows["optimizer update"][1])
    assert rows["compile cache"][1] == "off"
    # torch's intra-op threads as it counted them in the run's process (its default, the physical cores), where it
    # computed on the CPU: a run on a GPU records none
    cores = [results[backend][1]["env"]["cpu_count"] for backend in ("jax", "torch")]
    device = results["torch"][1]["env"]["device"]
    count = device.get("threads")
    threads = f", {count} intra-op thread{'s' * (count != 1)}" if device_kind("torch") == "cpu" else ""
    assert rows["cores and threads"] == [f"every core it may use ({cores[0]})",
                                         f"every core it may use ({cores[1]}){threads}"]
    # JAX's decoding is one XLA program; torch's a loop from Python, its test translation time other work
    assert rows["inference (decoding, samples)"] == [
        "compiled: jax.jit; a translation decoded in a loop inside one XLA program, a language model's sample token "
        "by token from Python",
        "eager: torch.no_grad, a decoding loop step by step from Python"]
    assert "parity torch vs jax" in text


def test_the_configuration_and_parity_lines_say_what_ran(results):
    """A measure-only comparison decoded nothing, so its configuration names no decoding; one step is one step.
    The tiny runs cut to their first step, as a run of `--steps 1 --measure-only` records them."""
    from mtbench.plugins.reporters.table_reporter import summary_lines
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines
    corpus = results["jax"][1]["data"]["corpus"]
    vocabulary = results["jax"][1]["model"]["vocab_size"]  # the pieces the tiny corpus's tokenizer learnt
    tokens = f"sentencepiece-unigram tokens (vocabulary {vocabulary:,})"
    both = [LoadedRun(results[backend][1], results[backend][0]) for backend in ("jax", "torch")]
    assert context_lines(build_comparison(both))[0].startswith(
        f"configuration: {corpus}, preset tiny, 60 steps x batch 32, max-len 48, max-pairs 4000, {tokens}, seed 0, "
        f"greedy decoding, AdamW ")
    one_step = []
    for backend in ("jax", "torch"):
        result = json.loads(json.dumps(results[backend][1]))
        result["config"].update(steps=1, measure_only=True)
        result["metrics"].update(bleu=None, chrf=None, bleu_signature=None, chrf_signature=None)  # nothing decoded
        result["timing"]["steps"], result["history"] = 1, result["history"][:1]
        one_step.append(LoadedRun(result, f"{backend}.json"))
    lines = context_lines(build_comparison(one_step))
    assert lines[0].startswith(f"configuration: {corpus}, preset tiny, 1 step x batch 32, max-len 48, max-pairs 4000, "
                               f"{tokens}, seed 0, AdamW ")
    assert any(line.startswith("parity torch vs jax (float32, first 1 step): ") for line in lines), lines
    assert not any("signature" in line for line in lines), lines  # it read 'BLEU signature: not recorded'
    assert ", float32, 1 step x 32, on " in summary_lines(one_step[0].result)[0]


def test_a_compare_json_reports_the_same_figures_as_its_run_files(compared):
    from_compare = json.loads(report(compared["path"], "--format", "json"))
    run_files = [run["result_file"] for run in compared["combined"]["runs"]]
    from_files = json.loads(report(*run_files, "--format", "json"))
    strip = [{k: v for k, v in entry.items() if k != "sources"} for entry in from_compare["summary"]]
    assert strip == [{k: v for k, v in entry.items() if k != "sources"} for entry in from_files["summary"]]
    assert from_compare["parity"] == compared["combined"]["parity"]


def test_a_compare_json_is_reported_against_the_baseline_it_recorded(compared, tmp_path):
    against_torch = tmp_path / "against-torch.json"
    against_torch.write_text(json.dumps({**compared["combined"], "baseline": "torch"}))
    data = json.loads(report(str(against_torch), "--format", "json"))
    assert data["baseline"] == "torch" and data["speedups"]["torch"] == 1.0 and data["speedups"]["jax"] != 1.0
    assert json.loads(report(str(against_torch), "--format", "json", "--baseline", "jax"))["baseline"] == "jax"


def test_runs_of_different_configurations_are_refused(results, compared):
    """The compare ran 30 steps with one length bucket; the single runs 60 steps with two. The length may differ
    (a sweep), and with it the weights file (the position embeddings follow it); the steps may not."""
    proc = run_cli("report", results["jax"][0], compared["path"])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: not comparable: "), proc.stderr
    assert " in steps (30 vs 60); only " in lines[0]
    assert "--force" in lines[0]


def test_runs_of_one_shape_from_other_weights_are_refused(results, tmp_path):
    jax_path, jax = results["jax"]
    other = variant(jax, tmp_path / "other-weights.json", {"initial_weights_sha256": "another"})
    proc = run_cli("report", jax_path, other)
    assert proc.returncode == 2, proc.stderr
    assert f" in initial_weights_sha256 ('another' vs {jax['config']['initial_weights_sha256']!r}); only " in \
        proc.stderr.strip().splitlines()[-1]


def test_a_deliberately_changed_configuration_is_refused_unless_forced(results, tmp_path):
    changed = json.loads(json.dumps(results["torch"][1]))
    changed["config"]["learning_rate"] = 0.002
    changed["config"]["seed"] = 7
    changed["config"]["dtype"] = "mixed_bfloat16"  # may differ: not named
    changed["config"]["batch_size"] = 16  # may differ too: a batch sweep
    changed["config"]["keep_checkpoints"] = 1  # how many checkpoints stayed on disk: no difference in the figures
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(changed))
    proc = run_cli("report", results["jax"][0], str(path))
    assert proc.returncode == 2
    message = proc.stderr.strip()
    assert "not comparable" in message and "learning_rate (0.002 vs 0.001)" in message and "seed (7 vs 0)" in message
    assert "dtype (" not in message and "batch_size" not in message and "keep_checkpoints" not in message
    assert message.endswith("only backend, extras, the model size flags and batch-size, max-len, max-tokens, "
                            "block-size, dtype, grad-accum, tensor-parallel-size, init, remat-policy, "
                            "pipeline-parallel-size, pipeline-micro-batches, pipeline-schedule may differ (--force "
                            "reports them anyway)")
    assert "Traceback" not in proc.stderr
    forced = report(results["jax"][0], str(path), "--force", "--format", "csv")
    assert len(list(csv.DictReader(io.StringIO(forced)))) == 2


def test_perturbed_losses_are_flagged_in_the_report(results, tmp_path):
    perturbed = json.loads(json.dumps(results["torch"][1]))
    for entry in perturbed["history"][10:]:
        entry["loss"] *= 1.05
    path = tmp_path / "perturbed.json"
    path.write_text(json.dumps(perturbed))
    data = json.loads(report(results["jax"][0], str(path), "--format", "json"))
    assert data["parity"]["passed"] is False
    assert data["parity"]["pairs"][0]["max_relative_difference"] == pytest.approx(0.05, rel=1e-3)
    assert "NOT within 0.1 %" in report(results["jax"][0], str(path), "--format", "markdown")  # float32's gate


def test_the_report_says_what_each_runs_energy_counts(results, tmp_path):
    """A GPU's counter holds none of the host's work: the report says so beside the figures, once where every run
    counted the same, run by run where they differ (the counts are the counters' own: energy.py's classes)."""
    from mtbench.runner.measurement.energy import NvmlCounter, RaplCounter
    measured = {"reason": None, "processes": 1, "clock": "", "steady": {"steps": 2, "joules": 10.0,
                "joules_per_1k_tokens": 5.0, "avg_watts": 100.0}, "run": {"joules": 20.0, "seconds": 1.0,
                "joules_per_1k_tokens": 5.0, "avg_watts": 20.0}}
    paths = {}
    for backend, counter in (("jax", NvmlCounter), ("torch", NvmlCounter), ("torch-rapl", RaplCounter)):
        result = json.loads(json.dumps(results[backend.split("-")[0]][1]))
        result["energy"] = {**measured, "source": counter.source, "counts": counter.counts}
        paths[backend] = tmp_path / f"{backend}.json"
        paths[backend].write_text(json.dumps(result))
    same = report(str(paths["jax"]), str(paths["torch"]), "--format", "markdown")
    assert "energy (nvml) counts GPUs only (not the host's CPUs, memory or the rest of the machine)" in same
    from mtbench.plugins.reporters.table_reporter import result_rows
    [energy_row] = [row for row in result_rows(json.loads(paths["jax"].read_text())) if row[0] == "energy"]
    assert energy_row[2] == "5.00 J, 100 W (nvml, GPUs only)"  # the table `train` prints
    mixed = report(str(paths["jax"]), str(paths["torch-rapl"]), "--format", "markdown")
    assert "energy of jax (nvml) counts GPUs only" in mixed
    assert "energy of torch (rapl) counts CPU packages only (not DRAM, GPUs or the rest of the machine)" in mixed


def test_runs_profiled_on_a_device_are_set_beside_the_baseline_kind_by_kind(results, tmp_path):
    # Each run's trace as a GPU's would read: 2 steps profiled, the kernels' seconds over both by kind.
    paths = []
    for backend, kinds_ms in (("jax", {"matmul": 20.0, "other": 8.0, "attention": 4.0}),
                              ("torch", {"matmul": 21.0, "attention": 3.0, "other": 6.0, "memory": 1.0})):
        result = json.loads(json.dumps(results[backend][1]))
        total = sum(kinds_ms.values())
        result["profile"] = {"asked": 2, "steps": [40, 41], "directory": f"/runs/{backend}/profile", "files": [],
                             "operations": {"on": "device", "units": 1, "window_s": 0.1, "busy_s": 2 * total / 1e3,
                                            "busy_share": 0.6, "total_s": 2 * total / 1e3,
                                            "top": [{"name": "nvjet_tst_128x64", "seconds": 0.02, "calls": 8,
                                                     "share": 0.5, "kind": "matmul"}],
                                            "kinds": [{"kind": kind, "seconds": 2 * ms / 1e3, "share": ms / total}
                                                      for kind, ms in kinds_ms.items()]}}
        paths.append(tmp_path / f"{backend}.json")
        paths[-1].write_text(json.dumps(result))
    lines = report(*map(str, paths)).splitlines()
    assert "  device busy 32.0 ms a step" in "\n".join(lines)
    against = [line.strip() for line in lines if "against jax, kernels a step by kind" in line]
    assert against == ["against jax, kernels a step by kind: matmul 21.0 vs 20.0 ms (1.05x), other 6.0 vs 8.0 ms "
                       "(0.75x), attention 3.0 vs 4.0 ms (0.75x), memory 1.0 vs 0.0 ms"]


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not valid JSON"),
    ('{"backend": "jax"}', "not an mtbench result (schema_version: missing"),
])
def test_unreadable_inputs_fail_with_one_line(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = run_cli("report", str(path))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr


@pytest.mark.parametrize("change, expected", [
    ({"config": 5}, "config: expected an object"),
    ({"config": {}}, "config.steps: missing"),
    ({"data": 5}, "data: expected an object"),
    ({"history": [1, 2]}, "history: an item is not an object"),
    ({"extras": [5]}, "extras: an item is not a string"),
    # each of these ended in an AttributeError, KeyError or TypeError that named neither the file nor the key
    ({"history": [{}]}, "history[0].step: missing"),
    ({"history": [{"step": 1, "loss": "low"}]}, "history[0].loss: str is not a number or null"),
    ({"devices_used": "two"}, "devices_used: str is not an integer"),  # said "is not <class 'int'>"
    ({"config": {"steps": 3, "seed": 0, "preset": "tiny", "batch_size": 8, "dtype": 32}},
     "config.dtype: int is not a string"),
    ({"machine_load": "busy"}, "machine_load: str is not an object"),
    ({"processes": "two"}, "processes: str is not an object"),
    ({"processes": {"world_size": "two"}}, "processes.world_size: 'two' is not a count (at least 1)"),
    ({"cost": "cheap"}, "cost: str is not an object"),
    ({"host_syncs": "few"}, "host_syncs: str is not an object"),
])
def test_a_result_of_the_wrong_shape_is_named_in_one_line(results, tmp_path, change, expected):
    """JSON that parses but is not shaped as a result: named in one line, never an exception from deep inside."""
    result = {**json.load(open(results["jax"][0])), **change}
    path = tmp_path / "shaped.json"
    path.write_text(json.dumps(result))
    compare = tmp_path / "compare.json"
    compare.write_text(json.dumps({"kind": "mtbench-compare", "runs": 5}))
    later = tmp_path / "later.json"  # a later layout's runs were read as this one's
    later.write_text(json.dumps({"kind": "mtbench-compare", "schema_version": 99, "runs": []}))
    for given, message in ((path, f"shaped.json: not an mtbench result ({expected}"),
                           (compare, "compare.json: not an mtbench compare JSON (runs: not a list of objects)"),
                           (later, "later.json: schema_version: 99 is a compare layout this mtbench does not read "
                                   "(it reads 1); a newer mtbench wrote it")):
        proc = run_cli("report", str(given))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], proc.stderr


def test_what_a_rerun_reads_as_counts_and_paths_is_held_to_its_kind_where_a_result_has_it():
    """A result edited by hand to `initial_weights: 5` or `world_size: 'two'` ended `report` and `rerun` in a
    TypeError; results written before these keys were recorded have none of them, and conform."""
    from mtbench.runner.results.schema import schema_errors
    errors = schema_errors({"config": {"initial_weights": 5, "data_file": ["a"]},
                            "processes": {"machines": 0, "world_size": True, "processes": 2}})
    assert {"config.initial_weights: int is not a path", "config.data_file: list is not a path",
            "processes.machines: 0 is not a count (at least 1)",
            "processes.world_size: True is not a count (at least 1)"} <= set(errors)
    assert not any(error.startswith(("processes.", "config.initial_weights", "config.data_file"))
                   for error in schema_errors({"config": {"data_file": "c.tsv"}, "processes": {"processes": 2}}))


def test_a_result_whose_timing_is_not_a_number_is_named_in_one_line(results, tmp_path):
    """JSON's NaN parses as a float: it showed as 'nan (nan–nan)' in the table and the verdicts."""
    result = json.load(open(results["jax"][0]))
    for key in ("tokens_per_s", "compile_s"):
        broken = json.loads(json.dumps(result))
        broken["timing"][key] = float("nan")
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(broken))
        assert_refused_in_one_line(run_cli("report", str(path), results["torch"][0]),
                                   f"{path}: not an mtbench result (timing.{key}: nan is not a measured time or rate)")


@pytest.mark.parametrize("change, expected", [
    ({"noise_floor": "x"}, "compare.json: not an mtbench compare JSON (noise_floor: not an A/A measure with "
                           "measured_by and figures)"),
    ({"noise_floor": {"figures": {}}}, "noise_floor: not an A/A measure with measured_by and figures"),
    ({"noise_floor": {"measured_by": "A/A", "figures": {"tokens_per_s": {"floor": "x"}}}},
     "noise_floor.figures.tokens_per_s: holds no floor"),
    ({"noise_floor": {"measured_by": "A/A", "figures": {}, "twin_losses": []}},
     "noise_floor.twin_losses: not the twins' largest loss difference over their steps"),
    ({"baseline": ["jax"]}, "compare.json: not an mtbench compare JSON (baseline: list, not a run's label)"),
    # the user gave no --baseline: the file is named
    ({"baseline": "nonesuch"}, "compare.json: its baseline 'nonesuch' is none of the runs: jax, torch"),
])
def test_a_compares_recorded_baseline_and_noise_floor_of_the_wrong_shape_are_named_in_one_line(results, tmp_path,
                                                                                                change, expected):
    """They ended in Python's AttributeError, KeyError or TypeError (exit 1), or blamed a --baseline nobody gave."""
    runs = [{"label": label, "repeat": 1, "result": json.load(open(results[label][0]))} for label in ("jax", "torch")]
    compare = tmp_path / "compare.json"
    compare.write_text(json.dumps({"kind": "mtbench-compare", "runs": runs, **change}))
    assert_refused_in_one_line(run_cli("report", str(compare)), expected)
    # one such file among a history's is left out, named, as a file that is not JSON is
    history = tmp_path / "history"
    history.mkdir()
    (history / "jax.json").write_text(open(results["jax"][0]).read())
    (history / "compare.json").write_text(compare.read_text())
    proc = run_cli("report", "--history", str(history))
    if "baseline" in change and isinstance(change["baseline"], str):
        assert proc.returncode == 0  # a history reads no compare's baseline
    else:
        assert f"left out: {history / 'compare.json'}: not an mtbench compare JSON (" in proc.stdout + proc.stderr, \
            proc.stdout + proc.stderr


@pytest.mark.parametrize("parity, expected", [
    ({"steps": 0, "tolerance": None}, "parity.steps must be at least 1, got 0"),
    ({"steps": 2.5}, "parity.steps must be a whole number of steps, got 2.5"),
    ({"steps": "50"}, "parity.steps must be a whole number of steps, got '50'"),
    ({"steps": 50, "tolerance": -1}, "parity.tolerance must be a positive finite number, got -1"),
    ({"steps": 50, "tolerance": "abc"}, "parity.tolerance must be a positive finite number, got 'abc'"),
    ({"steps": 50, "tolerance": math.inf}, "parity.tolerance must be a positive finite number, got inf"),
    ([50], "parity: list, not the parity check's record"),
])
def test_a_compares_recorded_parity_check_is_held_to_what_its_options_are(tmp_path, parity, expected):
    """`report` and `rerun` of a compare JSON hold its runs to the parity check it recorded: steps of 2.5 or a
    tolerance of 'abc', edited in, ended in a TypeError, and steps of 0 or a tolerance of -1 or inf checked
    nothing, where the options that set them are refused. The record is read before the runs: none are needed."""
    compare = tmp_path / "compare.json"
    compare.write_text(json.dumps({"kind": "mtbench-compare", "runs": [], "parity": parity}))
    assert_refused_in_one_line(run_cli("report", str(compare)),
                               f"compare.json: not an mtbench compare JSON ({expected})")
    if parity == {"steps": 2.5}:
        assert_refused_in_one_line(run_cli("rerun", str(compare), "--out", str(tmp_path / "again.json")), expected)


@pytest.mark.parametrize("args, expected", [
    (["--parity-tolerance", "-1"], "--parity-tolerance must be a positive finite number, got -1.0"),
    (["--parity-tolerance", "nan"], "--parity-tolerance must be a positive finite number, got nan"),
    (["--parity-tolerance", "inf"], "--parity-tolerance must be a positive finite number, got inf"),
    (["--parity-steps", "0"], "--parity-steps must be at least 1, got 0"),
])
def test_report_refuses_parity_settings_that_compare_refuses(results, args, expected):
    assert_refused_in_one_line(run_cli("report", results["jax"][0], results["torch"][0], *args), expected)


def png_size(data):
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_shows_each_runs_loss_curve_and_throughput(results, tmp_path):
    from mtbench.runner.results.plots import comparison_figure, save_figure
    from mtbench.runner.results.report import build_comparison, load_runs

    comparison = build_comparison(load_runs([results["jax"][0], results["torch"][0]]))
    figure = comparison_figure(comparison)
    loss_axes, speed_axes = figure.axes
    lines = loss_axes.get_lines()
    assert [line.get_label() for line in lines] == ["jax · float32", "torch · float32"]
    for line, backend in zip(lines, ("jax", "torch")):
        history = results[backend][1]["history"]
        assert list(line.get_xdata()) == [h["step"] for h in history]
        assert list(line.get_ydata()) == [h["loss"] for h in history]
    bars = speed_axes.patches
    assert [bar.get_height() for bar in bars] == [results[b][1]["timing"]["tokens_per_s"] for b in ("jax", "torch")]
    assert [tick.get_text() for tick in speed_axes.get_xticklabels()] == ["jax\nfloat32", "torch\nfloat32"]
    env = results["jax"][1]["env"]
    if device_kind("jax") == "cpu":
        cores = env["cpu_count"]  # the CPUs the run could use (a test worker's share)
        machine = f"{cores} core" + ("" if cores == 1 else "s")
    else:
        machine = f"{env['device']['count']}x {env['device']['name']}"
    assert machine in figure.get_suptitle() and "preset tiny" in figure.get_suptitle()

    path = tmp_path / "plot.png"
    save_figure(figure, str(path))
    width, height = png_size(path.read_bytes())
    assert (width, height) == (round(12 * 110), round(4.8 * 110))


def test_a_sweep_of_names_draws_its_throughput_panel_a_place_a_name(results, tmp_path):
    """An --init sweep (its values names, as --dtype's and --pipeline-schedule's) ended `report --plot` in a
    TypeError ('>' not supported between 'str' and 'int') and wrote no PNG."""
    from mtbench.runner.results.plots import comparison_figure
    from mtbench.runner.results.report import build_comparison, load_runs
    jax_path, jax = results["jax"]
    paths = [variant(jax, tmp_path / f"{scheme}.json", {"init": scheme, "initial_weights_sha256": scheme})
             for scheme in ("torch", "flax")]
    figure = comparison_figure(build_comparison(load_runs(paths)))
    sweep_axes = figure.axes[-1]
    assert sweep_axes.get_title() == "Throughput against --init"
    assert [tick.get_text() for tick in sweep_axes.get_xticklabels()] == ["flax", "torch"]
    path = tmp_path / "init.png"
    report(*paths, "--plot", str(path))
    assert png_size(path.read_bytes())[0] == round(18 * 110)  # three panels, as a batch sweep's


def test_the_plot_draws_the_validation_losses_of_eval_every_beside_the_training_loss(results):
    """nanoGPT's users read the validation loss beside the training loss; `--eval-every` records it in
    `target.evaluations` (a language model's and a classifier's; translation validates by BLEU alone)."""
    from mtbench.runner.results.plots import comparison_figure
    from mtbench.runner.results.report import LoadedRun, build_comparison

    validated = json.loads(json.dumps(results["jax"][1]))
    losses = {entry["step"]: entry["loss"] for entry in validated["history"]}
    steps = [20, 40, 60]
    validated["config"]["eval_every"] = 20
    validated["target"] = {**(validated.get("target") or {}), "metric": "loss", "eval_every": 20, "evaluations": [
        {"step": step, "loss": losses[step] + 0.05, "training_s": step * 0.1, "seconds": 0.2} for step in steps]}
    figure = comparison_figure(build_comparison([LoadedRun(validated, "jax.json")]))
    training, validation = figure.axes[0].get_lines()
    assert [training.get_label(), validation.get_label()] == ["jax · float32", "jax · float32 · validation"]
    assert list(validation.get_xdata()) == steps
    assert list(validation.get_ydata()) == [losses[step] + 0.05 for step in steps]
    assert validation.get_marker() == "o" and validation.get_color() == training.get_color()
    assert figure.axes[0].get_title() == "Training and validation loss"
    # Translation's evaluations (BLEU and chrF, no loss): nothing to draw beside the training loss.
    validated["target"]["evaluations"] = [{"step": step, "bleu": 0.0, "chrf": 1.5, "training_s": 1.0, "seconds": 0.1}
                                          for step in steps]
    figure = comparison_figure(build_comparison([LoadedRun(validated, "jax.json")]))
    assert [line.get_label() for line in figure.axes[0].get_lines()] == ["jax · float32"]
    assert figure.axes[0].get_title() == "Training loss"


def test_the_table_shows_the_train_accuracy_beside_the_validation_and_test_accuracy(results):
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_markdown
    comparison = build_comparison([LoadedRun(results[backend][1], results[backend][0]) for backend in ("jax", "torch")])
    header, rows = parse_markdown_table(to_markdown(comparison))
    assert [title for title in rows if title.endswith("token accuracy")] == [
        "train token accuracy", "validation token accuracy", "test token accuracy"]
    assert rows["train token accuracy"] == [f"{results[backend][1]['metrics']['train_accuracy']:,.3f}"
                                            for backend in ("jax", "torch")]


def test_the_bleu_and_chrf_signatures_are_said_once_below_the_table(results):
    """A BLEU figure means little without sacrebleu's signature (tokenizer, smoothing, version): said once where
    every run shares it, once a run where they differ."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines, to_markdown
    metrics = results["jax"][1]["metrics"]
    bleu, chrf = metrics["bleu_signature"], metrics["chrf_signature"]
    assert results["torch"][1]["metrics"]["bleu_signature"] == bleu and bleu.startswith("nrefs:1|")
    both = [LoadedRun(results[backend][1], results[backend][0]) for backend in ("jax", "torch")]
    comparison = build_comparison(both)
    assert [line for line in context_lines(comparison) if "signature" in line] == [
        f"BLEU signature: {bleu}", f"chrF signature: {chrf}"]
    markdown = to_markdown(comparison)
    assert f"- BLEU signature: {bleu}\n" in markdown and markdown.count(bleu) == 1
    intl = json.loads(json.dumps(results["torch"][1]))
    intl["metrics"]["bleu_signature"] = bleu.replace("tok:13a", "tok:intl")
    lines = context_lines(build_comparison([both[0], LoadedRun(intl, "torch.json")]))
    assert [line for line in lines if "signature" in line] == [
        f"BLEU signature of jax: {bleu}", f"BLEU signature of torch: {intl['metrics']['bleu_signature']}",
        f"chrF signature: {chrf}"]


def test_user_text_is_shown_as_typed_not_read_as_markup(results, tmp_path):
    """rich's markup took '[red]' out of a corpus named corp[red].tsv, and '[ja]' out of sacrebleu's advice."""
    result = json.loads(json.dumps(results["jax"][1]))
    corpus = tmp_path / "corp[red].tsv"
    result["config"]["data_file"], result["data"]["corpus"] = str(corpus), corpus.name
    advice = ("BLEU tokenized the ja targets with 13a, which takes a sentence written without spaces for one word: "
              "sacrebleu's own tokenizer for ja needs pip install 'sacrebleu[ja]'")
    result["metrics"]["quality_warning"] = advice
    path = tmp_path / "run[bold].json"
    path.write_text(json.dumps(result))
    stdout = report(str(path), "--report", "table")
    assert f"configuration: {corpus}, preset tiny" in stdout  # the line below the comparison table
    assert "corp[red].tsv / tiny" in stdout  # the run's table's corpus row
    assert stdout.count("pip install 'sacrebleu[ja]'") == 2  # the warnings row of each table


def test_report_plot_option_writes_a_png(results, tmp_path):
    path = tmp_path / "cli.png"
    report(results["jax"][0], results["torch"][0], "--plot", str(path))
    width, height = png_size(path.read_bytes())
    assert width > 600 and height > 300


def test_report_plot_draws_again_over_a_png_but_never_over_another_file(results, tmp_path):
    path = tmp_path / "again.png"
    report(results["jax"][0], "--plot", str(path))
    one_run = path.read_bytes()
    report(results["jax"][0], results["torch"][0], "--plot", str(path))  # an earlier plot is drawn anew
    assert path.read_bytes() != one_run and png_size(path.read_bytes())
    # a PNG someone else drew, a matplotlib figure of their own: refused before anything is drawn, byte for byte kept
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    theirs = tmp_path / "theirs.png"
    figure = Figure()
    FigureCanvasAgg(figure)
    figure.subplots().plot([3, 1, 2])
    figure.savefig(theirs)
    before = theirs.read_bytes()
    proc = run_cli("report", results["jax"][0], results["torch"][0], "--plot", str(theirs))
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.strip() == (
        f"Error: --plot {theirs}: already holds a PNG that mtbench did not draw; give another path (it is kept)")
    assert theirs.read_bytes() == before
    kept = tmp_path / "kept.png"  # a result under a PNG's name
    kept.write_text(open(results["jax"][0]).read())
    before = kept.read_bytes()
    proc = run_cli("report", results["jax"][0], results["torch"][0], "--plot", str(kept))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"Error: --plot {kept}: already holds a file that is not a PNG; give another path (it is kept)")
    assert kept.read_bytes() == before
    # the very result the report reads; a PDF's name for a PNG; no path at all (nothing was drawn, exit 0)
    for target, said in ((results["torch"][0], f"--plot {results['torch'][0]}: draws a PNG; give a path ending in "
                                               f".png"),
                         (str(tmp_path / "plot.pdf"), f"--plot {tmp_path / 'plot.pdf'}: draws a PNG; give a path "
                                                      f"ending in .png"),
                         ("", "--plot '': give the path of the PNG to draw"),
                         # under a file; where no file can be made (a report ran, then failed to write it)
                         (f"{results['torch'][0]}/plot.png", f"--plot {results['torch'][0]}/plot.png: cannot write "
                                                             f"into {results['torch'][0]}: it is a file, not a "
                                                             f"directory"),
                         ("/proc/plot.png", "--plot /proc/plot.png: cannot write into /proc: ")):
        before = open(target, "rb").read() if os.path.exists(target) else None
        assert_refused_in_one_line(run_cli("report", results["jax"][0], "--plot", target), said)
        assert (open(target, "rb").read() if os.path.exists(target) else None) == before


def test_plot_without_matplotlib_says_how_to_install_it(results, tmp_path):
    blocker = tmp_path / "matplotlib"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is absent in this test')\n")
    proc = run_cli("report", results["jax"][0], "--plot", str(tmp_path / "p.png"),
                   env={"PYTHONPATH": python_path(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "Error: --plot needs matplotlib, which is not installed " \
                                  "(pip install 'mtbench[plot]')"


@pytest.fixture(scope="module")
def env_json():
    """`mtbench env --json` run as `main()` in a process of its own, as the command runs: {'data': its JSON,
    'imported': whether keras, jax and torch were imported once it had answered}. (Each of its two tests started
    one: 4 CPU s.)"""
    probe = ("import sys; from mtbench.cli import main; sys.argv = ['mtbench', 'env', '--json']\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('keras' in sys.modules, 'jax' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=cli_environment({"MTBENCH_LOAD_PLUGINS": ""}))
    assert proc.returncode == 0, proc.stderr
    return {"data": json.loads(proc.stdout), "imported": proc.stderr.strip().splitlines()[-1]}


def test_env_describes_versions_devices_and_plugins_without_keras(env_json):
    data = env_json["data"]
    assert data["host"]["python"] == ".".join(map(str, sys.version_info[:3]))
    for backend in ("jax", "torch"):
        assert data["backends"][backend]["available"] is True
        assert data["backends"][backend]["device"]["kind"] == device_kind(backend)
        # The framework's own version may carry its build's local label (torch 2.11.0+cu130) where the package
        # metadata does not (2.11.0).
        assert data["backends"][backend]["versions"][backend].split("+")[0] == data["host"][backend].split("+")[0]
    assert {p["name"] for p in data["plugins"]} >= {"jax_backend", "torch_backend", "table_reporter"}
    table = run_cli("env")
    assert table.returncode == 0 and "mtbench env" in table.stdout and "backend" in table.stdout


def test_env_imports_the_frameworks_but_never_keras(env_json):
    assert env_json["imported"] == "False True True"


def variant(result, path, config=None, env=None, tokens_per_s=None):
    """A copy of `result` with configuration and environment entries changed, written to `path`."""
    changed = json.loads(json.dumps(result))
    changed["config"].update(config or {})
    changed["env"].update(env or {})
    if tokens_per_s is not None:
        changed["timing"]["tokens_per_s"] = tokens_per_s
    path.write_text(json.dumps(changed))
    return str(path)


def test_runs_differing_in_a_swept_key_compare_with_labels_naming_it(results, tmp_path):
    """Batch size and max length may differ (a sweep): labels name the value, parity holds only runs of the same
    batches to each other, and the shared configuration leaves them out."""
    from mtbench.runner.results.report import build_comparison, load_runs
    (jax_path, jax), (torch_path, torch) = results["jax"], results["torch"]
    batch = jax["config"]["batch_size"]
    paths = [jax_path, torch_path, variant(jax, tmp_path / "jax-8.json", {"batch_size": 8}),
             variant(torch, tmp_path / "torch-8.json", {"batch_size": 8})]
    comparison = build_comparison(load_runs(paths))
    assert [group.label for group in comparison.groups] == \
        [f"jax:batch-size={batch}", f"torch:batch-size={batch}", "jax:batch-size=8", "torch:batch-size=8"]
    assert comparison.swept == ("batch_size",) and "batch_size" not in comparison.config
    # a step of 8 rows is no faster step than one of 32: only tokens/s is held against the baseline's
    assert {label: sorted(found) for label, found in comparison.verdicts.items()} == {
        f"torch:batch-size={batch}": ["step_s_median", "tokens_per_s"], "jax:batch-size=8": ["tokens_per_s"],
        "torch:batch-size=8": ["tokens_per_s"]}
    assert [(pair.reference, pair.run, pair.dtype) for pair in comparison.parity.pairs] == \
        [(f"jax:batch-size={batch}", f"torch:batch-size={batch}", f"float32, batch-size={batch}"),
         ("jax:batch-size=8", "torch:batch-size=8", "float32, batch-size=8")]
    runs = load_runs(paths)  # compare names its baseline by its run, whatever label the comparison gives it
    assert build_comparison(runs, baseline=runs[3]).baseline.label == "torch:batch-size=8"
    data = json.loads(report(*paths, "--format", "json", "--baseline", "jax:batch-size=8"))
    assert data["baseline"] == "jax:batch-size=8" and "batch_size" not in data["config"]
    # a longer max length sizes other position embeddings: its runs may start from other weights
    longer = variant(jax, tmp_path / "jax-64.json", {"max_len": 64, "initial_weights_sha256": "another"})
    assert [group.label for group in build_comparison(load_runs([jax_path, longer])).groups] == \
        [f"jax:max-len={jax['config']['max_len']}", "jax:max-len=64"]


@pytest.mark.slow  # the session's float16 GPT run, 10 s where no other test made it
def test_a_swept_block_reads_per_run_in_the_configuration_as_a_swept_batch_does(torch_float16_gpt_run):
    """The configuration line (and the plot's title, which is it) of a block-size sweep named the first run's
    block ('block 32') beside 'batch 8' shared; the JSON's shared configuration held its max length."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines, to_json_dict
    runs = []
    for block in (32, 16):
        result = json.loads(json.dumps(torch_float16_gpt_run))
        result["config"].update(block_size=block, max_len=block)
        runs.append(LoadedRun(result, f"block-{block}.json"))
    comparison = build_comparison(runs)
    assert comparison.swept == ("block_size",)
    config = torch_float16_gpt_run["config"]
    corpus = config.get("data_file") or torch_float16_gpt_run["data"]["corpus"]
    assert context_lines(comparison)[0].startswith(f"configuration: {corpus}, preset tiny, 6 steps x batch 8, block "
                                                   f"per run, byte tokens (vocabulary 256), seed {config['seed']}, ")
    # runs of other tokens (held with --force) say so: neither their tokens/s nor their perplexities compare
    pieces = json.loads(json.dumps(runs[1].result))
    pieces["data"]["tokenizer"] = {"type": "sentencepiece-unigram", "vocab_size": 500, "fingerprint": "spm-500"}
    forced = build_comparison([runs[0], LoadedRun(pieces, "spm.json")], force=True)
    assert ", tokens per run, " in context_lines(forced)[0]
    assert not {"max_len", "block_size"} & set(to_json_dict(comparison)["config"])
    # the plot's sweep panel draws tokens/s against the block (the max length it sets is no second key)
    from mtbench.runner.results.plots import sweep_key, sweep_series
    assert sweep_key(comparison) == "block_size"
    (points,) = sweep_series(comparison, "block_size").values()  # one line: the run at each block
    assert [value for value, _ in points] == [16, 32]


def test_runs_of_other_versions_or_interpreters_are_never_repeats(results, tmp_path):
    from mtbench.runner.results.report import build_comparison, load_runs
    jax_path, jax = results["jax"]
    older = variant(jax, tmp_path / "older.json", env={"backend_versions": {"jax": "0.4.30", "jaxlib": "0.4.30"}})
    groups = build_comparison(load_runs([jax_path, older])).groups
    assert [len(group.runs) for group in groups] == [1, 1]
    mtbench = f"mtbench {jax['env']['mtbench']}" + (f" (git {jax['env']['mtbench_git_commit'][:12]}"
                                                     if jax["env"]["mtbench_git_commit"] else "")
    assert groups[1].label.startswith("jax (jax 0.4.30, jaxlib 0.4.30, keras " + jax["env"]["keras"] +
                                      f", python {jax['env']['python']}, {mtbench}")
    assert groups[1].versions() != groups[0].versions()
    # On a GPU, another cuDNN runs other kernels: its runs are no repeats of these either.
    on_gpu = {"device": {**jax["env"]["device"], "kind": "gpu"}, "cuda_version": "12.8"}
    cudnns = [variant(jax, tmp_path / f"cudnn-{version}.json", env={**on_gpu, "cudnn_version": version})
              for version in ("9.8.0", "9.10.2")]
    groups = build_comparison(load_runs(cudnns)).groups
    assert [len(group.runs) for group in groups] == [1, 1]
    assert "cuDNN 9.8.0" in groups[0].label and "cuDNN 9.10.2" in groups[1].label
    elsewhere = variant(jax, tmp_path / "elsewhere.json", env={"python_executable": "/opt/venv-old/bin/python"})
    labels = [group.label for group in build_comparison(load_runs([jax_path, elsewhere])).groups]
    this = os.path.basename(os.path.dirname(os.path.dirname(jax["env"]["python_executable"])))
    assert labels == [f"jax:python={this}", "jax:python=venv-old"]
    header, rows = parse_markdown_table(report(jax_path, older, "--format", "markdown"))
    assert rows["versions"][1].startswith("jax 0.4.30, jaxlib 0.4.30, keras ")


def test_baseline_is_named_as_the_table_names_it_or_without_the_model_family():
    from mtbench import MtbenchError
    from mtbench.runner.results.report import baseline_label
    labels = ["torch:model=gpt", "torch+torch-compile:model=gpt", "jax:model=gpt,batch-size=8"]
    assert baseline_label("torch+torch-compile:model=gpt", labels) == "torch+torch-compile:model=gpt"
    assert baseline_label("torch", labels) == "torch:model=gpt"
    assert baseline_label("jax:batch-size=8", labels) == "jax:model=gpt,batch-size=8"
    assert baseline_label("jax", labels) == "jax:model=gpt,batch-size=8"  # the one run of jax
    with pytest.raises(MtbenchError, match="^--baseline 'jax:batch-size=16' is none of the runs: torch:model=gpt, "):
        baseline_label("jax:batch-size=16", labels)
    with pytest.raises(MtbenchError, match="is none of the runs"):  # two families' runs: the name must say which
        baseline_label("jax", ["jax:model=gpt", "jax:model=marian"])
    # A mistyped path (no .json, which reads as a file) is said to be no file either, not only no label.
    with pytest.raises(MtbenchError, match="^--baseline 'old/r' is none of the runs: torch:model=gpt, .*; nor is it "
                                           "a file: no such file or directory$"):
        baseline_label("old/r", labels)
    # A sweep names a run by the keys another run sets (grad-accum=1 here): the entry as --matrix gave it names it.
    swept = ["torch:batch-size=64,grad-accum=1", "torch:batch-size=32,grad-accum=2", "jax:batch-size=32,grad-accum=2"]
    assert baseline_label("torch:batch-size=64", swept) == "torch:batch-size=64,grad-accum=1"
    assert baseline_label("jax", swept) == "jax:batch-size=32,grad-accum=2"
    for ambiguous in ("torch", "torch:grad-accum=1,batch-size=32", "torch+ddp:batch-size=64"):
        with pytest.raises(MtbenchError, match="is none of the runs"):
            baseline_label(ambiguous, swept)


@pytest.mark.slow  # the session's float16 GPT run, 10 s where no other test made it
def test_a_language_model_given_the_default_tokenizer_compares_with_one_given_it_by_name(torch_float16_gpt_run):
    """`--tokenizer byte` trains the run the default trains (both record the byte tokenizer in `data`): report held
    the two apart, 'tokenizer ('byte' vs None)'; another tokenizer still is."""
    from mtbench import MtbenchError
    from mtbench.runner.results.report import LoadedRun, check_comparable
    default = json.loads(json.dumps(torch_float16_gpt_run))
    assert default["config"]["tokenizer"] is None and default["data"]["tokenizer"]["type"] == "byte"
    named = json.loads(json.dumps(default))
    named["config"]["tokenizer"] = "byte"
    check_comparable([LoadedRun(default, "default.json"), LoadedRun(named, "named.json")])
    named["config"]["tokenizer"] = named["data"]["tokenizer"]["type"] = "char"
    with pytest.raises(MtbenchError, match=r"in tokenizer \('char' vs 'byte'\)"):
        check_comparable([LoadedRun(default, "default.json"), LoadedRun(named, "char.json")])


def test_a_run_is_named_by_its_label_or_as_its_compare_asked_for_it(tiny_runs, tmp_path):
    """A dtype sweep beside runs of the device's dtype: compare labels them as --matrix asked (`torch:dtype=auto`,
    which its --baseline takes), the table by what ran (`torch:dtype=float32`). `report --baseline` refused the
    compare's own label; it takes either."""
    from mtbench import MtbenchError
    from mtbench.runner.results.report import COMPARE_KIND, build_comparison, load_runs
    jax, torch = tiny_runs["jax"]["result"], tiny_runs["torch"]["result"]
    bfloat16 = {**jax, "config": {**jax["config"], "dtype": "mixed_bfloat16"}}
    runs = [("jax:dtype=auto", jax), ("torch:dtype=auto", torch), ("jax:dtype=mixed_bfloat16", bfloat16)]
    path = tmp_path / "swept.json"
    path.write_text(json.dumps({"kind": COMPARE_KIND, "runs": [{"label": label, "repeat": 1, "result": result}
                                                                for label, result in runs]}))
    loaded = load_runs([str(path)])
    for given in ("torch:dtype=auto", "torch:dtype=float32"):
        assert build_comparison(loaded, baseline=given).baseline.label == "torch:dtype=float32", given
    shown = json.loads(report(str(path), "--format", "json", "--baseline", "torch:dtype=auto"))
    assert shown["baseline"] == "torch:dtype=float32"
    with pytest.raises(MtbenchError, match="^--baseline 'torch:dtype=bfloat16' is none of the runs: "):
        build_comparison(loaded, baseline="torch:dtype=bfloat16")


def test_a_single_runs_table_shows_its_token_accuracy_on_every_split(tiny_runs):
    """The train split's accuracy was in the result and the comparison's table, not in `--report table`'s."""
    from mtbench.plugins.reporters.table_reporter import result_rows
    metrics = tiny_runs["jax"]["result"]["metrics"]
    rows = {figure: value for _, figure, value in result_rows(tiny_runs["jax"]["result"])}
    assert rows["token accuracy train / val / test"] == " / ".join(
        f"{metrics[key]:,.3f}" for key in ("train_accuracy", "val_accuracy", "test_accuracy"))


def test_one_result_reads_as_one_run_with_its_intervals_not_as_a_comparison_against_itself(results):
    """`mtbench report RESULT.json` of one run printed the comparison's table with one column: 'tokens/s vs jax
    1.00x (baseline)' and 'parity jax: not checked, no other float32 run', a comparison against nothing. One run
    reads as one run: its figures, the speed ones with their 95 % intervals, and its configuration."""
    from mtbench.figures import FIGURES_BY_KEY
    from mtbench.runner.results import verdicts as stats
    jax_path, jax = results["jax"]
    markdown = report(jax_path, "--format", "markdown")
    header, rows = parse_markdown_table(markdown)
    assert header == ["figure", "jax"]
    assert [title for title in rows if " vs " in title or "break-even" in title] == []
    assert not re.search("baseline|parity|noise floor|ranking", markdown), markdown
    windows = len(stats.steady_windows(jax["history"]))
    # A tiny run's few windows may be too few to resample (`verdicts.figure_interval_gap`): then no interval is stated.
    gap = stats.figure_interval_gap([jax])
    for key in stats.WINDOW_FIGURES:
        figure = FIGURES_BY_KEY[key]
        _, low, high = stats.figure_interval(key, [jax])
        said = ("95 % interval: none, too few steady timing windows to resample" if gap else
                f"95 % interval {figure.text(low)}–{figure.text(high)}")
        assert rows[figure.title] == [f"{figure.text(figure.value(jax))} ({said})"]
    assert rows["compile (s)"] == [FIGURES_BY_KEY["compile_s"].text(jax["timing"]["compile_s"])]
    assert rows["runs (repeats)"] == ["1"]
    corpus = jax["data"]["corpus"]
    assert f"- configuration: {corpus}, preset tiny, 60 steps x batch 32, max-len 48, " in markdown
    if gap:
        assert f"- 95 % intervals: none: {windows} steady timing windows in a run: too few to resample" in markdown
    else:
        assert f"- 95 % intervals: a bootstrap of the run's {windows} steady timing windows\n" in markdown
        assert "- interval warning: 1 repeat: the intervals count only the noise within each run, not " in markdown
    table = run_cli("report", jax_path, env={"COLUMNS": "250"})
    assert table.returncode == 0, table.stderr
    assert "mtbench report: jax" in table.stdout and "comparison" not in table.stdout
    assert not re.search(r"vs jax|\(baseline\)|parity", table.stdout), table.stdout
    # Two results are still a comparison, with verdicts against the baseline.
    both = report(jax_path, results["torch"][0], "--format", "markdown")
    assert "| tokens/s vs jax (geometric means over repeats) | 1.00x (baseline) |" in both


def test_csv_rows_carry_the_configuration_that_tells_a_sweeps_runs_apart(results, tmp_path):
    """The CSV held each run's figures under its label alone: in a spreadsheet a sweep's rows could not be sorted or
    filtered by batch size, block, preset or steps. Each row carries the run's own configuration, as its JSON
    summary entry does."""
    (jax_path, jax), (torch_path, torch) = results["jax"], results["torch"]
    paths = [jax_path, torch_path, variant(jax, tmp_path / "jax-8.json", {"batch_size": 8}),
             variant(torch, tmp_path / "torch-8.json", {"batch_size": 8})]
    rows = list(csv.DictReader(io.StringIO(report(*paths, "--format", "csv"))))
    assert [(row["backend"], row["extras"], row["dtype"], row["batch_size"]) for row in rows] == [
        ("jax", "", "float32", "32"), ("torch", "", "float32", "32"), ("jax", "", "float32", "8"),
        ("torch", "", "float32", "8")]
    config = jax["config"]
    for row in rows:
        assert {key: row[key] for key in ("task", "corpus", "model_name", "preset", "parameters", "max_len",
                                          "block_size", "max_tokens", "grad_accum", "d_model", "steps", "epochs",
                                          "seed", "init")} == {
            "task": "translation", "corpus": jax["data"]["corpus"], "model_name": "transformer", "preset": "tiny",
            "parameters": str(jax["model"]["parameters"]), "max_len": "48", "block_size": "", "max_tokens": "",
            "grad_accum": "1", "d_model": str(jax["model"]["d_model"]), "steps": "60", "epochs": "", "seed": "0",
            "init": config["init"]}
    data = json.loads(report(*paths, "--format", "json"))
    assert [(entry["label"], entry["config"]["batch_size"], entry["config"]["steps"]) for entry in data["summary"]] == [
        ("jax:batch-size=32", 32, 60), ("torch:batch-size=32", 32, 60), ("jax:batch-size=8", 8, 60),
        ("torch:batch-size=8", 8, 60)]


def scored_language_model(result, blocks):
    """`result`, a measure-only GPT run, as a run that scored `blocks` blocks of its byte test split records it
    (`LanguageModelEvaluator.scores`: a byte a token)."""
    scored = json.loads(json.dumps(result))
    scored["config"].update(measure_only=False, test_size=blocks)
    del scored["metrics"]["skipped"]
    predicted = blocks * scored["config"]["max_len"]
    scored["metrics"].update(test_loss=3.97, test_accuracy=0.08, test_perplexity=53.0, test_bits_per_byte=5.73,
                             test_tokens_evaluated=predicted, test_bytes_evaluated=predicted)
    return scored


@pytest.mark.slow  # the session's float16 GPT run, 10 s where no other test made it
def test_a_language_models_test_figures_say_how_much_of_the_test_split_they_cover(torch_float16_gpt_run):
    """`--test-size 8` scores 8 blocks from the test split's start: the table and the lines below it gave their bits
    per byte and perplexity as if of the whole split, where translation says 'test sentences scored: 16 of 64'."""
    from mtbench.plugins.reporters.table_reporter import result_rows
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines
    result = scored_language_model(torch_float16_gpt_run, 8)
    split_bytes, split_tokens = result["data"]["bytes"]["test"], result["data"]["tokens"]["test"]
    scored = 8 * result["config"]["max_len"]
    assert split_bytes > 100 * scored and result["data"]["tokenizer"]["type"] == "byte"
    share = f"{100 * scored / split_bytes:.2f} %"
    expected = f"{scored:,} of {split_bytes:,} ({share})"  # a byte a token: the tokens not said again
    rows = {figure: value for _, figure, value in result_rows(result)}
    assert rows["test bytes scored"] == expected
    assert f"test bytes scored: {expected}" in context_lines(build_comparison([LoadedRun(result, "gpt.json")]))
    # runs that scored other shares of the split (held with --force): each run's said
    longer = scored_language_model(torch_float16_gpt_run, 16)
    longer["backend"] = "jax"
    lines = context_lines(build_comparison([LoadedRun(result, "torch.json"), LoadedRun(longer, "jax.json")],
                                           force=True))
    assert [line for line in lines if line.startswith("test bytes scored")] == [
        f"test bytes scored of torch:model=gpt: {expected}",
        f"test bytes scored of jax:model=gpt: {2 * scored:,} of {split_bytes:,} ({200 * scored / split_bytes:.2f} %)"]
    # the whole split, and token files whose bytes are not known: their tokens alone
    whole = json.loads(json.dumps(result))
    whole["metrics"].update(test_tokens_evaluated=split_tokens, test_bytes_evaluated=split_bytes)
    assert {f: v for _, f, v in result_rows(whole)}["test bytes scored"] == (
        f"{split_bytes:,} of {split_bytes:,} (the whole split)")
    ids = json.loads(json.dumps(result))
    ids["data"]["bytes"], ids["metrics"]["test_bytes_evaluated"] = None, None
    assert {f: v for _, f, v in result_rows(ids)}["test tokens scored"] == f"{scored:,} of {split_tokens:,} ({share})"
    # a measure-only run scored nothing: no such line
    assert not any("scored" in line for line in
                   context_lines(build_comparison([LoadedRun(torch_float16_gpt_run, "measured.json")])))


def test_the_configuration_line_names_the_optimizer_recipe_and_the_dropout(results):
    """A published comparison named steps, batch, length and seed, but not the learning rate, its schedule, Adam's
    betas, the weight decay, the clipping or the dropout (the `char` preset brings 0.2 unasked)."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines
    jax, torch = (json.loads(json.dumps(results[backend][1])) for backend in ("jax", "torch"))
    recipe = jax["compile_options"]["optimizer_recipe"]
    assert recipe == torch["compile_options"]["optimizer_recipe"] and recipe["decay_steps"] == 1
    dropout = jax["model"]["dropout"]
    trained = (f", seed 0, greedy decoding, AdamW peak learning rate 0.001, warm-up {recipe['warmup_steps']} of 60 "
               f"steps, cosine decay to 0.1 of the peak over 1 step (not begun: the last step at the peak), betas "
               f"0.9/0.98, epsilon 1e-09, weight decay 0.01 on every weight, clip each gradient to norm 1, dropout "
               f"{dropout:g}")
    both = [LoadedRun(jax, "jax.json"), LoadedRun(torch, "torch.json")]
    assert context_lines(build_comparison(both))[0].endswith(trained)
    # the char preset's dropout, and runs given other settings (held with --force): each run's said
    for result in (jax, torch):
        result["model"]["dropout"] = 0.2
    torch["config"]["weight_decay"] = 0.1
    torch["compile_options"]["optimizer_recipe"].update(weight_decay=0.1, decay="matrices", clip="global")
    line = context_lines(build_comparison(both, force=True))[0]
    assert line.endswith(", weight decay per run (jax 0.01 on every weight; torch 0.1 on matrices), clip per run "
                         "(jax each gradient to norm 1; torch global norm 1), dropout 0.2"), line
    # a result from before the recipe was recorded: what its configuration says, and that the rest is not known
    for result in (jax, torch):
        del result["compile_options"]["optimizer_recipe"]
    line = context_lines(build_comparison(both, force=True))[0]
    assert line.endswith(", seed 0, greedy decoding, AdamW peak learning rate 0.001, optimizer recipe not recorded, "
                         "dropout 0.2"), line


def test_a_checkpoints_comparison_names_the_checkpoint_not_the_preset(results):
    """`--model marian:DIR` trains the checkpoint's shape whatever `--preset` says: the configuration line read
    'preset small' of a 74 M parameter model."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, context_lines
    runs = []
    for backend in ("jax", "torch"):
        result = json.loads(json.dumps(results[backend][1]))
        result["config"]["model_name"] = "marian:/models/opus-mt-en-de"
        result["model"].update(family="marian", path="/models/opus-mt-en-de/", init="pretrained", encoder_layers=6,
                               decoder_layers=6, d_model=512, parameters=74_410_496)
        runs.append(LoadedRun(result, f"{backend}.json"))
    line = context_lines(build_comparison(runs))[0]
    corpus = results["jax"][1]["data"]["corpus"]
    assert line.startswith(f"configuration: {corpus}, checkpoint opus-mt-en-de (6 encoder and 6 decoder layers, "
                           f"d-model 512, 74,410,496 parameters), 60 steps x batch 32, "), line
    assert "preset" not in line


# What distributed runs recorded of their collectives (a compare of the tiny GPT, 2 devices, on 2026-12-06).
RECORDED_COLLECTIVES = {
    ("jax", "tensor-parallel"): {"collectives_per_step": {"all-reduce": 28}, "activation_all_reduces_per_step": 8,
                                 "batch_all_gathers_per_step": 0},
    ("torch", "tensor-parallel"): {"collectives": "gloo", "collectives_per_step": {"all-gather": 1, "all-reduce": 9},
                                   "activation_all_reduces_per_step": 8, "batch_all_gathers_per_step": 1},
    ("jax", "pipeline-parallel"): {"collectives_per_step": {"all-gather": 2, "all-reduce": 41,
                                                            "collective-permute": 45}},
    ("torch", "pipeline-parallel"): {"collectives": "gloo", "messages_per_step": {
        "all-gather": 1, "all-reduce": 2, "broadcast": 1, "receive": 8, "send": 8}},
    ("jax", "fsdp"): {"gather_dtype": "float32", "collectives_per_step": {"all-gather": 3, "all-reduce": 39,
                                                                          "reduce-scatter": 3},
                      "collective_instructions_per_step": {"all-gather": 3, "all-reduce": 3, "reduce-scatter": 3}},
    ("torch", "fsdp"): {"collectives": "gloo", "gather_dtype": "float32"},
    ("torch", "ddp"): {"collectives": "gloo", "gradient_bucket_bytes": 482304, "gradient_buckets": 1},
    ("jax", "data-parallel"): {"devices": 2},
}


def test_the_table_shows_each_runs_collectives_a_step(results):
    """Each distributed run records the collectives of a step (`extras_record`), which no table showed: the README
    promises them counted on both sides."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_json_dict, to_markdown
    runs = []
    for (backend, extra), record in RECORDED_COLLECTIVES.items():
        result = json.loads(json.dumps(results[backend][1]))
        result["extras"], result["extras_record"] = [extra], {extra: record}
        result["processes"] = {**(result.get("processes") or {}), "spanned_by": [extra]}
        runs.append(LoadedRun(result, f"{backend}-{extra}.json"))
    why = "the counted step replayed CUDA graphs, whose collectives the host does not dispatch"
    replayed = json.loads(json.dumps(runs[1].result))
    replayed["extras"] = ["tensor-parallel", "torch-compile"]
    replayed["extras_record"] = {"tensor-parallel": {"collectives_per_step": None, "collectives_why_not": why},
                                 "torch-compile": {"mode": "reduce-overhead"}}
    comparison = build_comparison([*runs, LoadedRun(replayed, "replayed.json")])
    header, rows = parse_markdown_table(to_markdown(comparison))
    assert header[1:] == [f"{backend}+{extra}" for backend, extra in RECORDED_COLLECTIVES] + [
        "torch+tensor-parallel+torch-compile"]
    jax, torch = "(in the compiled step)", "(dispatched over gloo, torch's profiler)"
    assert rows["collectives a step"] == [
        f"all-reduce 28 {jax}", f"all-gather 1, all-reduce 9 {torch}",
        f"all-gather 2, all-reduce 41, collective-permute 45 {jax}",
        f"all-gather 1, all-reduce 2, broadcast 1, receive 8, send 8 (process 0's, {torch[1:]}",
        f"all-gather 3, all-reduce 3 (39 arrays), reduce-scatter 3 {jax}", "not counted by extra 'fsdp'",
        "all-reduce 1 (DDP's gradient buckets)", "not counted by extra 'data-parallel'", f"not counted: {why}"]
    assert [entry["collectives"] for entry in to_json_dict(comparison)["summary"]][:2] == [
        f"all-reduce 28 {jax}", f"all-gather 1, all-reduce 9 {torch}"]
    # runs that count none have no such row
    plain = build_comparison([LoadedRun(results[backend][1], results[backend][0]) for backend in ("jax", "torch")])
    assert "collectives a step" not in parse_markdown_table(to_markdown(plain))[1]


# ---- on hand-made results, no training ----------------------------------------------------------------------------

def stepping_slower(result, factor):
    """A copy of `result` whose steady steps each took `factor` times as long."""
    made = copy.deepcopy(result)
    for entry in made["history"]:
        entry["seconds"] *= 1.0 if entry["first_of_shape"] else factor
    return made


def hand_made(backend="jax", commit="2f34ac26cf19" + "0" * 28, seconds=0.015, load=None, **config):
    """A language model's result as a report reads it, its steps and figures made up: windows of 4 steps whose times
    scatter a little, a recipe whose warm-up takes all but its last step, and the model it built."""
    steps = [{"step": 1, "seconds": 1.5, "window_steps": 1, "tokens": 512, "shape": [8, 64], "first_of_shape": True,
              "loss": 5.5}]
    for window in range(12):
        for _ in range(4):
            steps.append({"step": len(steps) + 1, "seconds": seconds * (1 + 0.01 * (window % 3)), "window_steps": 4,
                          "tokens": 512, "shape": [8, 64], "first_of_shape": False, "loss": 5.5 - 0.01 * len(steps)})
    steady = [step["seconds"] for step in steps[1:]]
    return {
        "backend": backend, "extras": [], "extras_record": {}, "train_step": f"{backend}-step",
        "config": {"task": "language-modelling", "dtype": "float32", "steps": len(steps), "seed": 0, "preset": "tiny",
                   "dataset": "bible-en-fr", "max_len": 64, "batch_size": 8, "model_name": "gpt",
                   "learning_rate": 0.001, **config},
        "compile_options": {"optimizer_recipe": {
            "beta_1": 0.9, "beta_2": 0.95, "epsilon": 1e-08, "weight_decay": 0.1, "decay": "matrices",
            "min_lr_ratio": 0.1, "clip": "global", "clip_norm": 1.0, "learning_rate": 0.001,
            "warmup_steps": len(steps) - 1, "decay_steps": 1, "alpha": 0.1}},
        "model": {"family": "gpt", "path": None, "parameters": 120576, "d_model": 64, "num_heads": 2,
                  "encoder_layers": 0, "decoder_layers": 2, "ff_dim": 256, "max_len": 64, "dropout": 0.0,
                  "dtype_policy": "float32", "attention": {"causal": "xla (unfused)"}},
        "data": {"corpus": "bible-en-fr", "tokenizer": {"type": "byte", "vocab_size": 256, "fingerprint": "byte"}},
        "env": {"device": {"kind": "cpu", "name": "CPU"}, "cpu_count": 2, "keras": "3", "python": "3.11",
                "mtbench": "0.1.0", "mtbench_git_commit": commit},
        "timing": {"compile_s": 1.5 - seconds, "step_s_median": seconds, "steady_s": sum(steady),
                   "steady_steps": len(steady), "step_s_p90": seconds * 1.02,
                   "tokens_per_s": 512 * len(steady) / sum(steady), "train_s": None, "total_s": None},
        "memory": {"peak_host_bytes": None, "peak_device_bytes": None},
        "metrics": {}, "history": steps, "target": None,
        **({"machine_load": {"cores": 2, "other_processes_percent": load, "steal_percent": 0.0,
                             "before_training": {"load_average": [2.5, 2, 2]},
                             "after_training": {"load_average": [2.8, 2, 2]}, "gpu_other_processes": None}}
           if load is not None else {}),
    }


def test_report_of_a_compare_json_says_its_runs_trained_with_different_mtbench_code(tmp_path, monkeypatch):
    """`compare` warns of runs that trained with different mtbench code (a checkout edited while it ran); `mtbench
    report C.json` of its file dropped the warning, keeping only a stopped comparison's."""
    from mtbench.runner.results import report as reporting
    monkeypatch.setattr(reporting, "check_result", lambda result, source: None)  # made-up results: no schema here
    commit = "2f34ac26cf19" + "0" * 28
    entries = [{"label": backend, "repeat": 1, "result": hand_made(backend, tree)}
               for backend, tree in (("jax", commit), ("torch", commit + "-dirty"))]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"kind": "mtbench-compare", "schema_version": 1, "status": "completed",
                                "runs": entries, "aa_runs": []}))
    expected = ("the runs trained with different mtbench code (jax: mtbench 0.1.0 (git 2f34ac26cf19); torch: mtbench "
                "0.1.0 (git 2f34ac26cf19-dirty)): the checkout changed while the comparison ran")
    comparison = reporting.build_comparison(reporting.load_runs([str(path)]))
    for entry in reporting.to_json_dict(comparison)["summary"]:
        assert any(warning.startswith(expected) for warning in entry["warnings"]), entry["warnings"]
    assert expected in reporting.to_markdown(comparison)
    entries[1]["result"]["env"]["mtbench_git_commit"] = commit
    path.write_text(json.dumps({"kind": "mtbench-compare", "schema_version": 1, "status": "completed",
                                "runs": entries}))
    assert "mtbench code" not in reporting.to_markdown(reporting.build_comparison(reporting.load_runs([str(path)])))


def test_csv_configuration_columns_hold_the_configuration_that_ran():
    """The CSV's configuration held the flags alone: `--preset tiny` left layers, d-model, heads, dropout and the
    block empty, a checkpoint's run read `preset small`, and the optimizer's settings had no column."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_csv
    gpt = hand_made()
    row = next(csv.DictReader(io.StringIO(to_csv(build_comparison([LoadedRun(gpt, "gpt.json")])))))
    assert {key: row[key] for key in ("preset", "checkpoint", "layers", "encoder_layers", "decoder_layers", "d_model",
                                      "heads", "ff_dim", "dropout", "parameters", "block_size", "learning_rate",
                                      "warmup_steps", "decay_steps", "min_lr_ratio", "beta_1", "beta_2", "epsilon",
                                      "weight_decay", "weight_decay_on", "clip", "clip_norm")} == {
        "preset": "tiny", "checkpoint": "", "layers": "2", "encoder_layers": "0", "decoder_layers": "2",
        "d_model": "64", "heads": "2", "ff_dim": "256", "dropout": "0.0", "parameters": "120576", "block_size": "64",
        "learning_rate": "0.001", "warmup_steps": "48", "decay_steps": "1", "min_lr_ratio": "0.1", "beta_1": "0.9",
        "beta_2": "0.95", "epsilon": "1e-08", "weight_decay": "0.1", "weight_decay_on": "matrices", "clip": "global",
        "clip_norm": "1.0"}
    marian = hand_made(task="translation", preset="small", model_name="marian:/models/opus-mt-en-de")
    marian["model"].update(family="marian", path="/models/opus-mt-en-de/", encoder_layers=6, decoder_layers=6,
                           d_model=512, parameters=74_410_496)
    row = next(csv.DictReader(io.StringIO(to_csv(build_comparison([LoadedRun(marian, "marian.json")])))))
    assert (row["preset"], row["checkpoint"], row["layers"], row["block_size"]) == (
        "", "opus-mt-en-de (6 encoder and 6 decoder layers, d-model 512, 74,410,496 parameters)", "6", "")


def test_a_verdict_on_a_loaded_machine_says_so_in_the_csv_too():
    """The table's verdict read 'slower, loaded machine: not reliable', the CSV's `slower` alone; so did the gate's."""
    from types import SimpleNamespace
    from mtbench.runner.results import regression
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_csv, to_json_dict
    runs = [LoadedRun(hand_made("jax", load=74.0), "jax.json"),
            LoadedRun(hand_made("torch", seconds=0.03), "torch.json")]
    comparison = build_comparison(runs)
    row = list(csv.DictReader(io.StringIO(to_csv(comparison))))[1]
    verdict = to_json_dict(comparison)["verdicts"][0]
    assert verdict["loaded"] == ["jax:model=gpt"]
    assert (row["tokens_per_s_verdict"], row["tokens_per_s_verdict_loaded"]) == (verdict["call"], "jax:model=gpt")
    held = comparison.verdicts["torch:model=gpt"]["tokens_per_s"]
    gate = regression.to_csv(SimpleNamespace(changes=[regression.Change("torch", "tokens_per_s", 1.0, 2.0, held)]))
    row = next(csv.DictReader(io.StringIO(gate)))
    assert (row["verdict"], row["verdict_loaded"]) == (held.call, "jax:model=gpt")


def test_the_collectives_row_says_what_each_backend_counted():
    """JAX counts the collectives of its compiled step, torch what its profiler saw dispatched: 'all-reduce 28'
    beside 'all-reduce 9' read as one measure. An extra that spans the devices and counts none is named."""
    from mtbench.runner.results.report import collectives_text
    counted = {}
    for (backend, extra), record in RECORDED_COLLECTIVES.items():
        result = {"backend": backend, "extras": [extra], "extras_record": {extra: record},
                  "processes": {"spanned_by": [extra]}}
        counted[backend, extra] = collectives_text(result)
    assert counted == {
        ("jax", "tensor-parallel"): "all-reduce 28 (in the compiled step)",
        ("torch", "tensor-parallel"): "all-gather 1, all-reduce 9 (dispatched over gloo, torch's profiler)",
        ("jax", "pipeline-parallel"): "all-gather 2, all-reduce 41, collective-permute 45 (in the compiled step)",
        ("torch", "pipeline-parallel"): "all-gather 1, all-reduce 2, broadcast 1, receive 8, send 8 (process 0's, "
                                        "dispatched over gloo, torch's profiler)",
        # JAX's instructions, as torch's dispatched calls are counted, with the arrays XLA combined into them.
        ("jax", "fsdp"): "all-gather 3, all-reduce 3 (39 arrays), reduce-scatter 3 (in the compiled step)",
        ("torch", "fsdp"): "not counted by extra 'fsdp'",
        ("torch", "ddp"): "all-reduce 1 (DDP's gradient buckets)",
        ("jax", "data-parallel"): "not counted by extra 'data-parallel'"}


def test_the_configuration_line_says_how_far_the_schedule_went_in_the_runs_steps():
    """'warm-up 5 steps, cosine decay to 0.1 of the peak over 1 step' of a 6-step run whose last update applied the
    peak: no decay ran. The warm-up is said of the run's steps, and how far the decay went."""
    from mtbench.runner.results.report import training_settings
    result = hand_made()  # 49 steps, 48 of warm-up: the last update at the peak
    settings = training_settings(result)
    assert (settings["warm-up"], settings["cosine decay"]) == (
        "48 of 49 steps", "to 0.1 of the peak over 1 step (not begun: the last step at the peak)")
    # a decay that ran: 4 warm-up steps, 6 of decay, the last update 5 into it; computed from the recipe where the
    # history does not record the rate, else the rate recorded
    result["compile_options"]["optimizer_recipe"].update(warmup_steps=4, decay_steps=6)
    result["history"] = result["history"][:10]
    assert training_settings(result)["cosine decay"] == "to 0.1 of the peak over 6 steps (reaching 0.16 of the peak)"
    result["history"][-1]["learning_rate"] = 0.0005
    assert training_settings(result)["cosine decay"] == "to 0.1 of the peak over 6 steps (reaching 0.5 of the peak)"


def test_the_lines_below_the_table_say_each_thing_once():
    """The parity class named the dtype twice where --dtype was swept ('float32, dtype=float32'), the coverage line
    a byte tokenizer's tokens as its bytes again, and token files' ids read 'token-ids tokens'."""
    from types import SimpleNamespace
    from mtbench.figures import split_scored_text
    from mtbench.runner.results.report import parity_class, tokens_text
    assert parity_class(hand_made(dtype="float32"), ("dtype",)) == "float32"
    scored = {"config": {"task": "language-modelling"},
              "metrics": {"test_bytes_evaluated": 512, "test_tokens_evaluated": 512},
              "data": {"bytes": {"test": 201_451}, "tokens": {"test": 201_451}}}
    assert split_scored_text(scored) == "bytes scored: 512 of 201,451 (0.25 %)"
    scored["metrics"]["test_tokens_evaluated"], scored["data"]["tokens"]["test"] = 128, 50_362
    assert split_scored_text(scored) == "bytes scored: 512 of 201,451 (0.25 %); tokens 128 of 50,362 (0.25 %)"
    ids = hand_made()
    ids["data"]["tokenizer"] = {"type": "token-ids", "vocab_size": 39, "fingerprint": "token-ids-39"}
    assert tokens_text(SimpleNamespace(groups=[SimpleNamespace(results=[ids])])) == [
        "tokens as token files' ids (vocabulary 39)"]


def test_a_single_runs_json_leaves_out_what_compares():
    """One run's JSON carried `baseline`, `speedups`, `speedup: 1.0`, a ranking of one and a parity entry 'no other
    float32 run to compare with', which its table leaves out."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_json_dict
    data = to_json_dict(build_comparison([LoadedRun(hand_made(), "gpt.json")]))
    assert set(data) == {"kind", "config", "summary"}
    entry = data["summary"][0]
    assert not {"speedup", "scaling", "verdicts", "break_even"} & set(entry) and entry["intervals"]["tokens_per_s"]
    # two runs still compare
    both = to_json_dict(build_comparison([LoadedRun(hand_made(), "jax.json"), LoadedRun(hand_made("torch"), "t.json")]))
    assert {"baseline", "speedups", "ranking", "parity", "verdicts"} <= set(both)
    # a compare JSON that ended with one run (stopped after its first) keeps the layout its readers take
    from mtbench.runner.results.compare_json import combined_json
    stopped = combined_json(build_comparison([LoadedRun(hand_made(), "gpt.json")]), [],
                            {"status": "interrupted", "status_reason": "SIGINT received"}, {})
    assert {"baseline", "speedups", "ranking", "parity", "verdicts"} <= set(stopped)
    assert {"speedup", "verdicts", "break_even"} <= set(stopped["summary"][0])


def laid_out(result, extras, parallelism, devices=2, processes=1):
    """`result` as a run of `extras` over `devices` devices in `processes` processes recorded it."""
    result = json.loads(json.dumps(result))
    result["extras"], result["devices_used"] = list(extras), devices
    result["way_of_training"] = {"parallelism": parallelism, "extras": []}
    result["processes"] = {"world_size": processes, "processes": processes,
                           "devices_per_process": devices // processes, "spanned_by": list(extras)}
    return result


def test_runs_that_train_the_same_way_on_each_backend_are_held_against_each_other():
    """A comparison of jax, torch, jax+data-parallel@2 and torch+ddp@2 held each run to the baseline alone: which
    framework trains faster data-parallel over two devices, the question of REFERENCE's 2-GPU comparisons, had no
    verdict. Runs laid out the same way on the two backends are held against each other; a sharded run has no
    counterpart in a data-parallel one, nor a run from before the layout was recorded."""
    from mtbench.runner.results.report import LoadedRun, build_comparison, to_csv, to_json_dict, to_markdown
    jax, torch = hand_made("jax", seconds=0.015), hand_made("torch", seconds=0.015)
    for single in (jax, torch):
        single["way_of_training"] = {"parallelism": [], "extras": []}
    runs = [jax, torch, laid_out(hand_made("jax", seconds=0.020), ["data-parallel"], ["data"]),
            laid_out(hand_made("torch", seconds=0.010), ["ddp"], ["data"], processes=2),
            laid_out(hand_made("torch", seconds=0.010), ["fsdp"], ["sharded data"], processes=2)]
    # Three repeats of each counterpart: of one repeat each a verdict is undetermined, and so of repeats alike to
    # the last digit (their spread 0): the copies step 0.01 % slower and faster, their geometric mean the run's.
    repeated = [LoadedRun(stepping_slower(run, factor), f"{index}-{k}.json") for index, run in enumerate(runs[2:4])
                for k, factor in enumerate((1 + 1e-4, 1 - 1e-4), start=1)]
    comparison = build_comparison([LoadedRun(run, f"{index}.json") for index, run in enumerate(runs)] + repeated)
    assert [(verdict.run, verdict.against, verdict.call) for verdict in comparison.counterpart_verdicts] == [
        ("torch+ddp@2:model=gpt", "jax+data-parallel:model=gpt", "faster")]
    verdict = to_json_dict(comparison)["counterpart_verdicts"][0]
    assert (verdict["figure"], round(verdict["ratio"], 2)) == ("tokens_per_s", 2.0)
    assert ("the same way on each backend: torch+ddp@2:model=gpt is 2.00x faster than jax+data-parallel:model=gpt in "
            "tokens/s") in to_markdown(comparison)
    # How many devices each ran on, which the hardware row (a CPU's model and cores) says alike of all of them.
    header, rows = parse_markdown_table(to_markdown(comparison))
    assert rows["devices (processes)"] == ["1", "1", "2 (1 process)", "2 (2 processes)", "2 (2 processes)"]
    table = list(csv.DictReader(io.StringIO(to_csv(comparison))))
    assert [(row["devices"], row["processes"]) for row in table] == [("1", "1"), ("1", "1"), ("2", "1"), ("2", "2"),
                                                                     ("2", "2")]
    # The scaling the JSON holds, whole: 2 devices of one CPU ideally the one's tokens/s, this one at 0.75 of it.
    assert (table[2]["scaling_ideal_speedup"], table[2]["scaling_above_ideal"]) == ("1", "False")
    assert float(table[2]["scaling_efficiency"]) == pytest.approx(0.75)
    assert "devices (processes)" not in parse_markdown_table(to_markdown(build_comparison(
        [LoadedRun(run, f"{index}.json") for index, run in enumerate(runs[:2])])))[1]
    # held against the run on the baseline's backend, whichever came first
    flipped = build_comparison([LoadedRun(run, f"{index}.json") for index, run in enumerate(runs)],
                               baseline="torch:model=gpt")
    assert [(verdict.run, verdict.against) for verdict in flipped.counterpart_verdicts] == [
        ("jax+data-parallel:model=gpt", "torch+ddp@2:model=gpt")]
    for run in runs:
        del run["way_of_training"]
    earlier = build_comparison([LoadedRun(run, f"{index}.json") for index, run in enumerate(runs)])
    assert earlier.counterpart_verdicts == [] and "the same way on each backend" not in to_markdown(earlier)


@pytest.mark.parametrize("torch_schedule, paired", [("1F1B", False), ("GPipe", True)])
def test_pipelines_are_held_against_each_other_only_on_the_same_schedule(torch_schedule, paired):
    """Without --pipeline-schedule each backend pipelines on its own default (JAX GPipe, torch 1F1B): a JAX pipeline
    was held against a torch one as "the same way on each backend", though their schedules differ."""
    from mtbench.runner.results.report import LoadedRun, build_comparison
    baseline = hand_made("torch", seconds=0.015)
    baseline["way_of_training"] = {"parallelism": [], "extras": []}
    jax = laid_out(hand_made("jax", seconds=0.020), ["pipeline-parallel"], ["pipeline"])
    torch = laid_out(hand_made("torch", seconds=0.010), ["pipeline-parallel"], ["pipeline"], processes=2)
    jax["extras_record"] = {"pipeline-parallel": {"schedule": "GPipe", "stages": 2}}
    torch["extras_record"] = {"pipeline-parallel": {"schedule": torch_schedule, "stages": 2}}
    runs = [baseline, *(copy.deepcopy(run) for run in (jax, torch) for _ in range(3))]
    comparison = build_comparison([LoadedRun(run, f"{index}.json") for index, run in enumerate(runs)])
    assert [(verdict.run, verdict.against) for verdict in comparison.counterpart_verdicts] == (
        [("jax+pipeline-parallel:model=gpt", "torch+pipeline-parallel@2:model=gpt")] if paired else [])
