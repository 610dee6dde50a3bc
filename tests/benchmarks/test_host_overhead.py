"""benchmarks/host_overhead.py: a --quick run end to end (two worker processes taking turns, six contestants) whose
output has the structure scripts read, the last line a JSON object with the three ratios; what the summary makes
of the timed steps; and bad settings refused in one line. No timing is asserted.

The quick run times the language model (`--model gpt`, one block): most of the run is inductor compiling the two
compiled contestants, a g++ call per kernel, and one decoder block makes fewer kernels than the translation model's
encoder and decoder (about 50 for its two contestants in a full run on 2 cores). The script does the same for
either family but for the model it builds; the translation model's four torch contestants compile end to end in
test_torch_compile_benchmark.py, their graph breaks counted, and a translation worker starts and fails below."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from benchmarks.host_overhead import RATIOS, quiet_burst, report, summary_json
from conftest import REPOSITORY, device_kind, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "host_overhead.py")
CONTESTANTS = ["mtbench eager", "mtbench compiled", "native eager", "native compiled", "mtbench jax", "native flax"]


@pytest.mark.slow
def test_quick_run_times_every_contestant_and_ends_with_the_three_ratios(cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(MTBENCH_LOAD_PLUGINS="")
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--model", "gpt", "--cache-dir", cache_dir],
                          capture_output=True, text=True, env=env, timeout=600)
    summary = json_answer(proc)
    assert summary["settings"]["model_family"] == "gpt" and summary["settings"]["model"]["decoder_layers"] == 1
    for key in ("torch_eager_ratio", "torch_compiled_ratio", "jax_ratio"):
        assert isinstance(summary[key], float) and summary[key] > 0
        assert isinstance(summary["goals"][key]["met"], bool)
    assert sorted(summary["contestants"]) == sorted(CONTESTANTS)
    assert all(c["steps"] == 2 * 2 for c in summary["contestants"].values())  # --quick: 2 rounds x 2 steps
    assert all(ms > 0 for ms in summary["step_ms"].values())
    assert summary["train_steps"]["mtbench eager"] == "torch-eager"
    assert summary["train_steps"]["mtbench compiled"] == "torch-compiled"
    assert summary["settings"]["model"]["d_model"] == 16 and summary["settings"]["batch_shape"] == [2, 8]
    assert summary["settings"]["versions"]["torch"] and summary["settings"]["hardware"]["cpu_model"]
    assert {name: device["kind"] for name, device in summary["devices"].items()} == {
        name: device_kind(name) for name in summary["devices"]}
    assert "mtbench eager / native eager" in proc.stdout
    assert summary["bursts"]["kept"] == 2 * 2  # 2 rounds x 2 workers, each burst kept once, busy or not


def test_ratios_divide_medians_and_say_whether_each_goal_is_met():
    seconds = {"mtbench eager": [0.003, 0.005, 0.004], "native eager": [0.002], "mtbench compiled": [0.0011],
               "native compiled": [0.001], "mtbench jax": [0.0013], "native flax": [0.001]}
    ready = {framework: {"train_steps": {}, "warmup_s": 1.0, "device": {"kind": "cpu", "name": f"{framework}'s CPU"},
                         "torch_threads": 2, "matmul_precision": {f"{framework} float32 matmuls": "highest"}}
             for framework in ("torch", "jax")}
    settings = {"model": {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "num_heads": 2, "ff_dim": 32,
                          "vocab_size": 1000}, "batch_shape": [2, 8], "rounds": 1, "steps_per_round": 3,
                "warmup": 1, "versions": {"torch": "x"}, "hardware": {"cpu_model": "c", "cpus_usable": 2},
                "cpus": None, "max_other_percent": 10.0, "retries": 5}
    bursts = {"kept": 2, "discarded": 3, "kept_busy": 1, "other_percent": [50.0, 40.0, 30.0, 20.0, 0.0, None]}
    summary = summary_json(ready, seconds, bursts, settings)
    assert summary["torch_eager_ratio"] == pytest.approx(2.0)
    assert summary["torch_compiled_ratio"] == pytest.approx(1.1)
    assert summary["jax_ratio"] == pytest.approx(1.3)
    assert {key: goal["met"] for key, goal in summary["goals"].items()} == {
        "torch_eager_ratio": False, "torch_compiled_ratio": True, "jax_ratio": False}
    # numpy's linear percentiles of 3, 4 and 5 ms: the 10th at 0.2 of the way from 3 to 4, the 90th at 0.8 from 4 to 5.
    assert summary["contestants"]["mtbench eager"] == pytest.approx({"median_s": 0.004, "p10_s": 0.0032,
                                                                      "p90_s": 0.0048, "steps": 3})
    assert summary["step_ms"]["mtbench eager"] == pytest.approx(4.0)
    assert summary["bursts"] == {"kept": 2, "run_again": 3, "kept_busy": 1,
                                 "other_processes_percent_median": 30.0}
    # each worker's device and float32 matmuls, beside the figures
    assert summary["matmul_precision"] == {framework: {f"{framework} float32 matmuls": "highest"}
                                           for framework in ("torch", "jax")}
    lines = report(summary)
    assert any(line.endswith("; devices: torch cpu (torch's CPU), jax cpu (jax's CPU)") for line in lines), lines
    assert any(line.startswith("mtbench eager / native eager") and line.endswith("NO") for line in lines)
    assert len([line for line in lines if line.endswith(("yes", "NO"))]) == len(RATIOS)
    assert any(line.startswith("WARNING: 1 kept bursts ran on a busy machine") for line in lines)


class Busy:
    """A worker whose bursts find other processes taking these shares of the CPUs, one per burst."""

    def __init__(self, *others):
        self.others = list(others)

    def burst(self):
        return {"seconds": {"a": [len(self.others)]}, "other_percent": self.others.pop(0)}


def test_a_burst_on_a_busy_machine_is_run_again_and_the_last_try_kept():
    args = SimpleNamespace(retries=2, max_other=10.0)
    bursts = {"kept": 0, "discarded": 0, "kept_busy": 0, "other_percent": []}
    assert quiet_burst(Busy(60.0, 5.0, 99.0), args, bursts) == {"a": [2]}  # the second try was quiet
    assert quiet_burst(Busy(60.0, 70.0, 80.0), args, bursts) == {"a": [1]}  # never quiet: the third try kept
    assert quiet_burst(Busy(None), args, bursts) == {"a": [1]}  # no /proc/stat: nothing to judge by
    assert bursts == {"kept": 3, "discarded": 3, "kept_busy": 1, "other_percent": [60.0, 5.0, 60.0, 70.0, 80.0, None]}


def test_bad_settings_are_refused_with_one_line():
    for argv, message in ((["--rounds", "0"], "--rounds must be at least 1, not 0"),
                          (["--d-model", "15"], "--d-model 15 is not divisible by --heads 2"),
                          (["--length", "20"], "--length must be at most 16 (one length bucket), not 20")):
        proc = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_worker_that_cannot_start_ends_the_run_with_its_reason_in_one_line(cache_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(MTBENCH_LOAD_PLUGINS="", TMPDIR=str(tmp_path))  # the failed worker's log is kept there
    proc = subprocess.run([sys.executable, SCRIPT, "--batch-size", "100000", "--cache-dir", cache_dir],
                          capture_output=True, text=True, env=env, timeout=600)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("host_overhead: the torch worker ended early: ValueError: no length bucket holds a full "
                           "batch (100000 rows;") and f"(log: {tmp_path}" in last
