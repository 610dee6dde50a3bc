"""benchmarks/gpu_matrix.py: which rows a machine gets, in which order, and why the others are skipped (a GPU's
plan is made here from a described GPU); how the budget cuts rows that would not fit, stops one that outruns it and
lets a later, cheaper row run; that the table and JSON are on disk as each row ends; and two real runs on the CPU's
tiny plan: one row trained and two skipped, whose table and JSON are checked (not their timings), and a budget too
small for any row."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu_matrix
from benchmarks.gpu_matrix import Row, Way, add_parity, markdown_table, plan_rows, run_matrix
from conftest import CPU_ONLY, REPOSITORY, json_answer
from mtbench.runner.results.verdicts import ONE_REPEAT_EACH

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "gpu_matrix.py")
H100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1}
CPU = {"kind": "cpu", "name": "some CPU", "count": 1}
FLASH_REFUSED = "extra 'flash-attention' cannot run here: needs a GPU (or TPU) and float16/bfloat16"
BF16 = "mixed_bfloat16"


def described(jax=H100, torch=H100, refusals=None):
    backends = {name: {"device": device} if isinstance(device, dict) else {"missing": device}
                for name, device in (("jax", jax), ("torch", torch))}
    return {"backends": backends, "refusals": refusals or {}}


# The GPU's plan as the module's docstring lists it, written out by hand: (row, preset, dtype, run).
TRANSLATION_ROWS = [
    (1, BF16, "jax"), (2, BF16, "torch+torch-compile"), (3, BF16, "torch"),
    (4, BF16, "torch+torch-compile@reduce-overhead"), (5, "float32 (highest)", "jax"), (6, "float32 (high)", "jax"),
    (7, BF16, "jax+flash-attention"), (8, BF16, "torch+torch-compile+flash-attention"),
    (9, BF16, "torch+flash-attention"),
    (10, "float32 (highest)", "torch+torch-compile"), (11, "float32 (high)", "torch+torch-compile"),
    (15, BF16, "torch+torch-compile+flash-attention@reduce-overhead")]
# A language model's rows, most important first: each backend's best way, the best-by-hand references, torch's
# best way and nanoGPT's recipe in CUDA graphs, row 7's step in the reference's loop, the fair default.
LANGUAGE_MODEL_ROWS = [
    (7, BF16, "jax+flash-attention"), (8, BF16, "torch+torch-compile+flash-attention"), (12, BF16, "best-by-hand-jax"),
    (13, BF16, "best-by-hand-torch"), (15, BF16, "torch+torch-compile+flash-attention@reduce-overhead"),
    (16, BF16, "best-by-hand-torch@reduce-overhead"),
    (14, BF16, "jax-step-in-reference-loop"), (1, BF16, "jax"), (2, BF16, "torch+torch-compile"), (3, BF16, "torch"),
    (4, BF16, "torch+torch-compile@reduce-overhead"), (9, BF16, "torch+flash-attention")]
GPU_PLAN = [(number, preset, dtype, run)
            for preset, rows in (("gpt2-small", LANGUAGE_MODEL_ROWS), ("small", TRANSLATION_ROWS),
                                 ("gpt-char", LANGUAGE_MODEL_ROWS))
            for number, dtype, run in rows]


def printed_plan(tmp_path, monkeypatch, capsys, *argv):
    """The rows `gpu_matrix.py ARGV --budget 0` prints on a machine whose backends both see an H100: every row of
    the plan, cut before it starts, as (row, preset, dtype, run) read from the printed table."""
    monkeypatch.setattr(gpu_matrix, "run_probe", lambda: described())
    monkeypatch.setattr(gpu_matrix, "run_mtbench", lambda *args, **kwargs: pytest.fail("a row was started"))
    assert gpu_matrix.main([*argv, "--budget", "0", "--out", str(tmp_path), "--cache-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()[2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    assert all(row[4].startswith("cut: not started") for row in cells)
    return [(int(row[0]), row[1], row[2], row[3]) for row in cells]


def test_a_gpu_gets_gpt2_small_then_small_then_the_character_model_best_rows_first(tmp_path, monkeypatch, capsys):
    assert printed_plan(tmp_path, monkeypatch, capsys) == GPU_PLAN  # CUDA graphs and flash attention run on a GPU


def test_a_part_of_the_gpu_plan_keeps_the_rows_numbers(tmp_path, monkeypatch, capsys):
    assert printed_plan(tmp_path, monkeypatch, capsys, "--presets", "small,gpt-char", "--rows", "2,5-7",
                        "--dtypes", BF16) == [(2, "small", BF16, "torch+torch-compile"),
                                              (7, "small", BF16, "jax+flash-attention"),
                                              (7, "gpt-char", BF16, "jax+flash-attention"),
                                              (2, "gpt-char", BF16, "torch+torch-compile")]


def test_a_gpu_then_trains_the_language_models_in_bfloat16_with_and_without_fused_attention():
    char = [row for row, _ in plan_rows(described(), presets=["gpt-char"])]
    assert char[0].train_arguments() == ["--backend", "jax", "--extra", "flash-attention", "--model", "gpt",
                                         "--preset", "char", "--dtype", BF16]
    reference = next(row for row in char if row.way.reference)
    assert reference.train_arguments() == ["--backend", "jax", "--model", "gpt", "--preset", "char", "--dtype", BF16]
    assert gpu_matrix.batching_options("gpt2-small", [], "gpu") == ["--batch-size", "16"]


def test_a_row_trains_measure_only_with_its_precision_and_gpu_sized_batches():
    row = Row("small", "float32", Way("torch", ("torch-compile",), "reduce-overhead"), "high", 11)
    assert row.train_arguments() == ["--backend", "torch", "--extra", "torch-compile", "--attention", "unfused",
                                     "--compile-mode", "reduce-overhead", "--preset", "small", "--dtype", "float32",
                                     "--matmul-precision", "high"]
    assert row.key == "small float32 (high) torch+torch-compile@reduce-overhead"
    # An eager torch row says so: `mtbench train`'s --step auto would compile it on the GPU.
    eager = Row("gpt2-small", BF16, Way("torch", ("flash-attention",)), "highest", 13)
    assert eager.train_arguments()[:6] == ["--backend", "torch", "--extra", "flash-attention", "--step", "eager"]
    assert gpu_matrix.batching_options("small", [], "gpu") == ["--max-tokens", "16384"]
    assert gpu_matrix.batching_options("small", ["--batch-size", "256"], "gpu") == []
    assert gpu_matrix.batching_options("small", ["--max-tokens=8192"], "gpu") == []
    assert gpu_matrix.batching_options("tiny", [], "cpu") == []


def test_a_cpu_gets_the_tiny_plan_and_says_why_cuda_graphs_are_skipped():
    planned = plan_rows(described(jax=CPU, torch=CPU))
    assert {row.preset for row, _ in planned} == {"tiny"}
    reasons = {row.key: reason for row, reason in planned}
    assert reasons["tiny mixed_bfloat16 torch+torch-compile@reduce-overhead"].startswith(
        "CUDA graphs need a CUDA device")
    assert reasons["tiny mixed_bfloat16 jax"] is None and reasons["tiny float32 (high) jax"] is None


def test_a_backend_without_the_gpu_or_not_installed_is_skipped_with_the_reason():
    cpu_torch = plan_rows(described(torch=CPU), presets=["small"], dtypes=["float32"])
    torch_reasons = [reason for row, reason in cpu_torch if row.way.backend == "torch"]
    jax_reasons = [reason for row, reason in cpu_torch if row.way == Way("jax")]
    assert torch_reasons and all("torch sees no GPU here" in reason for reason in torch_reasons)
    assert jax_reasons and all(reason is None for reason in jax_reasons)
    no_jax = plan_rows(described(jax="backend 'jax' needs jax, which is not installed"), presets=["small"])
    jax_reasons = [reason for row, reason in no_jax if row.way.backend == "jax"]
    assert jax_reasons and all("not installed" in reason for reason in jax_reasons)


def test_the_probe_refuses_what_mtbench_train_would_refuse_here():
    probe = gpu_matrix.probe_machine()
    from mtbench.keras_models.presets import PRESETS
    presets = len(PRESETS) + len(gpu_matrix.MODEL_PRESETS)
    assert len(probe["refusals"]) == presets * len(gpu_matrix.DTYPES) * len(gpu_matrix.WAYS)
    if gpu_matrix.device_kind(probe) == "cpu":
        assert probe["refusals"]["gpt-char mixed_bfloat16 torch+flash-attention"].startswith(
            "extra 'flash-attention' cannot run here: needs a GPU")
        assert probe["refusals"]["tiny mixed_bfloat16 jax+flash-attention"].startswith(
            "extra 'flash-attention' cannot run here: needs a GPU")
        assert probe["refusals"]["tiny float32 jax"] is None


def fake_result(way, dtype, loss, precision="highest"):
    return {"backend": way.backend, "extras": list(way.extras), "status": "completed", "status_reason": None,
            "train_step": f"{way.backend}-step", "extras_record": {}, "model": {"dropout": 0.0},
            "config": {"dtype": dtype, "steps": 3, "seed": 0, "compile_mode": way.compile_mode or "default",
                       "matmul_precision": precision, "measure_only": True},
            "history": [{"loss": loss}, {"loss": loss}],
            "timing": {"step_s_median": 0.0123, "tokens_per_s": 45678.0, "compile_s": 1.5, "steady_steps": 1,
                       "clock": "a clock"},
            "utilization": {"mfu": 0.25}, "memory": {"peak_device_bytes": 3 * 2 ** 20}, "env": {"device": H100}}


class FakeMtbench:
    """Stands in for `run_mtbench` on a fake clock: every process takes `seconds[its kind]` (init-weights: the
    weights file), and a process whose timeout is shorter is stopped at it."""

    def __init__(self, seconds, on_train=None):
        self.now, self.seconds, self.launched, self.on_train = 0.0, seconds, [], on_train

    def clock(self):
        return self.now

    def __call__(self, arguments, log_file, timeout, program=gpu_matrix.MTBENCH):
        command = arguments[0]
        way = None
        if program == gpu_matrix.REFERENCE_SCRIPT:
            command = "best-by-hand"
            mode = arguments[arguments.index("--compile-mode") + 1] if "--compile-mode" in arguments else None
            way = Way(arguments[arguments.index("--backend") + 1], compile_mode=mode, reference=True)
        elif command == "train":
            label = arguments[arguments.index("--backend") + 1]
            extras = tuple(arguments[i + 1] for i, a in enumerate(arguments) if a == "--extra")
            mode = arguments[arguments.index("--compile-mode") + 1] if "--compile-mode" in arguments else None
            way = Way(label, extras, mode)
        needed = self.seconds["init-weights" if way is None else way.kind]
        self.launched.append(command if way is None else way.label)
        if needed > timeout:
            self.now += timeout
            return gpu_matrix.TimedOut(f"stopped after {timeout:.0f} s")
        if self.on_train and way is not None:
            self.on_train(way)
        self.now += needed
        if way is not None:
            dtype = arguments[arguments.index("--dtype") + 1]
            with open(arguments[arguments.index("--out") + 1], "w") as f:
                json.dump(fake_result(way, dtype, 5.0), f)
        return None


def matrix_args(tmp_path, budget):
    args, _ = gpu_matrix.parse_args(["--budget", str(budget), "--out", str(tmp_path), "--cache-dir", str(tmp_path)])
    return args


def test_rows_that_would_not_fit_are_cut_with_their_estimate_and_a_cheaper_one_still_runs(tmp_path, monkeypatch):
    fake = FakeMtbench({"init-weights": 30, "jax": 50, "torch eager": 20, "torch compiled default": 90})
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    planned = plan_rows(described(), numbers={1, 2, 3, 5}, presets=["small"])  # jax, torch compiled, torch eager, jax float32
    records, results = run_matrix(planned, matrix_args(tmp_path, 150), [], "gpu", clock=fake.clock)
    # 30 s of weights + 50 s of jax leave 70 s: the compiled row's first guess (30 + 70 s) does not fit, torch
    # eager's (30 + 20 s) does and takes 20 s; the second jax row needs what the first took, 50 s, and 50 are left.
    assert fake.launched == ["init-weights", "jax", "torch", "jax"]
    assert [r["status"] for r in records] == ["ran", "cut", "ran", "ran"]
    assert records[1]["reason"] == ("not started: it needs about 100 s (a first guess for torch compiled default: "
                                    "30 s to start (the weights file's) + 70 s); 70 s of the 150 s budget were "
                                    "left")
    assert records[3]["estimate_s"] == 50  # what the first jax row took
    assert list(results) == ["small mixed_bfloat16 jax", "small mixed_bfloat16 torch", "small float32 (highest) jax"]
    summary = gpu_matrix.summarize(records, results, described(), matrix_args(tmp_path, 150), [], "gpu", 150, True)
    assert summary["cut"] == ["small mixed_bfloat16 torch+torch-compile"]
    assert summary["rerun"] == ["python3 benchmarks/gpu_matrix.py --presets small --rows 2 --budget 150"]


def test_a_kind_not_measured_yet_is_estimated_from_its_backends_row_on_this_machine(tmp_path, monkeypatch):
    # An H200 of 2026-12-04: the compiled torch row took 60 s; the first guess for CUDA graphs then (the weights
    # file's 15 s + 130 s) cut row 15 with 133 s left (here 140). Scaled from the row measured here by the guesses'
    # ratio (70 / 70) it needs 60 s, and runs; its reference, row 16, follows it.
    fake = FakeMtbench({"init-weights": 15, "torch compiled default": 60, "torch compiled reduce-overhead": 70,
                        "reference torch": 40})
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    planned = plan_rows(described(), numbers={8, 15, 16}, presets=["gpt2-small"])
    records, _ = run_matrix(planned, matrix_args(tmp_path, 215), [], "gpu", clock=fake.clock)
    assert fake.launched == ["init-weights", "torch+torch-compile+flash-attention",
                             "torch+torch-compile+flash-attention@reduce-overhead", "best-by-hand-torch@reduce-overhead"]
    assert records[1]["estimate_s"] == pytest.approx(60)
    # A JAX row is not estimated from torch's: with nothing of JAX measured it keeps its first guess.
    estimates = gpu_matrix.Estimates("gpu")
    [(torch_row, _), (jax_row, _)] = plan_rows(described(), numbers={8, 7}, presets=["gpt2-small"])[::-1]
    estimates.ran(torch_row, 60)
    assert estimates.row(jax_row)[1].startswith("a first guess for jax")
    assert estimates.row(next(r for r, _ in plan_rows(described(), numbers={13}, presets=["gpt2-small"]))) == (
        pytest.approx(60 * 60 / 70), "gpt2-small mixed_bfloat16 torch+torch-compile+flash-attention took 60 s, x0.86 for "
                           "reference torch (the first guesses' ratio)")


def test_a_reference_whose_row_of_mtbench_did_not_run_is_not_started(tmp_path, monkeypatch):
    # Row 15 (CUDA graphs) cut by the budget: nanoGPT's recipe in CUDA graphs (row 16) has nothing to stand
    # beside, and its minute goes to the rows after it.
    fake = FakeMtbench({"init-weights": 15, "jax": 30, "torch compiled reduce-overhead": 70, "reference torch": 40})
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    planned = plan_rows(described(), numbers={15, 16, 1}, presets=["gpt2-small"])
    # Before the weights file, row 15 needs it (a 40 s guess) and its own first guess (40 s to start + 70 s): 150 s
    # of the 135; jax's 40 + 40 + 40 s fit.
    records, _ = run_matrix(planned, matrix_args(tmp_path, 135), [], "gpu", clock=fake.clock)
    assert [r["run"] for r in records] == ["torch+torch-compile+flash-attention@reduce-overhead",
                                           "best-by-hand-torch@reduce-overhead", "jax"]
    assert [r["status"] for r in records] == ["cut", "cut", "ran"]
    assert records[1]["reason"] == ("not started: row 15 (torch+torch-compile+flash-attention@reduce-overhead), "
                                    "the row it is measured beside, did not run (cut)")
    assert fake.launched == ["init-weights", "jax"]
    # Asked for alone, a reference runs.
    records, _ = run_matrix(plan_rows(described(), numbers={16}, presets=["gpt2-small"]),
                            matrix_args(tmp_path, 1000), [], "gpu", clock=fake.clock)
    assert records[0]["status"] == "ran"


def test_repeats_run_round_robin_and_each_row_reports_its_medians(tmp_path, monkeypatch):
    fake = FakeMtbench({"init-weights": 1, "jax": 1, "torch eager": 1})
    tokens = iter([100.0, 300.0, 200.0, 600.0, 150.0, 400.0])  # jax, torch, jax, torch, ...

    def run(arguments, log_file, timeout, program=gpu_matrix.MTBENCH):
        failure = fake(arguments, log_file, timeout, program)
        if arguments[0] == "train":
            out = arguments[arguments.index("--out") + 1]
            with open(out) as f:
                result = json.load(f)
            result["timing"]["tokens_per_s"] = next(tokens)
            with open(out, "w") as f:
                json.dump(result, f)
        return failure

    monkeypatch.setattr(gpu_matrix, "run_mtbench", run)
    args, _ = gpu_matrix.parse_args(["--repeats", "3", "--budget", "1000", "--out", str(tmp_path), "--cache-dir",
                                     str(tmp_path)])
    records, _ = run_matrix(plan_rows(described(), numbers={1, 3}, presets=["small"]), args, [], "gpu",
                            clock=fake.clock)
    assert fake.launched == ["init-weights", "jax", "torch", "jax", "torch", "jax", "torch"]
    assert [(r["status"], r["repeats"], r["tokens_per_s"]) for r in records] == [("ran", 3, 150.0),
                                                                                ("ran", 3, 400.0)]
    assert [m["tokens_per_s"] for m in records[1]["measured"]] == [300.0, 600.0, 400.0]
    assert {"small-mixed_bfloat16-jax-repeat2.json", "small-mixed_bfloat16-torch-repeat3.json"} <= \
        set(os.listdir(tmp_path / "small"))


def test_the_references_run_their_script_and_each_row_is_set_beside_its_backends_reference(tmp_path, monkeypatch):
    fake = FakeMtbench({"init-weights": 1, "jax": 1, "torch compiled default": 1, "reference jax": 1,
                        "reference torch": 1, "torch compiled reduce-overhead": 1})
    steps_ms = {"jax+flash-attention": 11.0, "torch+torch-compile+flash-attention": 12.0, "best-by-hand-jax": 10.0,
                "best-by-hand-torch": 15.0, "torch+torch-compile+flash-attention@reduce-overhead": 11.0,
                "best-by-hand-torch@reduce-overhead": 10.0}
    programs = []

    def run(arguments, log_file, timeout, program=gpu_matrix.MTBENCH):
        programs.append(program)
        failure = fake(arguments, log_file, timeout, program)
        if "--out" in arguments and arguments[0] != "init-weights":
            out = arguments[arguments.index("--out") + 1]
            with open(out) as f:
                result = json.load(f)
            result["timing"]["step_s_median"] = steps_ms[fake.launched[-1]] / 1e3
            with open(out, "w") as f:
                json.dump(result, f)
        return failure

    monkeypatch.setattr(gpu_matrix, "run_mtbench", run)
    records, _ = run_matrix(plan_rows(described(), numbers={7, 8, 12, 13, 15, 16}, presets=["gpt2-small"]),
                            matrix_args(tmp_path, 1000), [], "gpu", clock=fake.clock)
    assert fake.launched == ["init-weights", "jax+flash-attention", "torch+torch-compile+flash-attention",
                             "best-by-hand-jax", "best-by-hand-torch",
                             "torch+torch-compile+flash-attention@reduce-overhead",
                             "best-by-hand-torch@reduce-overhead"]
    assert programs[3:5] == [gpu_matrix.REFERENCE_SCRIPT] * 2 and gpu_matrix.MTBENCH in programs[:3]
    assert programs[-1] == gpu_matrix.REFERENCE_SCRIPT
    gpu_matrix.add_best_by_hand_ratios(records)
    by_run = {r["run"]: r for r in records}
    assert by_run["jax+flash-attention"]["step_vs_best_by_hand"] == pytest.approx(1.1)
    assert by_run["torch+torch-compile+flash-attention"]["step_vs_best_by_hand"] == pytest.approx(0.8)
    assert by_run["jax+flash-attention"]["vs_best_by_hand"] == "1.10x (memory 1.00x)"
    assert "vs_best_by_hand" not in by_run["best-by-hand-jax"]
    # In CUDA graphs, like for like: row 15 beside nanoGPT's recipe in CUDA graphs, not beside row 13.
    assert by_run["torch+torch-compile+flash-attention@reduce-overhead"]["vs_best_by_hand"] == (
        "1.10x (memory 1.00x) vs best-by-hand-torch@reduce-overhead")
    reference = next(row for row, _ in plan_rows(described(), numbers={16}, presets=["gpt2-small"]))
    assert reference.train_arguments()[:4] == ["--backend", "torch", "--compile-mode", "reduce-overhead"]


def test_a_profiled_row_is_set_beside_its_references_kernels_kind_by_kind():
    def profiled(steps_ms, **kinds_ms):
        # Two profiled steps on one device: each kind's seconds over both steps.
        total = sum(kinds_ms.values())
        kinds = [{"kind": kind, "seconds": 2 * ms / 1e3, "share": ms / total}
                 for kind, ms in sorted(kinds_ms.items(), key=lambda item: -item[1])]   # largest first
        return [{"timing": {"step_s_median": steps_ms / 1e3},
                 "profile": {"steps": [5, 6], "operations": {
                     "on": "device", "units": 1, "busy_s": 2 * total / 1e3, "busy_share": 0.9, "window_s": 1.0,
                     "total_s": 2 * total / 1e3, "kinds": kinds,
                     "top": [{"name": "nvjet_tst", "seconds": 0.01, "calls": 4, "share": 0.5}]}}}]

    records = [{"key": "gpt2-small/mixed_bfloat16/jax+flash-attention", "row": 7, "run": "jax+flash-attention",
                "status": "ran", "best_by_hand": "gpt2-small/mixed_bfloat16/best-by-hand-jax"},
               {"key": "gpt2-small/mixed_bfloat16/best-by-hand-jax", "row": 12, "run": "best-by-hand-jax",
                "status": "ran"}]
    results = {records[0]["key"]: profiled(40, matmul=20.4, other=9.0, attention=4.0),
               records[1]["key"]: profiled(38, matmul=20.0, attention=4.0, other=7.5, memory=0.5)}
    lines = gpu_matrix.profile_lines(records, results)
    assert lines[1] == ("row 7 against best-by-hand-jax, kernels a step by kind: matmul 20.4 vs 20.0 ms (1.02x), "
                        "other 9.0 vs 7.5 ms (1.20x), attention 4.0 vs 4.0 ms (1.00x), memory 0.0 vs 0.5 ms (0.00x)")
    assert [line.split(":")[0] for line in lines] == ["profile of row 7 (jax+flash-attention)", "row 7 against "
                                                      "best-by-hand-jax, kernels a step by kind",
                                                      "profile of row 12 (best-by-hand-jax)"]
    # Read on a host, or without a reference: no line of kinds.
    results[records[1]["key"]][0]["profile"]["operations"].pop("kinds")
    assert len(gpu_matrix.profile_lines(records, results)) == 2


def test_a_row_still_running_when_the_budget_ends_is_stopped(tmp_path, monkeypatch):
    fake = FakeMtbench({"init-weights": 10, "jax": 200})  # guessed: 40 s for the weights, 40 + 40 s for the row
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    records, results = run_matrix(plan_rows(described(), numbers={1}, presets=["small"]), matrix_args(tmp_path, 130), [], "gpu",
                                  clock=fake.clock)
    assert fake.now == 130 and not results
    assert records[0]["status"] == "stopped"
    assert records[0]["reason"].startswith("the 130 s budget ran out 120 s into the row (estimated at 120 s)")


def test_a_budget_too_small_for_the_weights_and_a_row_starts_nothing(tmp_path, monkeypatch):
    fake = FakeMtbench({"init-weights": 10, "jax": 10})
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    records, _ = run_matrix(plan_rows(described(), numbers={1, 3}, presets=["small"]), matrix_args(tmp_path, 30), [], "gpu",
                            clock=fake.clock)
    assert fake.launched == [] and [r["status"] for r in records] == ["cut", "cut"]
    assert "and the preset's weights file first (about 40 s)" in records[0]["reason"]


def test_the_table_and_json_are_on_disk_and_the_row_printed_as_each_row_ends(tmp_path, monkeypatch, capsys):
    seen = []

    def look_at_the_files(way):  # called as a row starts: every row before it must already be written
        with open(tmp_path / "gpu-matrix.json") as f:
            rows = json.load(f)["rows"]
        with open(tmp_path / "gpu-matrix.md") as f:
            table = f.read()
        seen.append((way.label, [r["status"] for r in rows], table.count("-step |")))

    fake = FakeMtbench({"init-weights": 1, "jax": 1, "torch eager": 1}, on_train=look_at_the_files)
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    monkeypatch.setattr(gpu_matrix, "run_probe", lambda: described())
    # On the real clock the fake rows take no time: a budget far above their estimates lets both run.
    assert gpu_matrix.main(["--runs", "jax,torch", "--dtypes", BF16, "--presets", "small", "--repeats", "1",
                            "--budget", "1000",
                            "--out", str(tmp_path), "--cache-dir", str(tmp_path)]) == 0
    assert seen == [("jax", ["running", "pending"], 0), ("torch", ["ran", "running"], 1)]
    err = capsys.readouterr().err
    assert "| 1 | small | mixed_bfloat16 | jax | jax-step" in err and "| 3 | small | mixed_bfloat16 | torch |" in err
    with open(tmp_path / "gpu-matrix.json") as f:
        final = json.load(f)
    assert final["finished"] and [r["status"] for r in final["rows"]] == ["ran", "ran"]


def test_an_interrupted_matrix_marks_the_running_row_stopped_and_writes_what_it_has(tmp_path, monkeypatch):
    def interrupt(way):  # SIGTERM arrives as KeyboardInterrupt (stop_on_sigterm)
        raise KeyboardInterrupt

    fake = FakeMtbench({"init-weights": 1, "jax": 1, "torch eager": 1}, on_train=interrupt)
    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake)
    published = []
    with pytest.raises(KeyboardInterrupt):
        run_matrix(plan_rows(described(), numbers={1, 3}, presets=["small"]), matrix_args(tmp_path, 1000), [], "gpu", clock=fake.clock,
                   publish=lambda records, results, record: published.append([r["status"] for r in records]))
    assert published == [["pending", "pending"], ["running", "pending"], ["stopped", "cut"]]


def test_a_rows_wall_time_is_split_into_what_one_process_for_several_rows_could_save_and_the_rest():
    # The run's total time leaves out a CPU's peak, measured once a machine: its own part, counted once.
    timing = {"total_s": 50.0, "compile_s": 20.0, "steady_s": 15.0,
              "phases_s": {"data": 1.0, "backend": 4.0, "tokenizer": 0.5, "build": 3.0, "peak": 2.0, "train": 40.0}}
    split = gpu_matrix.wall_split({"timing": timing}, 62.0)
    assert split == {"process": 10.0, "backend": 4.0, "peak": 2.0, "data_and_build": 4.5, "compile": 20.0,
                     "steady_steps": 15.0, "rest": 6.5}
    reference = gpu_matrix.wall_split({"timing": {"total_s": 30.0, "compile_s": 10.0, "steady_s": 12.0,
                                                  "phases_s": {"build": 5.0, "train": 24.0}}}, 40.0)
    assert reference == {"process": 10.0, "backend": 0.0, "peak": 0.0, "data_and_build": 5.0, "compile": 10.0,
                         "steady_steps": 12.0, "rest": 3.0}
    records = [{"measured": [{"wall_split_s": split}, {"wall_split_s": split}]},
               {"measured": [{"wall_split_s": reference}]}, {"status": "cut"}]
    assert gpu_matrix.wall_split_line(records) == (
        "where the rows' 164 s went: the process starting and ending 30 s (18 %), keras and the devices starting "
        "8 s (5 %), the peak measured 4 s (2 %), data and model build 14 s (9 %), compilation 50 s (30 %), steady "
        "steps 42 s (26 %), the rest 16 s (10 %); running several rows in one process would save at most the first "
        "two")
    assert gpu_matrix.wall_split_line([{"status": "cut"}]) is None


def test_a_16_bit_rows_parity_cell_says_its_means_and_its_first_steps():
    jax, compiled, flash = Way("jax"), Way("torch", ("torch-compile",)), Way("torch", ("flash-attention",))
    rows = [Row("gpt2-small", BF16, way, None, number) for number, way in enumerate((jax, compiled, flash), 1)]
    results = {row.key: fake_result(row.way, BF16, 5.0) for row in rows}
    results[rows[0].key]["history"] = [{"loss": 5.0}] * 3
    results[rows[1].key]["history"] = [{"loss": 5.0}, {"loss": 5.0235}, {"loss": 5.0}]  # 0.47 % at step 2
    results[rows[2].key]["history"] = [{"loss": 5.0}, {"loss": 5.002}, {"loss": 5.0}]
    records = [{**gpu_matrix.first_record(row, None), "status": "ran"} for row in rows]
    add_parity(records, {key: [result] for key, result in results.items()})
    assert records[1]["parity"] == "0.16 % in steps 1-3 (10-step means) vs jax; steps 1-3: 0.47 %, NOT within 0.25 %"
    assert records[2]["parity"] == "0.013 % in steps 1-3 (10-step means) vs jax; steps 1-3: 0.04 %"


def test_table_labels_every_row_with_the_step_that_ran_or_why_not():
    jax, torch = Way("jax"), Way("torch", ("torch-compile",))
    rows = [Row("small", "float32", jax, "highest", 5), Row("small", "float32", torch, "highest", 10),
            Row("small", "float32", jax, "high", 6)]
    results = {rows[0].key: fake_result(jax, "float32", 5.0), rows[1].key: fake_result(torch, "float32", 5.002),
               rows[2].key: fake_result(jax, "float32", 5.2, precision="high")}
    records = [{**gpu_matrix.first_record(row, None), "status": "ran", "reason": None, "wall_s": 42.0,
                **gpu_matrix.figures(results[row.key])} for row in rows]
    records[1]["what_ran"] = "mode default, 0 graph breaks"
    records.append(gpu_matrix.first_record(Row("small", BF16, Way("jax", ("flash-attention",)), None, 7),
                                           FLASH_REFUSED))
    add_parity(records, {key: [result] for key, result in results.items()})
    # float32 rows are compared within one matmul precision: highest with highest, high with nothing
    assert records[0]["parity"] == "reference" and records[1]["parity"] == "0.04 % at step 1 vs jax"
    assert records[2]["parity"].startswith("not checked: no other float32 high run")
    lines = markdown_table(records).splitlines()
    assert lines[0].split(" | ")[4] == "train step that ran" and len(lines) == 6
    assert [cell.strip() for cell in lines[2].strip("|").split("|")] == [
        "5", "small", "float32 (highest)", "jax", "jax-step", "12.3", "45,678", "1.5", "25.0 %", "3", "", "reference",
        "42"]
    assert "torch-step (mode default, 0 graph breaks)" in lines[3]
    assert f"skipped: {FLASH_REFUSED}" in lines[5]


def test_bad_choices_are_refused_with_one_line():
    for argv, message in ((["--runs", "jax,mxnet"], "--runs: mxnet is none of jax, torch"),
                          (["--rows", "0,3"], "--rows: '0,3' is not row numbers from 1 to 16"),
                          (["--rows", "two"], "--rows: 'two' is not row numbers")):
        proc = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr.splitlines()[-1], proc.stderr


def run_script(cache_dir, out, *argv):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(MTBENCH_LOAD_PLUGINS="", **CPU_ONLY)  # the CPU's plan, on a GPU machine too
    proc = subprocess.run([sys.executable, SCRIPT, *argv, "--out", str(out), "--cache-dir", cache_dir, "--",
                           "--max-pairs", "4000", "--valid-size", "20", "--test-size", "20", "--max-len", "32",
                           "--batch-size", "16"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


RUNS = ["torch", "torch+torch-compile@reduce-overhead", "jax+flash-attention"]


@pytest.fixture(scope="module")
def cpu_matrix(cache_dir, tmp_path_factory):
    """The CPU's plan cut down to three bfloat16 rows: torch eager trains a few steps, and the CPU rules out CUDA
    graphs and flash attention (one training process: a second would double the test's time)."""
    out = tmp_path_factory.mktemp("gpu-matrix")
    proc = run_script(cache_dir, out, "--runs", ",".join(RUNS), "--dtypes", BF16, "--steps", "6", "--budget", "400",
                      "--profile", "2")
    return proc.stdout, proc.stderr, json_answer(proc), out


@pytest.mark.slow
def test_cpu_matrix_trains_and_skips_rows_and_says_why(cpu_matrix):
    _, _, summary, out = cpu_matrix
    assert summary["device_kind"] == "cpu" and summary["presets"] == ["tiny"] and summary["finished"]
    rows = {row["run"]: row for row in summary["rows"]}
    assert list(rows) == RUNS
    assert [rows[run]["status"] for run in RUNS] == ["ran", "skipped", "skipped"]
    torch = rows["torch"]
    assert torch["row"] == 3 and torch["train_step"] == "torch-eager" and torch["steady_steps"] > 0
    assert torch["step_ms_median"] > 0 and torch["wall_s"] > 0 and torch["estimate_s"] > 0
    assert torch["device"]["kind"] == "cpu" and os.path.exists(torch["result_file"])
    with open(torch["result_file"]) as f:
        result = json.load(f)
    split, timing = torch["wall_split_s"], result["timing"]
    # Each part as the run timed it, and together no more than the row's wall time: nothing counted twice.
    assert (split["compile"], split["steady_steps"]) == (timing["compile_s"], timing["steady_s"])
    peak = timing["phases_s"].get("peak", 0.0)  # measured once a machine, outside the run's total time
    assert split["process"] == pytest.approx(torch["wall_s"] - timing["total_s"] - peak) and split["process"] > 0
    assert split["backend"] == timing["phases_s"]["backend"] > 0 and split["data_and_build"] > 0
    assert split["rest"] >= 0 and split["steady_steps"] > 0
    assert summary["wall_split"].startswith(f"where the rows' {torch['wall_s']:.0f} s went: the process starting")
    assert result["config"]["measure_only"] and result["config"]["dtype"] == BF16
    # --profile reached the row: its steps after the warm-up and the host-wait probe's, traced beside its result
    assert result["profile"]["steps"] == [3, 4] and result["profile"]["files"] == ["trace.json"]
    assert os.path.isfile(os.path.join(result["profile"]["directory"], "trace.json"))
    operations = result["profile"]["operations"]
    assert operations["on"] == "host" and operations["top"][0]["calls"] > 0
    per_step = operations["busy_s"] / 2
    # a host operator's name past 40 characters is cut to 39 and an ellipsis (autograd's are that long)
    shown = [t["name"] if len(t["name"]) <= 40 else t["name"][:39] + "\u2026" for t in operations["top"][:3]]
    assert summary["profiles"] == [f"profile of row 3 (torch): host busy {per_step * 1e3:.1f} ms a step "
                                   f"({per_step / result['timing']['step_s_median'] * 100:.0f} % of a steady step; "
                                   f"{operations['busy_share'] * 100:.0f} % of the profiled window); longest: " +
                                   ", ".join(f"{name} {t['share'] * 100:.0f} % ({t['calls']} calls)"
                                             for name, t in zip(shown, operations["top"][:3]))]
    assert torch["parity"].startswith("not checked")  # the only bfloat16 row that ran
    assert summary["cut"] == [] and summary["rerun"] == []
    assert rows["torch+torch-compile@reduce-overhead"]["reason"].startswith("CUDA graphs need a CUDA device")
    assert rows["jax+flash-attention"]["reason"].startswith("extra 'flash-attention' cannot run here")
    assert summary["config"]["batch_size"] == 16 and summary["env"]["keras"]
    with open(os.path.join(out, "gpu-matrix.json")) as f:
        assert json.load(f)["rows"] == summary["rows"]


@pytest.mark.slow
def test_cpu_matrix_prints_device_versions_config_and_each_row(cpu_matrix):
    stdout, stderr, _, out = cpu_matrix
    assert "device (jax): 1x" in stdout and "device (torch): 1x" in stdout
    assert "versions: python" in stdout and "config shared by every row: " in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| # ")]
    assert [row.split(" | ")[3] for row in rows] == RUNS
    assert rows[0].split(" | ")[4].startswith("torch-eager (attention")
    assert "skipped: CUDA graphs need a CUDA device" in rows[1]
    assert rows[0] in stderr  # printed as the row ended
    assert "profile of row 3 (torch): host busy " in stdout
    with open(os.path.join(out, "gpu-matrix.md")) as f:
        assert rows[0] in f.read()


def test_a_budget_too_small_for_any_row_cuts_every_row_with_the_reason(cache_dir, tmp_path):
    proc = run_script(cache_dir, tmp_path, "--runs", "jax,torch", "--dtypes", "float32", "--budget", "1")
    summary = json_answer(proc)
    assert [row["status"] for row in summary["rows"]] == ["cut", "cut"]
    for row in summary["rows"]:
        assert row["reason"].startswith("not started: it needs about ")
        assert row["reason"].endswith("of the 1 s budget were left")
    assert summary["rerun"] == ["python3 benchmarks/gpu_matrix.py --presets tiny --rows 5,6 --budget 1 -- "
                                "--max-pairs 4000 --valid-size 20 --test-size 20 --max-len 32 --batch-size 16"]
    assert not os.path.exists(tmp_path / "tiny")  # no weights file, no row
    with open(tmp_path / "gpu-matrix.md") as f:
        assert "cut by the budget (1 s): tiny float32 (highest) jax, tiny float32 (high) jax" in f.read()


def language_model_record(run, step_ms, repeats=1):
    return {"preset": "gpt2-small", "dtype": BF16, "run": run, "key": f"gpt2-small {BF16} {run}", "status": "ran",
            "step_ms_median": step_ms, "repeats": repeats}


def steady_steps(step_ms, jitter_ms, steps=48, window=1):
    """A run's history: its first step, then `steps` steady ones spread evenly by up to +-`jitter_ms` around
    `step_ms` (their median), timed in windows of `window` steps."""
    offsets = [jitter_ms * (2 * i / (steps - 1) - 1) for i in range(steps)]
    return {"history": [{"first_of_shape": True, "seconds": 9.0, "tokens": 16384}]
            + [{"seconds": (step_ms + offset) / 1e3, "tokens": 16384, "window_steps": window} for offset in offsets]}


def test_the_verdict_line_says_whether_mtbench_ranks_the_frameworks_as_the_references_do():
    # The H100's rows of 2026-11-27: mtbench's JAX step 37.0 ms, its compiled torch step 37.6, the references 38.8
    # (JAX) and 36.6 (torch); the slower unfused rows and mtbench's step in the reference's loop do not count.
    steps = (("jax+flash-attention", 37.0), ("torch+torch-compile+flash-attention", 37.6), ("jax", 45.0),
             ("torch", 90.0), ("best-by-hand-jax", 38.8), ("best-by-hand-torch", 36.6),
             ("jax-step-in-reference-loop", 30.0))
    records = [language_model_record(run, ms) for run, ms in steps]
    records.append({**language_model_record("torch+torch-compile", None), "status": "cut"})
    # Without the rows' results (their steady steps), by the medians alone.
    [verdict] = gpu_matrix.verdicts(records)
    assert verdict["mtbench"]["rows"] == {"jax": "jax+flash-attention", "torch": "torch+torch-compile+flash-attention"}
    assert (verdict["mtbench"]["leader"], verdict["references"]["leader"]) == ("jax", "torch")
    assert verdict["mtbench"]["ratio"] == pytest.approx(37.6 / 37.0)
    assert verdict["references"]["ratio"] == pytest.approx(38.8 / 36.6)
    assert not verdict["same_verdict"]
    assert verdict["line"] == (
        "gpt2-small mixed_bfloat16, JAX against torch: mtbench's fastest rows put jax ahead, 1.02x "
        "(jax+flash-attention 37.0 ms, torch+torch-compile+flash-attention 37.6 ms); the best-by-hand references "
        "put torch ahead, 1.06x (best-by-hand-jax 38.8 ms, best-by-hand-torch 36.6 ms): mtbench changes the verdict "
        "(medians, no interval)")
    # With them, one run a row: steps spread +-0.2 ms give each ranking a narrow interval around its ratio, of the
    # noise within each run alone: neither ranking is called, nor whether mtbench changes the verdict.
    results = {record["key"]: [steady_steps(ms, 0.2)] for record, (_, ms) in zip(records, steps)}
    [verdict] = gpu_matrix.verdicts(records, results)
    ours, references = verdict["mtbench"], verdict["references"]
    assert (ours["leader"], references["leader"], verdict["same_verdict"]) == (None, None, None)
    assert ours["undetermined"] == references["undetermined"] == ONE_REPEAT_EACH
    assert ours["interval"][0] < 37.6 / 37.0 < ours["interval"][1] < 1.03 and ours["interval"][0] > 1.005
    assert references["interval"][0] < 38.8 / 36.6 < references["interval"][1] < 1.07
    assert verdict["line"].endswith(
        "whether mtbench changes the verdict is undetermined (one run a row: 95 % intervals of the noise within each "
        "run, not between runs)")
    assert (f"mtbench's fastest rows put undetermined ({ONE_REPEAT_EACH}), jax 1.02x (1.01–1.02) "
            f"(jax+flash-attention 37.0 ms") in verdict["line"]
    # Three runs a row, each steps spread +-0.2 ms: each ranking a verdict, which mtbench changes.
    for record in records:
        record["repeats"] = 3
    results = {record["key"]: [steady_steps(ms + 0.05 * k, 0.2) for k in range(3)]
               for record, (_, ms) in zip(records, steps)}
    [verdict] = gpu_matrix.verdicts(records, results)
    ours, references = verdict["mtbench"], verdict["references"]
    assert (ours["leader"], references["leader"], verdict["same_verdict"]) == ("jax", "torch", False)
    assert verdict["line"].endswith(": mtbench changes the verdict (3 runs a row, 95 % intervals)")
    # mtbench's torch runs scattered by 3 ms between them: no ranking beyond that noise, not the references' verdict.
    results[records[1]["key"]] = [steady_steps(37.6 + offset, 0.2) for offset in (-3.0, 0.0, 3.0)]
    [verdict] = gpu_matrix.verdicts(records, results)
    assert verdict["mtbench"]["leader"] is None and verdict["same_verdict"] is False
    assert verdict["mtbench"]["ratio"] == pytest.approx(37.6 / 37.0, rel=0.01)
    assert "mtbench's fastest rows put neither ahead beyond the noise, jax 1.01x (0." in verdict["line"]
    # Repeats: the interval spans the runs; mtbench's torch step now ahead as the references' is.
    records[1].update(step_ms_median=36.4, repeats=3)
    results[records[1]["key"]] = [steady_steps(36.4 + 0.05 * k, 0.2) for k in range(3)]
    [verdict] = gpu_matrix.verdicts(records, results)
    assert verdict["mtbench"]["leader"] == "torch" and verdict["same_verdict"]
    assert verdict["line"].endswith(": the same verdict (3 runs a row, 95 % intervals)")
    # 48 steps timed 10 at a time: 5 windows a run, which the line says are too few for an interval to rest on
    # where each row is one run (over 3 runs each run's figure holds its windows: nothing is resampled).
    results = {key: [steady_steps(36.4, 0.2, window=10)] for key in results}
    for record in records:
        record["repeats"] = 1
    [verdict] = gpu_matrix.verdicts(records, results)
    assert verdict["line"].endswith("(one run a row: 95 % intervals of the noise within each run, not between runs; "
                                    "5 steady timing windows in a run, too few to resample (more --steps, or -- "
                                    "--timing-window N smaller))")
    assert gpu_matrix.verdicts([r for r in records if r["run"] != "best-by-hand-torch"]) == []


def test_a_row_in_cuda_graphs_counts_in_a_verdict_only_beside_one_on_the_other_side():
    # The H200's table of 2026-12-04: row 15 cut, nanoGPT's recipe in CUDA graphs ran (32.7 ms). Ranked beside
    # mtbench's rows without CUDA graphs it made the references' torch the faster by a kind of step mtbench's
    # rows had not run.
    steps = (("jax+flash-attention", 34.6), ("torch+torch-compile+flash-attention", 36.1), ("best-by-hand-jax", 34.2),
             ("best-by-hand-torch", 33.0), ("best-by-hand-torch@reduce-overhead", 32.7))
    records = [language_model_record(run, ms) for run, ms in steps]
    [verdict] = gpu_matrix.verdicts(records)
    assert verdict["references"]["rows"] == {"jax": "best-by-hand-jax", "torch": "best-by-hand-torch"}
    assert verdict["references"]["steps_ms"]["torch"] == 33.0
    assert verdict["line"].endswith("(medians, no interval; left out, as CUDA graphs ran on one side only: "
                                    "best-by-hand-torch@reduce-overhead)")
    # With mtbench's row in CUDA graphs beside it, both count.
    records.append(language_model_record("torch+torch-compile+flash-attention@reduce-overhead", 33.5))
    [verdict] = gpu_matrix.verdicts(records)
    assert verdict["references"]["steps_ms"]["torch"] == 32.7 and verdict["mtbench"]["steps_ms"]["torch"] == 33.5
    assert "left out" not in verdict["line"]
    # The other way round: mtbench's alone in CUDA graphs is left out.
    [verdict] = gpu_matrix.verdicts([r for r in records if r["run"] != "best-by-hand-torch@reduce-overhead"])
    assert verdict["mtbench"]["steps_ms"]["torch"] == 36.1


def test_the_versions_and_host_come_from_a_row_mtbench_trained_even_when_a_reference_ran_first():
    # A best-by-hand result's `env` names its device alone; the CPU matrix of gpt-char printed "versions: " empty
    # and "host: None" when its reference rows ran first.
    results = {"gpt-char mixed_bfloat16 best-by-hand-torch": [{"backend": "torch", "env": {"device": CPU}}],
               "gpt-char mixed_bfloat16 jax": [{"backend": "jax", "env": {
                   "device": CPU, "python": "3.12.3", "keras": "3.15.1", "cpu_model": "a CPU", "cpu_count": 2}}]}
    env, devices = gpu_matrix.environment(results, described(jax=CPU, torch=CPU))
    assert (env["python"], env["keras"], env["cpu_model"]) == ("3.12.3", "3.15.1", "a CPU") and "device" not in env
    assert devices == {"jax": CPU, "torch": CPU}
