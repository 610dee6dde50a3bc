"""Analytic FLOPs against a hand count, MFU's peak, and how often a backend compiles."""

import json
import re

import numpy as np
import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, cpu_machine_only, env_with, run_cli, traced_matmul_flops

from mtbench.figures import run_warnings, set_aside
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.flops import forward_flops, training_flops
from mtbench.runner.measurement.peaks import datasheet_peak


def test_flops_of_the_tiny_preset_match_a_hand_count():
    # tiny: d_model 64, ff 128, vocab 1000, 1 encoder and 1 decoder layer; batch 2, source and target 16 tokens.
    tokens, d, f = 2 * 16, 64, 128
    projections = 4 * 2 * tokens * d * d            # Q, K, V and output projections of one attention
    scores_and_mix = 2 * (2 * 2 * 16 * 16 * d)      # QK^T and (scores)V over all heads
    attention = projections + scores_and_mix
    feed_forward = 2 * 2 * tokens * d * f
    encoder = attention + feed_forward
    decoder = 2 * attention + feed_forward          # self- and cross-attention (equal lengths here)
    output_layer = 2 * tokens * d * 1000
    assert forward_flops(PRESETS["tiny"], 2, 16, 16) == encoder + decoder + output_layer == 9_732_096
    assert training_flops(PRESETS["tiny"], 2, 16, 16) == 3 * 9_732_096


def test_flops_of_unequal_lengths_count_each_side_at_its_own():
    # tiny again, batch 1: source 24 tokens, target 8. The encoder works on 24 tokens, the decoder on 8; the cross
    # attention projects 8 queries and 24 keys and values, and scores 8 x 24.
    d, f, s, t = 64, 128, 24, 8
    encoder = (4 * 2 * s * d * d + 2 * 2 * s * s * d) + 2 * 2 * s * d * f
    decoder_self = 4 * 2 * t * d * d + 2 * 2 * t * t * d
    cross = 2 * 2 * t * d * d + 2 * 2 * s * d * d + 2 * 2 * t * s * d  # Q and output on 8; K and V on 24
    decoder = decoder_self + cross + 2 * 2 * t * d * f
    output_layer = 2 * t * d * 1000
    assert forward_flops(PRESETS["tiny"], 1, s, t) == encoder + decoder + output_layer
    assert forward_flops(PRESETS["tiny"], 1, t, s) != forward_flops(PRESETS["tiny"], 1, s, t)


@pytest.mark.parametrize("batch, source_length, target_length", [(2, 16, 16), (1, 24, 8)])
def test_the_flops_are_those_of_the_matmuls_the_built_model_runs(batch, source_length, target_length):
    """The hand counts above check the formula against itself; this counts the matmuls of the traced forward pass
    of the model `mtbench train` builds (a gated feed-forward, an untied output layer, keys and values at another
    width would change them and not the formula)."""
    from mtbench.keras_models.transformer import build_transformer
    tokens = (np.ones((batch, source_length), np.int32), np.ones((batch, target_length), np.int32))
    ran = traced_matmul_flops(build_transformer(PRESETS["tiny"]), tokens)
    assert forward_flops(PRESETS["tiny"], batch, source_length, target_length) == ran


def test_flops_grow_quadratically_only_in_attention():
    model = PRESETS["small"]
    short, long = forward_flops(model, 8, 16, 16), forward_flops(model, 8, 32, 32)
    assert 2 * short < long < 2.2 * short


def test_datasheet_peaks_name_their_source():
    peak, source = datasheet_peak("NVIDIA H100 80GB HBM3", "mixed_bfloat16")
    assert peak == pytest.approx(989.4e12) and "H100" in source
    assert datasheet_peak("Some Unknown Accelerator", "float32") == (None, None)


def window_starts(history):
    """The entries of a run's `history` that begin a timing window: the loop reads the compile count once a
    window and writes it at the window's first step (the others hold 0 whatever ran)."""
    starts, i = [], 0
    while i < len(history):
        starts.append(history[i])
        i += history[i]["window_steps"]
    return starts


def test_jax_compiles_once_per_bucket_and_never_in_steady_steps(tiny_runs):
    result = tiny_runs["jax"]["result"]
    history = result["history"]
    starts = window_starts(history)
    assert sum(entry["window_steps"] for entry in starts) == len(history) and len(starts) < len(history)
    seen = set()
    for entry in starts:
        shape = tuple(entry["shape"])
        if entry["first_of_shape"]:  # timed alone
            assert entry["window_steps"] == 1 and shape not in seen
            assert entry["compilations"] == 1, f"bucket {shape} compiled {entry['compilations']} programs"
        else:
            assert entry["compilations"] == 0, f"the window from step {entry['step']} compiled"
        seen.add(shape)
    assert len(seen) >= 2, "the test slice should exercise more than one bucket"
    assert result["timing"]["compilations_by_shape"] == {"x".join(map(str, s)): 1 for s in seen}


def test_a_program_compiled_inside_a_steady_window_is_counted_at_its_start_and_flagged(plugin_path, cache_dir,
                                                                                     tmp_path):
    """The positive control of the test above: a third party's step that compiles a program of its own at its
    sixth call, in the middle of a four-step window."""
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "12", "--timing-window", "4",
                   "--extra", "compile-late", "--cache-dir", cache_dir, "--out", str(out),
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["train_step"].startswith("compiling ")
    starts = window_starts(result["history"])
    window = next(entry for entry in starts if entry["step"] <= 6 < entry["step"] + entry["window_steps"])
    assert window["step"] < 6 and window["window_steps"] == 4
    late = {entry["step"]: entry["compilations"] for entry in starts
            if entry["compilations"] and not entry["first_of_shape"]}
    assert late == {window["step"]: 1}
    # One shape: its figure holds what compiled during its steps, the warm-up step's program and the late one.
    assert result["timing"]["compilations_by_shape"] == {"x".join(map(str, result["history"][0]["shape"])): 2}
    assert (f"1 program compiled after the warm-up steps (in the timing window from step {window['step']}): the "
            f"compile time leaves it out, and the steps timed with it are slower") in run_warnings(result)


@cpu_machine_only  # a GPU's peak is its datasheet's
def test_mfu_of_both_backends_is_against_the_same_named_cpu_peak(tiny_runs):
    """The CPU's peak is the fastest matmul any installed framework measured on it, not each framework's own."""
    peaks = set()
    for backend in ("jax", "torch"):
        utilization = tiny_runs[backend]["result"]["utilization"]
        assert re.match(r"measured: (\d+)x\1 float32 matmul on ", utilization["peak_source"])
        assert utilization["peak_source"].endswith("(the fastest of jax, torch on this CPU)")
        assert 0 < utilization["mfu"] < 1
        assert utilization["mfu"] == pytest.approx(utilization["model_flops_per_s"] / utilization["peak_flops_per_s"])
        peaks.add((utilization["peak_flops_per_s"], utilization["peak_source"]))
    assert len(peaks) == 1


def test_mfus_numerator_is_the_training_flops_of_the_steady_steps_over_their_time(tiny_runs):
    """The MFU's numerator, from the steps the result lists: 3x the forward FLOPs of each steady step's padded
    batch (warm-up steps and steps timed apart left out), over those steps' seconds."""
    import dataclasses

    from mtbench.keras_models.presets import ModelPreset
    for backend in ("jax", "torch"):
        result = tiny_runs[backend]["result"]
        shape = ModelPreset(**{field.name: result["model"][field.name] for field in dataclasses.fields(ModelPreset)})
        steady = [h for h in result["history"] if not h["first_of_shape"] and not set_aside(h)]
        assert len(steady) > 30 and len({tuple(h["shape"]) for h in steady}) >= 2
        flops = sum(training_flops(shape, rows, length, length) for rows, length in (h["shape"] for h in steady))
        assert result["utilization"]["model_flops_per_s"] == \
            pytest.approx(flops / sum(h["seconds"] for h in steady), rel=1e-9)


def test_torch_eager_compiles_no_program(tiny_runs):
    shapes = {"x".join(map(str, h["shape"])) for h in tiny_runs["torch"]["result"]["history"]}
    assert tiny_runs["torch"]["result"]["timing"]["compilations_by_shape"] == dict.fromkeys(shapes, 0)
    history, timing = tiny_runs["torch"]["result"]["history"], tiny_runs["torch"]["result"]["timing"]
    # each step's wait for its batch was measured (a clock never read would give 0), and the figures are theirs
    inputs = [h["input_seconds"] for h in history]
    steady = [h for h in history if not h["first_of_shape"] and not set_aside(h)]
    assert min(inputs) > 0 and timing["input_s_median"] == pytest.approx(
        float(np.median([h["input_seconds"] for h in steady])))
    assert timing["input_fraction"] == pytest.approx(
        timing["input_s_median"] / float(np.median([h["seconds"] for h in steady])))


@pytest.mark.slow
@cpu_machine_only
def test_env_calibrate_measures_and_caches_each_backends_peak(tmp_path):
    import json
    import os
    import re

    from conftest import run_cli
    proc = run_cli("env", "--calibrate", "--json", "--cache-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    backends = json.loads(proc.stdout)["backends"]
    for backend in ("jax", "torch"):
        for dtype in ("float32", "bfloat16"):
            peak = backends[backend]["peaks"][dtype]
            assert peak["flops_per_s"] > 1e8  # bfloat16 emulated on a CPU without it: about 1 GFLOP/s on 2 EPYC cores
            # 2048 where one matmul is quick; smaller where it is not (bfloat16 emulated by a CPU without it)
            assert re.fullmatch(rf"measured: (\d+)x\1 {dtype} matmul on {backend}, median of repeats", peak["source"])
    assert len(os.listdir(tmp_path / "calibration")) == 4
