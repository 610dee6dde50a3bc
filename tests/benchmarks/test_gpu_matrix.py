"""benchmarks/gpu_matrix.py: which rows a machine gets and why the others are skipped (a GPU's matrix is planned
here from a described GPU), how the budget cuts rows, and one real run on the CPU's tiny matrix, one row trained and
three listed as cut or skipped, whose table and JSON line are checked (not its timings)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import gpu_matrix
from benchmarks.gpu_matrix import Row, Way, add_parity, markdown_table, plan_rows, run_matrix
from conftest import REPOSITORY

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "gpu_matrix.py")
H100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1}
CPU = {"kind": "cpu", "name": "some CPU", "count": 1}
FLASH_REFUSED = "extra 'flash-attention' cannot run here: needs a CUDA GPU (or TPU) and float16/bfloat16"


def described(jax=H100, torch=H100, refusals=None):
    backends = {name: {"device": device} if isinstance(device, dict) else {"missing": device}
                for name, device in (("jax", jax), ("torch", torch))}
    return {"backends": backends, "refusals": refusals or {}}


def test_a_gpu_gets_small_and_base_in_both_dtypes_with_cuda_graphs():
    refusals = {f"{preset} float32 {way.label}": FLASH_REFUSED for preset in ("small", "base")
                for way in gpu_matrix.WAYS if "flash-attention" in way.extras}
    planned = plan_rows(described(refusals=refusals))
    assert len(planned) == 2 * 2 * len(gpu_matrix.WAYS)
    assert [row.preset for row, _ in planned[::len(gpu_matrix.WAYS) * 2]] == ["small", "base"]
    skipped = {row.key: reason for row, reason in planned if reason}
    assert skipped == refusals  # flash attention in float32 only; CUDA graphs and bfloat16 flash rows run
    assert ("small mixed_bfloat16 torch+torch-compile@reduce-overhead" in
            [row.key for row, reason in planned if reason is None])


def test_a_cpu_gets_the_tiny_matrix_and_says_why_cuda_graphs_are_skipped():
    planned = plan_rows(described(jax=CPU, torch=CPU))
    assert {row.preset for row, _ in planned} == {"tiny"}
    reasons = {row.way.label: reason for row, reason in planned if row.dtype == "float32"}
    assert reasons["torch+torch-compile@reduce-overhead"].startswith("CUDA graphs need a CUDA device")
    assert reasons["jax"] is None and reasons["torch+torch-compile"] is None


def test_a_backend_without_the_gpu_or_not_installed_is_skipped_with_the_reason():
    cpu_torch = plan_rows(described(torch=CPU), presets=["small"], dtypes=["float32"])
    assert all("torch sees no GPU here" in reason for row, reason in cpu_torch if row.way.backend == "torch")
    assert all(reason is None for row, reason in cpu_torch if row.way == Way("jax"))
    no_jax = plan_rows(described(jax="backend 'jax' needs jax, which is not installed"), presets=["small"])
    assert all("not installed" in reason for row, reason in no_jax if row.way.backend == "jax")


def test_the_probe_refuses_what_mtbench_train_would_refuse_here():
    probe = gpu_matrix.probe_machine()
    from mtbench.keras_models.presets import PRESETS
    assert len(probe["refusals"]) == len(PRESETS) * len(gpu_matrix.DTYPES) * len(gpu_matrix.WAYS)
    if gpu_matrix.device_kind(probe) == "cpu":
        assert probe["refusals"]["tiny mixed_bfloat16 jax+flash-attention"].startswith(
            "extra 'flash-attention' cannot run here: needs a CUDA GPU")
        assert probe["refusals"]["tiny float32 jax"] is None


def fake_result(way, dtype, loss):
    return {"backend": way.backend, "extras": list(way.extras), "status": "completed", "status_reason": None,
            "train_step": f"{way.backend}-step", "extras_record": {}, "model": {"dropout": 0.0},
            "config": {"dtype": dtype, "steps": 3, "seed": 0, "compile_mode": way.compile_mode or "default"},
            "history": [{"loss": loss}, {"loss": loss}],
            "timing": {"step_s_median": 0.0123, "tokens_per_s": 45678.0, "compile_s": 1.5, "steady_steps": 1,
                       "clock": "a clock"},
            "utilization": {"mfu": 0.25}, "memory": {"peak_device_bytes": 3 * 2 ** 20}, "env": {"device": H100}}


def test_the_budget_stops_new_rows_and_names_them(tmp_path, monkeypatch):
    now = [0.0]
    launched = []

    def fake_mtbench(arguments, log_file, timeout):
        launched.append(arguments[0])
        now[0] += 100.0  # every process takes 100 s
        if arguments[0] == "train":
            way = Way("jax")
            with open(arguments[arguments.index("--out") + 1], "w") as f:
                json.dump(fake_result(way, "float32", 5.0), f)
        return None

    monkeypatch.setattr(gpu_matrix, "run_mtbench", fake_mtbench)
    args, _ = gpu_matrix.parse_args(["--budget", "150", "--out", str(tmp_path), "--cache-dir", str(tmp_path)])
    planned = plan_rows(described(jax=CPU, torch=CPU), dtypes=["float32"],
                        ways=[Way("jax"), Way("torch", ("torch-compile",), "reduce-overhead"), Way("torch")])
    records, results = run_matrix(planned, args, [], clock=lambda: now[0])
    assert launched == ["init-weights", "train"]  # 200 s spent after the first row: nothing else starts
    assert [r["status"] for r in records] == ["ran", "skipped", "cut"]
    assert "budget of 150 s" in records[2]["reason"]
    assert list(results) == ["tiny float32 jax"]


def test_table_labels_every_row_with_the_step_that_ran_or_why_not():
    jax, torch = Way("jax"), Way("torch", ("torch-compile",))
    results = {"small float32 jax": fake_result(jax, "float32", 5.0),
               "small float32 torch+torch-compile": fake_result(torch, "float32", 5.01)}
    records = [{"preset": "small", "dtype": "float32", "run": way.label, "status": "ran", "reason": None,
                **gpu_matrix.figures(results[Row("small", "float32", way).key])} for way in (jax, torch)]
    records[1]["what_ran"] = "mode default, 0 graph breaks"
    records.append({"preset": "small", "dtype": "float32", "run": "jax+flash-attention", "status": "skipped",
                    "reason": FLASH_REFUSED})
    add_parity(records, results)
    assert records[0]["parity"] == "reference" and records[1]["parity"] == "0.2 % vs jax"
    lines = markdown_table(records).splitlines()
    assert lines[0].split(" | ")[3] == "train step that ran" and len(lines) == 5
    assert [cell.strip() for cell in lines[2].strip("|").split("|")] == [
        "small", "float32", "jax", "jax-step", "12.3", "45,678", "1.5", "25.0 %", "3", "reference"]
    assert "torch-step (mode default, 0 graph breaks)" in lines[3]
    assert f"skipped: {FLASH_REFUSED}" in lines[4]


def test_unknown_runs_are_refused_with_the_choices():
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", "jax,mxnet"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--runs: mxnet is none of jax, torch" in proc.stderr


@pytest.fixture(scope="module")
def cpu_matrix(cache_dir, tmp_path_factory):
    """The CPU's matrix cut down to four float32 rows: torch trains a few steps, jax is cut by a budget that the
    first row alone spends (a second training process would double the test's time), and the CPU rules out CUDA
    graphs and flash attention."""
    out = tmp_path_factory.mktemp("gpu-matrix")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["MTBENCH_LOAD_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, SCRIPT, "--runs", ",".join(RUNS), "--dtypes", "float32", "--steps", "6",
                           "--budget", "1", "--out", str(out), "--cache-dir", cache_dir, "--", "--max-pairs", "4000",
                           "--valid-size", "20", "--test-size", "20", "--max-len", "32", "--batch-size", "16"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1]), out


RUNS = ["torch", "jax", "torch+torch-compile@reduce-overhead", "jax+flash-attention"]


def test_cpu_matrix_trains_cuts_and_skips_rows_and_says_why(cpu_matrix):
    _, summary, out = cpu_matrix
    assert summary["device_kind"] == "cpu" and summary["presets"] == ["tiny"]
    rows = {row["run"]: row for row in summary["rows"]}
    assert list(rows) == RUNS
    assert [rows[run]["status"] for run in RUNS] == ["ran", "cut", "skipped", "skipped"]
    torch = rows["torch"]
    assert torch["train_step"] == "torch-eager" and torch["step_ms_median"] > 0 and torch["steady_steps"] > 0
    assert torch["device"]["kind"] == "cpu" and os.path.exists(torch["result_file"])
    assert torch["parity"].startswith("not checked")  # the only float32 row that ran
    assert summary["cut"] == ["tiny float32 jax"] and "budget of 1 s" in rows["jax"]["reason"]
    assert rows["torch+torch-compile@reduce-overhead"]["reason"].startswith("CUDA graphs need a CUDA device")
    assert rows["jax+flash-attention"]["reason"].startswith("extra 'flash-attention' cannot run here")
    assert summary["config"]["batch_size"] == 16 and summary["env"]["keras"]
    with open(os.path.join(out, "gpu-matrix.json")) as f:
        assert json.load(f)["rows"] == summary["rows"]


def test_cpu_matrix_prints_device_versions_config_and_one_row_each(cpu_matrix):
    stdout, _, _ = cpu_matrix
    assert "device (jax): 1x" in stdout and "device (torch): 1x" in stdout
    assert "versions: python" in stdout and "config shared by every row: " in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| tiny ")]
    assert [row.split(" | ")[2] for row in rows] == RUNS
    assert rows[0].split(" | ")[3].startswith("torch-eager (attention")
    assert "cut: the budget of 1 s was spent" in rows[1]
    assert "skipped: CUDA graphs need a CUDA device" in rows[2]
    assert "cut by the budget (1 s): tiny float32 jax" in stdout
