"""`mtbench report NEW --baseline OLD`, the regression gate, on real tiny results: it holds a run only against the
same run (another batch size, dtype or machine is refused, as a label leaves them out where each file holds one
run), never passes a run that stopped early, and says what each side ran on; a history leaves out what is no
point and says why; tables off a terminal keep their cells whole."""

import json
import re

import pytest

from conftest import assert_refused_in_one_line, run_cli
from mtbench.figures import compile_cache_text, is_steady
from mtbench.runner.results.regression import build_regression
from mtbench.runner.results.report import COMPARE_KIND, LoadedRun, RunGroup
from mtbench.runner.results.verdicts import Interval, verdict
from result_keys import undocumented_keys


def edited(result, path, **sections):
    """A copy of `result` with entries of its sections (`config`, `env`, ...) or top-level keys replaced."""
    changed = json.loads(json.dumps(result))
    for key, value in sections.items():
        if isinstance(value, dict):
            changed[key].update(value)
        else:
            changed[key] = value
    path.write_text(json.dumps(changed))
    return str(path)


def compare_json(path, runs, **fields):
    """A compare JSON at `path` of `runs` ([(label, result)], one repeat each), with `fields` beside (a status)."""
    entries = [{"label": label, "repeat": 1, "result": result} for label, result in runs]
    path.write_text(json.dumps({"kind": COMPARE_KIND, **fields, "runs": entries}))
    return str(path)


def repeated(path, result, hour, count=3, **sections):
    """A compare JSON at `path` of `count` repeats of run 'jax', copies of `result` (with `sections` replaced, as
    `edited` replaces them) made at minutes of `hour`: a side whose repeats show a spread, of which a gate can call
    a change (of one repeat each it is undetermined, and so of copies alike to the last digit, whose spread is 0:
    their steady steps take from 0.01 % less to 0.01 % more time than the result's, their geometric mean its)."""
    changed = json.loads(open(edited(result, path, **sections)).read())
    entries = []
    for k in range(1, count + 1):
        repeat = json.loads(json.dumps(changed))
        for entry in repeat["history"]:
            if is_steady(entry):
                entry["seconds"] *= 1 + 1e-4 * (k - (count + 1) / 2)
        entries.append({"label": "jax", "repeat": k,
                        "result": {**repeat, "created": f"2026-12-06T{hour}:0{k}:00+00:00"}})
    path.write_text(json.dumps({"kind": COMPARE_KIND, "runs": entries}))
    return str(path)


def created(hour, runs):
    """`runs` ([(label, result)]), each result made at its own minute of `hour`: another run than its original."""
    return [(label, {**result, "created": f"2026-12-06T{hour}:0{i}:00+00:00"}) for i, (label, result) in enumerate(runs)]


def test_a_run_of_another_batch_size_or_machine_is_refused_then_held_with_force(tiny_runs, tmp_path):
    old = tiny_runs["jax"]
    batch = edited(old["result"], tmp_path / "batch.json", config={"batch_size": 8})
    proc = run_cli("report", batch, "--baseline", old["path"], "--fail-if-slower", "5%")
    assert_refused_in_one_line(proc, f"run 'jax' of {batch} differs from {old['path']}'s in batch_size (8 vs 32)")
    machine = edited(old["result"], tmp_path / "machine.json",
                     env={"device": {**old["result"]["env"]["device"], "name": "AMD EPYC 7B13", "kind": "cpu"}})
    assert_refused_in_one_line(run_cli("report", machine, "--baseline", old["path"]), "in hardware (")

    forced = run_cli("report", batch, "--baseline", old["path"], "--force", "--format", "json")
    assert forced.returncode == 0, forced.stderr
    held = json.loads(forced.stdout)
    assert undocumented_keys(held) == []
    assert held["held_anyway"] == [f"run 'jax' of {batch} differs from {old['path']}'s in batch_size (8 vs 32)"]
    versions = ", ".join(f"{name} {version}" for name, version in old["result"]["env"]["backend_versions"].items())
    assert held["ran_on"]["baseline"].startswith(versions) and held["ran_on"]["new"] == held["ran_on"]["baseline"]
    table = run_cli("report", batch, "--baseline", old["path"], "--force")
    assert f"held anyway (--force): run 'jax' of {batch} differs" in table.stdout
    assert f"baseline: {versions}" in table.stdout


def test_a_run_added_to_a_sweep_leaves_its_fellows_held_against_the_same_runs(tiny_runs, tmp_path):
    """A baseline compare of jax and torch, and a new one that adds jax at another batch size: within the new file
    its fellows are named `jax:batch-size=32`, and the gate refused every run as absent from the baseline. They are
    held against the baseline's jax and torch; the added run is the new file's alone."""
    jax, torch = tiny_runs["jax"]["result"], tiny_runs["torch"]["result"]
    smaller = {**jax, "config": {**jax["config"], "batch_size": 8}}
    old = compare_json(tmp_path / "old.json", created(10, [("jax", jax), ("torch", torch)]))
    new = compare_json(tmp_path / "new.json", created(11, [("jax", jax), ("torch", torch),
                                                            ("jax:batch-size=8", smaller)]))
    regression = build_regression([new], old)
    assert list(dict.fromkeys(change.label for change in regression.changes)) == [
        "jax:batch-size=32", "torch:batch-size=32"]
    assert regression.only_new == ["jax:batch-size=8"] and regression.only_baseline == []
    # One run a side at two batch sizes: the same run's name, refused by its settings, held with --force.
    alone = compare_json(tmp_path / "alone.json", created(12, [("jax:batch-size=8", smaller)]))
    regression = build_regression([alone], compare_json(tmp_path / "jax.json", created(13, [("jax", jax)])),
                                  force=True)
    assert {change.label for change in regression.changes} == {"jax"}
    assert len(regression.held_anyway) == 1 and "differs from" in regression.held_anyway[0]


def test_a_reader_that_leaves_early_leaves_the_gates_exit_status_as_it_is(tiny_runs, tmp_path):
    """`mtbench report NEW --baseline OLD --fail-if-slower 5% | head -1` in a CI shell with pipefail: the gate that
    passed ended with status 1 and no word once head had gone (click's answer to a broken pipe). Its status is the
    gate's, whether anything reads its output or not."""
    import subprocess
    import sys
    from conftest import cli_environment
    old = tiny_runs["jax"]
    history = [{**entry, "seconds": entry["seconds"] * 3} for entry in old["result"]["history"]]
    slower = repeated(tmp_path / "slower.json", old["result"], 10, history=history)
    copy = repeated(tmp_path / "copy.json", old["result"], 11)
    for new, status in ((copy, 0), (slower, 1)):
        gate = [sys.executable, "-m", "mtbench", "report", new, "--baseline", old["path"], "--fail-if-slower", "5%"]
        read = subprocess.run(gate, capture_output=True, text=True, env=cli_environment())
        assert read.returncode == status, read.stderr
        unread = subprocess.Popen(gate, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=cli_environment())
        unread.stdout.close()  # the reader leaves before the first line
        assert unread.wait(timeout=300) == status and unread.stderr.read() == read.stderr


def test_a_run_that_stopped_early_never_passes_the_gate(tiny_runs, tmp_path):
    old = tiny_runs["jax"]
    diverged = edited(old["result"], tmp_path / "diverged.json", status="diverged",
                      status_reason="the loss is nan at step 4")
    for new, baseline in ((diverged, old["path"]), (old["path"], diverged)):
        proc = run_cli("report", new, "--baseline", baseline, "--fail-if-slower", "5%")
        assert_refused_in_one_line(proc, f"{diverged} is a partial run, diverged (the loss is nan at step 4)")
    forced = run_cli("report", diverged, "--baseline", old["path"], "--force")
    assert forced.returncode == 0 and f"held anyway (--force): {diverged} is a partial run" in forced.stdout


def test_the_gate_names_values_as_the_sentence_does(tiny_runs, tmp_path):
    """'NEW differs from OLD in steps (NEW's vs OLD's)': the value of the file named first comes first. With
    --force the difference is held anyway and said, as the docs promise (it was held silently)."""
    old = tiny_runs["jax"]
    longer = edited(old["result"], tmp_path / "longer.json", config={"steps": 90})
    proc = run_cli("report", longer, "--baseline", old["path"])
    assert_refused_in_one_line(proc, f"not comparable: {longer} differs from {old['path']} in steps (90 vs 60)")
    forced = run_cli("report", longer, "--baseline", old["path"], "--force", "--format", "json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["held_anyway"] == [f"{longer} differs from {old['path']} in steps (90 vs 60)"]


def test_what_each_side_ran_on_names_every_backends_software_and_a_partial_comparison_is_said(tiny_runs, tmp_path):
    """A gate of jax and torch named JAX's versions alone (a torch upgrade showed nowhere); a compare JSON that
    stopped early passed without a word of it; the gate's output files are refused by name."""
    jax, torch = tiny_runs["jax"]["result"], tiny_runs["torch"]["result"]
    compare_json(tmp_path / "new.json", [("jax", jax), ("torch", torch)], status="interrupted",
                 status_reason="interrupted during run 'jax' (2 of 4 runs finished)")
    upgraded = {**torch, "env": {**torch["env"], "backend_versions": {**torch["env"]["backend_versions"],
                                                                        "torch": "9.9.9"}}}
    compare_json(tmp_path / "old.json", [*created(9, [("jax", jax)]), ("torch", upgraded)])
    regression = build_regression([str(tmp_path / "new.json")], str(tmp_path / "old.json"))
    assert regression.ran_on["baseline"].count(" on ") == 2 and "torch 9.9.9" in regression.ran_on["baseline"]
    assert "torch 9.9.9" not in regression.ran_on["new"] and "jax " in regression.ran_on["new"]
    assert regression.warnings == ["partial comparison: interrupted during run 'jax' (2 of 4 runs finished); the "
                                   "runs that did not finish are missing from it, or partial"]
    assert f"warning: {regression.warnings[0]}" in regression.lines()
    proc = run_cli("report", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "old.json"), "--format",
                   "json")
    assert proc.returncode == 0, proc.stderr
    output = tmp_path / "gate.json"
    output.write_text(proc.stdout)
    assert undocumented_keys(json.loads(proc.stdout)) == []
    assert_refused_in_one_line(run_cli("report", str(output), "--baseline", str(tmp_path / "old.json")),
                               f"{output}: the JSON output of a report against a baseline holds summaries, not runs")


def test_a_history_leaves_out_partial_runs_and_stray_files_and_says_why(tiny_runs, tmp_path):
    result = tiny_runs["jax"]["result"]
    for number in range(3):
        edited(result, tmp_path / f"{number}.json", created=f"2026-11-2{number}T10:00:00+00:00")
    edited(result, tmp_path / "3.json", created="2026-11-23T10:00:00+00:00", status="interrupted",
           status_reason="SIGINT received; stopped after step 12")
    (tmp_path / "notes.json").write_text(json.dumps({"owner": "ci"}))
    (tmp_path / "settings.json").write_text(json.dumps({"name": "x", "config": "prod"}))
    (tmp_path / "torn.json").write_text('{"kind":')
    proc = run_cli("report", "--history", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [point["repeats"] for point in data["points"]] == [3]  # one commit: three repeats of one point
    why = {entry["file"].rsplit("/", 1)[-1]: entry["why"] for entry in data["left_out"]}
    assert why["3.json"].startswith("a partial run, interrupted (SIGINT received; stopped after step 12)")
    assert why["notes.json"].startswith("not an mtbench result (")
    assert why["settings.json"].startswith("not an mtbench result (")
    assert why["torn.json"].startswith("line 1: not valid JSON")


def test_one_run_is_never_held_against_itself_nor_two_repeats_of_a_history(tiny_runs, tmp_path):
    """OLD named among NEW (or a copy of it) was counted on both sides, and the gate passed it ('no difference',
    0.001-1758); two copies of one run in a history were two repeats of an interval of zero width."""
    old = tiny_runs["jax"]
    copy = edited(old["result"], tmp_path / "copy.json")
    for new in (old["path"], copy):
        proc = run_cli("report", new, "--baseline", old["path"], "--fail-if-slower", "5%")
        assert_refused_in_one_line(proc, f"{old['path']} and {new} hold the same run (created ")
    history = tmp_path / "history"
    history.mkdir()
    for name in ("a.json", "b.json"):
        edited(old["result"], history / name)
    proc = run_cli("report", "--history", str(history), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [point["repeats"] for point in data["points"]] == [1]
    assert [(entry["file"].rsplit("/", 1)[-1], entry["why"]) for entry in data["left_out"]] == [
        ("b.json", "the same run as a.json (a copy of it)")]


def test_parity_options_the_gate_does_not_use_are_refused(tiny_runs):
    """The gate holds figures against OLD's and checks no parity: --parity-steps was taken without a word."""
    proc = run_cli("report", tiny_runs["torch"]["path"], "--baseline", tiny_runs["jax"]["path"],
                   "--parity-tolerance", "0.1")
    assert_refused_in_one_line(proc, "--parity-tolerance: --baseline OLD.json holds each run against OLD's figures, "
                                     "with no parity check")


def test_tables_off_a_terminal_keep_every_cell_whole(tiny_runs):
    """Rich cuts cells at 80 columns where it writes to no terminal (a CI log); mtbench's tables are as wide as
    they need there, unless COLUMNS says otherwise."""
    paths = [tiny_runs["jax"]["path"], tiny_runs["torch"]["path"]]
    proc = run_cli("report", *paths, env={"COLUMNS": None})
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout and max(map(len, proc.stdout.splitlines())) > 80
    narrow = run_cli("report", *paths, env={"COLUMNS": "80"})
    assert max(map(len, narrow.stdout.splitlines())) <= 80


def test_repeats_that_ran_differently_say_so_instead_of_the_first_ones_word(tiny_runs):
    result = tiny_runs["jax"]["result"]
    warm = json.loads(json.dumps(result))
    warm["timing"]["compile_cache"] = {"state": "warm", "programs": "warm", "hits": 18, "misses": 0}
    group = RunGroup("jax", [LoadedRun(result, "a.json"), LoadedRun(warm, "b.json")])
    first, second = compile_cache_text(result), compile_cache_text(warm)
    assert first != second
    assert group.choice_text(compile_cache_text) == f"{first} in #1; {second} in #2"
    assert RunGroup("jax", group.runs[:1]).choice_text(compile_cache_text) == first


def test_no_difference_in_a_time_states_the_ratio_the_json_holds():
    """A time's 'faster' and 'slower' read as speed; 'no difference' says no direction, so its interval is the
    figure's own ratio, the `low` and `high` beside it (it was the inverse)."""
    held = verdict("new", "old", Interval("step_s_median", 1.5, 0.94, 2.39, (3, 3), False, (10, 10), "bootstrap"))
    assert held.call == "no difference" and (held.low, held.high) == (0.94, 2.39)
    assert held.text.endswith("beyond the noise (0.94–2.39)") and held.cell() == "no difference (0.94–2.39)"


def test_a_file_or_folder_in_the_wrong_place_is_named_for_what_it_is(tiny_runs, tmp_path):
    path = tiny_runs["jax"]["path"]
    assert_refused_in_one_line(run_cli("report", "--history", path),
                               f"--history {path}: not a directory (give the directory of the results)")
    assert_refused_in_one_line(run_cli("report", "--history", ""),  # said '--history : no such directory'
                               "Invalid value for '--history': '' names no file or folder")
    assert_refused_in_one_line(run_cli("report", path, "--baseline", str(tmp_path)),
                               f"--baseline '{tmp_path}' is none of the runs: jax; it is a directory, and a "
                               f"baseline file is a result or compare JSON")
    # A compare's runs folder holds each run's run file beside its result: `report DIR.runs/*.json` reads both.
    run_file = tmp_path / "jax-1.train.json"
    run_file.write_text(json.dumps({"kind": "mtbench-run-file", "mtbench_run_file": 1, "config": {}}))
    assert_refused_in_one_line(run_cli("report", path, str(run_file)),
                               f"{run_file}: a run file (what `mtbench train --run-file` and `rerun` read) holds a "
                               f"run's configuration, not its figures; give its result, the JSON beside it")


def test_counts_of_one_are_singular():
    held = verdict("new", "old", Interval("tokens_per_s", 0.5, 0.45, 0.55, (1, 1), False, (1, 1), "bootstrap"))
    assert any(text.startswith("1 steady timing window in a run: too few to resample") for text in held.warnings)


def test_the_columns_of_a_window_figure_are_the_figures_whose_ratio_is_judged(tiny_runs, tmp_path):
    """A run whose every timed step took 1.25x as long, its recorded medians left as they were (as where windows
    cut short by validation part the median over steps from the median window): the steady step's and tokens/s's
    columns read the windows the ratio is drawn from, so new / baseline is the verdict's ratio."""
    old = tiny_runs["jax"]
    slowed = json.loads(json.dumps(old["result"]))
    for entry in slowed["history"]:
        entry["seconds"] *= 1.25
    new = tmp_path / "slowed.json"
    new.write_text(json.dumps(slowed))
    proc = run_cli("report", str(new), "--baseline", old["path"], "--format", "json")
    assert proc.returncode == 0, proc.stderr
    changes = {c["figure"]: c for c in json.loads(proc.stdout)["changes"]}
    for figure, ratio in (("step_s_median", 1.25), ("tokens_per_s", 1 / 1.25)):
        change = changes[figure]
        assert change["new"] / change["baseline"] == pytest.approx(ratio), figure
        assert change["verdict"]["ratio"] == pytest.approx(ratio), figure
    # The recorded figures, read from the file: what the columns showed before, a ratio of 1 beside a verdict of 1.25.
    assert slowed["timing"]["step_s_median"] == old["result"]["timing"]["step_s_median"]


def test_a_compile_cache_warm_on_one_side_and_cold_on_the_other_judges_no_compile_time(tiny_runs, tmp_path):
    """A CI job that keeps the persistent cache between runs compiles from it; the baseline compiled afresh. Its
    compile, train and total times then measure the cache: no verdict on them, and the reason, while the steady
    figures are judged as ever."""
    old = tiny_runs["jax"]
    cache = old["result"]["timing"]["compile_cache"]
    assert cache["programs"] in ("cold", "partly warm")  # the session's first jax run of its shape
    warm = json.loads(json.dumps(old["result"]))
    warm["timing"]["compile_cache"] = {**cache, "programs": "warm", "hits": cache["hits"] + cache["misses"],
                                       "misses": 0}
    warm["timing"]["compile_s"] /= 10
    new = tmp_path / "warm.json"
    new.write_text(json.dumps(warm))
    proc = run_cli("report", str(new), "--baseline", old["path"], "--format", "json")
    assert proc.returncode == 0, proc.stderr
    changes = {c["figure"]: c for c in json.loads(proc.stdout)["changes"]}
    for figure in ("compile_s", "train_s", "total_s"):
        assert changes[figure]["verdict"] is None, figure
        assert changes[figure]["reason"] == (f"the compile cache was warm in the new runs and {cache['programs']} "
                                             f"in the baseline's"), figure
    assert changes["tokens_per_s"]["verdict"] is not None
    shown = run_cli("report", str(new), "--baseline", old["path"]).stdout
    assert "compile time" not in "".join(line for line in shown.splitlines() if "changed beyond the noise" in line)


def test_a_gate_that_passes_an_interval_reaching_past_its_threshold_says_it_cannot_rule_it_out(tiny_runs, tmp_path):
    """Three repeats of NEW, at 0.6x, 1x and 1.6x the baseline's step times: not shown slower, and the gate
    passes as documented, but its interval reaches far past 5 % slower, which it once hid under 'no run is slower
    beyond it'. Of two repeats (0.6x and 1.6x) the interval is Student's t of 1 degree of freedom, which a real 20 %
    slowdown passed too: that gate cannot judge, and fails."""
    old = tiny_runs["jax"]
    news = []
    for number, scale in enumerate((0.6, 1.6, 1.0)):
        history = [{**entry, "seconds": entry["seconds"] * scale} for entry in old["result"]["history"]]
        news.append(edited(old["result"], tmp_path / f"new-{number}.json", history=history,
                           created=f"2026-12-04T10:0{number}:00+00:00"))
    two = run_cli("report", *news[:2], "--baseline", old["path"], "--fail-if-slower", "5%")
    assert two.returncode == 1 and "--fail-if-slower 5%: cannot judge: run 'jax' has no tokens/s verdict (2 and 1 " \
        "repeats: a side of 2 gives an interval too wide to gate on; give each side 3 repeats or more)" in two.stdout
    proc = run_cli("report", *news, "--baseline", old["path"], "--fail-if-slower", "5%", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    gate = json.loads(proc.stdout)
    assert gate["slower_beyond_threshold"] == [] and undocumented_keys(gate) == []
    [line] = gate["not_ruled_out"]
    low = float(line.split("tokens/s ")[1].split("–")[0])
    assert line.startswith("run 'jax' tokens/s ") and low < 0.95 and line.endswith("(3 and 1 repeats)")
    text = run_cli("report", *news, "--baseline", old["path"], "--fail-if-slower", "5%")
    assert f"--fail-if-slower 5% passes, but cannot rule out a slowdown past it: {line}" in text.stdout
    # The pass line gives the same interval from its low end below the baseline to its high end above (it gave
    # each end's distance from the other side, negative: '-3.0 % below to -5.0 % above' for 0.95–1.03).
    high = float(line.split("–")[1].split(" ")[0])
    below, above = map(float, re.search(r"\((\d+\.\d) % below to (\d+\.\d) % above\)", text.stdout).groups())
    # (the line above gives its bounds to 2 decimals)
    assert below == pytest.approx((1 - low) * 100, abs=0.6) and above == pytest.approx((high - 1) * 100, abs=0.6)
    # A gate that fails (a run of the baseline that NEW lacks) passes nothing: no 'passes, but' beside its failure.
    both = compare_json(tmp_path / "both.json", [(name, tiny_runs[name]["result"]) for name in ("jax", "torch")])
    lines = build_regression(news, both, threshold=0.05).lines()
    assert any(line.startswith("--fail-if-slower 5%: cannot judge: run 'torch'") for line in lines), lines
    assert not any("passes, but" in line for line in lines), lines


def test_a_failing_gate_says_what_the_results_say_of_their_timings(tiny_runs, tmp_path):
    """A rerun of one commit on a machine that others loaded ran at half the speed: the gate fails it, and says
    beside the figures and in its one-line failure that its result carries a load warning, which it once left out
    (the results said 'machine loaded', the gate's output not a word of it)."""
    old = tiny_runs["jax"]
    history = [{**entry, "seconds": entry["seconds"] * 2} for entry in old["result"]["history"]]
    new = repeated(tmp_path / "loaded.json", old["result"], 10, history=history,
                   machine_load={"other_processes_percent": 71})
    loaded = "machine loaded: other processes used 71 % of the CPUs' time while the run trained"
    proc = run_cli("report", new, "--baseline", old["path"], "--fail-if-slower", "5%")
    assert proc.returncode == 1, proc.stderr
    assert any(line.startswith(f"warning: jax (new): {loaded}") for line in proc.stdout.splitlines()), proc.stdout
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("Error: slower than the baseline by more than 5%: jax (new) is ")
    # The verdict names the loaded runs (the baseline's may be one too), then the runs whose warnings are above.
    interval, warned = line.split(" in tokens/s ", 1)[1].split(": not reliable (", 1)
    assert "), measured on a loaded machine (jax (new)" in interval, line
    assert "jax (new)" in warned and warned.endswith(" warnings, above, that may explain it)"), line
    gate = json.loads(run_cli("report", new, "--baseline", old["path"], "--format", "json").stdout)
    assert any(text.startswith(loaded) for text in gate["run_warnings"]["jax (new)"]) and undocumented_keys(gate) == []


def test_the_gate_says_its_threshold_is_of_tokens_per_second_beside_the_verdicts_factor(tiny_runs, tmp_path):
    """Every step 1.20x slower is 16.7 % fewer tokens/s: a gate at 18 % passed beside '1.20x slower' without saying
    what it measured, read by a user as 20 % slower."""
    old = tiny_runs["jax"]
    history = [{**entry, "seconds": entry["seconds"] * 1.2} for entry in old["result"]["history"]]
    slower = repeated(tmp_path / "slower.json", old["result"], 10, history=history)
    passed = run_cli("report", slower, "--baseline", old["path"], "--fail-if-slower", "18%")
    assert passed.returncode == 0, passed.stdout
    assert "--fail-if-slower 18%: no run's tokens/s shown more than 18 % below the baseline's (jax: tokens/s 16.7 % " \
           "below (" in passed.stdout and "1.20x slower" in passed.stdout
    failed = run_cli("report", slower, "--baseline", old["path"], "--fail-if-slower", "15%")
    assert failed.returncode == 1 and "slower than the baseline by more than 15%" in failed.stderr


def test_an_empty_baseline_or_a_folder_for_the_gate_is_refused_saying_what_it_was_taken_for(tiny_runs, tmp_path):
    """`--baseline ''` was taken for no baseline (the runs held against the first); a folder given with
    --fail-if-slower was told the gate needs --baseline, which it had been given."""
    new = tiny_runs["jax"]["path"]
    assert_refused_in_one_line(run_cli("report", new, "--baseline", ""),
                               "--baseline '': give a run's label, or OLD.json to hold the runs against")
    assert_refused_in_one_line(run_cli("report", new, "--baseline", str(tmp_path), "--fail-if-slower", "5%"),
                               f"--fail-if-slower needs --baseline OLD.json, the results to hold the runs against "
                               f"({tmp_path} is a label, or a folder: no result file)")


def test_a_report_held_together_with_force_says_what_it_would_have_refused(tiny_runs, tmp_path):
    """`report A B --force` pooled a run of another timing window as a repeat, said nowhere; the gate said it."""
    old = tiny_runs["jax"]
    other = edited(old["result"], tmp_path / "window.json", config={"timing_window": 3},
                   created="2026-12-07T09:00:00+00:00")
    assert_refused_in_one_line(run_cli("report", old["path"], other), "not comparable: ")
    held = f"{other} differs from {old['path']} in timing_window (3 vs 10)"
    forced = run_cli("report", old["path"], other, "--force", "--format", "json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["held_anyway"] == [held]
    table = run_cli("report", old["path"], other, "--force")
    assert f"held anyway (--force): {held}" in table.stdout
