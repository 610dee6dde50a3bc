"""The figures and their formatting live in `mtbench.figures`; their old names in the plugin API still work, with a
DeprecationWarning that says where they went (plugin API 1.4)."""

import warnings

import pytest

import mtbench
import mtbench.plugins.api
from mtbench import figures


def test_the_old_names_still_work_and_say_where_they_went():
    with pytest.warns(DeprecationWarning, match=r"mtbench\.FIGURES moved to mtbench\.figures\.FIGURES"):
        from mtbench import FIGURES
    assert FIGURES is figures.FIGURES
    with pytest.warns(DeprecationWarning, match=r"mtbench\.figures\.figure_text; .* deprecated since plugin API 1\.4"):
        figure_text = mtbench.plugins.api.figure_text
    assert figure_text is figures.figure_text
    with pytest.raises(AttributeError, match="'mtbench' has no attribute 'not_a_figure'"):
        _ = mtbench.not_a_figure


def test_the_new_module_is_imported_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from mtbench.figures import FIGURES, run_label
        assert FIGURES and run_label({"backend": "jax", "extras": [], "config": {}}) == "jax"


def test_the_api_lists_only_what_plugins_implement_or_call():
    public_figures = {name for name in vars(figures) if not name.startswith("_")}
    assert {"FIGURES", "figure_text", "run_label", "SIZE_KEYS", "STEAL_BOUND"} <= public_figures
    assert set(mtbench.plugins.api.__all__) & public_figures == set()
    assert set(mtbench.__all__) & public_figures == set()
    assert {"Reporter", "hookimpl", "PLUGIN_API_VERSION"} <= set(mtbench.__all__)


def test_the_old_module_still_serves_the_figures_and_warns():
    import importlib
    import sys

    import mtbench.figures
    sys.modules.pop("mtbench.plugins.api.figures", None)
    with pytest.warns(DeprecationWarning, match="mtbench.figures"):
        old = importlib.import_module("mtbench.plugins.api.figures")
    assert old.FIGURES is mtbench.figures.FIGURES and old.figure_text is mtbench.figures.figure_text


def test_the_attention_row_says_when_the_query_key_and_value_were_three_products_and_what_dropout_dropped():
    def result(**arithmetic):
        return {"model": {"attention": {"causal": "xla (unfused)", "arithmetic": arithmetic or None}}}
    bfloat16 = {"matmul_inputs": "bfloat16", "accumulation": "float32", "scores": "bfloat16", "softmax": "float32"}
    assert figures.attention_text(result(**bfloat16, projections="fused")) == (
        "causal xla (unfused); bfloat16 matmuls summing in float32, bfloat16 scores, float32 softmax")
    assert figures.attention_text(result(**bfloat16, projections="separate")).endswith(
        "float32 softmax; query, key and value in three products")
    # A result from before the projections were recorded ran three.
    assert figures.attention_text(result(**bfloat16)).endswith("; query, key and value in three products")
    float32 = dict.fromkeys(bfloat16, "float32")
    assert figures.attention_text(result(**float32, projections="fused")) == "causal xla (unfused)"
    assert figures.attention_text(result(**float32, projections="separate")) == (
        "causal xla (unfused); query, key and value in three products")
    assert figures.attention_text(result()) == "causal xla (unfused)"  # nothing recorded: nothing said
    assert figures.attention_text(result(**float32, projections="fused", probability_dropout=0.2)) == (
        "causal xla (unfused); 0.2 of its probabilities dropped while training")
    assert figures.attention_text(result(**bfloat16, projections="fused", probability_dropout=0.0)) == (
        "causal xla (unfused); bfloat16 matmuls summing in float32, bfloat16 scores, float32 softmax")


def test_a_runs_batch_reads_as_its_configuration_sizes_it():
    """Rows, or tokens where --max-tokens sizes the batch (its rows then vary with the length), times the
    micro-batches of --grad-accum: the summary, the table and compare's configuration line all say it this way."""
    assert figures.batch_text({"batch_size": 64, "max_tokens": None, "grad_accum": 1}) == "64"
    assert figures.batch_text({"batch_size": 64, "max_tokens": 4096}) == "4,096 tokens"
    assert figures.batch_text({"batch_size": 8, "grad_accum": 2}) == "8 x 2 micro-batches"
    assert figures.batch_text({}) == "per run"


def test_a_tables_figures_are_those_of_the_tasks_its_runs_trained():
    """A language model's table has no BLEU and no test translation time; a translation's no perplexity."""
    language_model = {"config": {"task": "language-modelling"}, "metrics": {"val_perplexity": 3.0}}
    translation = {"config": {}, "metrics": {"bleu": 20.0}}  # a result from before tasks: translation's
    assert {"val_perplexity"} <= shown_keys([language_model])
    assert not {"bleu", "translate_s"} & shown_keys([language_model])
    assert {"bleu", "translate_s"} <= shown_keys([translation]) and "val_perplexity" not in shown_keys([translation])
    assert {"bleu", "translate_s", "val_perplexity"} <= shown_keys([language_model, translation])


def shown_keys(results):
    return {figure.key for figure in figures.shown_figures(results)}


def test_loss_scaling_says_what_the_scale_did():
    scaling = {"initial_scale": 32768.0, "growth_steps": 2000, "final_scale": 8192.0, "steps_skipped": 2}
    assert figures.loss_scaling_text({"loss_scaling": scaling}) == (
        "loss scaled from 2^15, 2 steps skipped (gradients not finite), now 2^13")
    assert figures.loss_scaling_text({"loss_scaling": {**scaling, "final_scale": 65536.0, "steps_skipped": 1}}) == (
        "loss scaled from 2^15, 1 step skipped (gradients not finite), now 2^16")
    assert figures.loss_scaling_text({"loss_scaling": None}) == figures.loss_scaling_text({}) == ""


def test_the_memory_rows_read_the_largest_device_and_the_timing_rows_their_own_fields():
    """Each row's value from a result written by hand: a row that read another field, or summed the devices where
    it names the largest, shows here (a CPU run reports no per-device memory, so no run in the suite does)."""
    mib = 1 << 20
    result = {
        "timing": {"step_s_median": 0.0125, "step_s_p90": 0.02, "tokens_per_s": 5000.0, "compile_s": 3.5},
        "memory": {"peak_host_bytes": 900 * mib, "peak_device_bytes": 1000 * mib,
                   "training": {"per_device": [{"device": "gpu", "index": 0, "peak_bytes": 300 * mib},
                                               {"device": "gpu", "index": 1, "peak_bytes": 800 * mib}]}},
        "extras_record": {"ddp": {"state_bytes": 40 * mib}, "fsdp": {"state_bytes": 10 * mib}, "remat": "on"},
    }
    rows = {figure.key: figure.text(figure.value(result)) for figure in figures.FIGURES
            if figure.section in ("memory", "timing") and figure.key not in ("translate_s", "mfu", "mfu_real_tokens",
                                                                              "train_s", "total_s")}
    assert rows == {"compile_s": "3.50", "step_s_median": "12.5", "step_s_p90": "20.0", "tokens_per_s": "5,000",
                    "peak_host_bytes": "900", "peak_training_device_bytes": "800", "state_bytes_per_device": "40.0",
                    "peak_device_bytes": "1,000"}
    from mtbench.plugins.reporters.table_reporter import _host_and_device_peaks
    assert _host_and_device_peaks(result) == "900 MiB / 1,000 MiB"
    result["memory"].update(host_child_processes=2, host_bytes_children=412 * mib)
    assert _host_and_device_peaks(result) == ("900 MiB / 1,000 MiB (host: 412 MiB of it in 2 child processes such as "
                                              "torch.compile's compile workers)")


def test_under_the_command_line_a_plugins_old_name_is_warned_about_on_stderr(tmp_path):
    """Python shows a DeprecationWarning only where `__main__` triggers it, and a plugin's module never is: the
    command line shows mtbench's own, once a line of the plugin, for its author to see."""
    import subprocess
    import sys

    (tmp_path / "old_plugin.py").write_text("from mtbench import FIGURES\nfrom mtbench import FIGURES as AGAIN\n")
    program = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import mtbench.cli; import old_plugin; print('ok')"
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "DeprecationWarning: mtbench.FIGURES moved" in line]
    assert len(warned) == 2
    assert all("old_plugin.py" in line for line in warned)


def test_the_framework_environment_row_names_the_variables_set():
    """A variable set for one run (XLA's flags for JAX's) shows beside the figures; unset ones do not."""
    from mtbench.figures import RUN_CHOICES, framework_env_text
    assert ("framework_env", "framework environment", framework_env_text) in RUN_CHOICES
    recorded = {"XLA_FLAGS": "--xla_gpu_autotune_level=0", "NVIDIA_TF32_OVERRIDE": None,
                "JAX_PLATFORMS": "cuda", "CUDA_VISIBLE_DEVICES": None}
    assert framework_env_text({"env": {"framework_env": recorded}}) == \
        "JAX_PLATFORMS=cuda, XLA_FLAGS=--xla_gpu_autotune_level=0"
    assert framework_env_text({"env": {"framework_env": {"XLA_FLAGS": None}}}) == "none set"
    assert framework_env_text({"env": {}}) == "not recorded"


def test_the_versions_name_the_accelerator_software_where_the_run_computed_on_it_and_mtbenchs_commit():
    env = {"backend_versions": {"torch": "2.13.0"}, "keras": "3.15.1", "python": "3.11.7", "cuda_version": "12.8",
           "cudnn_version": "9.8.0", "rocm_version": None, "nvidia_driver_version": "570.86.15", "mtbench": "0.1.0",
           "mtbench_git_commit": "0123456789abcdef0123456789abcdef01234567-dirty", "device": {"kind": "gpu"}}
    assert figures.versions_text({"env": env}) == (
        "torch 2.13.0, keras 3.15.1, python 3.11.7, CUDA 12.8, cuDNN 9.8.0, NVIDIA driver 570.86.15, mtbench 0.1.0 "
        "(git 0123456789ab-dirty)")
    # A CUDA build timing the CPU runs no CUDA kernel; a table with a commit column leaves mtbench out.
    on_cpu = {**env, "device": {"kind": "cpu"}, "mtbench_git_commit": None}
    assert figures.versions_text({"env": on_cpu}) == "torch 2.13.0, keras 3.15.1, python 3.11.7, mtbench 0.1.0"
    assert figures.versions_text({"env": env}, with_mtbench=False).endswith("NVIDIA driver 570.86.15")
    on_rocm = {**env, "cuda_version": None, "cudnn_version": None, "rocm_version": "6.4.43482"}
    assert "ROCm 6.4.43482, mtbench" in figures.versions_text({"env": on_rocm})
    assert "driver" not in figures.versions_text({"env": on_rocm})


def test_the_compile_cache_counts_read_as_one_or_many():
    """'warm (13 hits, 1 misses)'."""
    def text(**cache):
        return figures.compile_cache_text({"timing": {"compile_cache": {"state": "warm", **cache}}})
    assert text(programs="partly warm", hits=13, misses=1) == "partly warm (13 hits, 1 miss)"
    assert text(programs="cold", hits=1, misses=0) == "cold (1 hit, 0 misses)"
    assert text(programs="partly warm", hits=13, misses=2, every_process={"processes": 2, "hits": 26, "misses": 1}) \
        == "partly warm (26 hits, 1 miss over 2 processes)"
    assert text(programs=None, entries_before=1) == "warm (held 1 program as the run started)"


def test_a_huge_figure_reads_compactly_in_tables_and_the_train_summary():
    """A diverged language model's perplexity read `1,684,989,000,681,430.75 / 5,457,604,968,575,933.00` in
    `train`'s summary, and `1.685e+15` where its starting point was said; every table now reads the latter."""
    from mtbench.plugins.reporters.table_reporter import _joined
    result = {"metrics": {"val_perplexity": 1_684_989_000_681_430.75, "test_perplexity": 5_457_604_968_575_933.0}}
    assert figures.figure_text(result, "val_perplexity") == "1.685e+15"
    assert _joined(result, "val_perplexity", "test_perplexity") == "1.685e+15 / 5.458e+15"
    assert figures.figure_text({"metrics": {"val_perplexity": 28.614}}, "val_perplexity") == "28.61"
    assert figures.figure_text({"timing": {"tokens_per_s": 45_461.4}}, "tokens_per_s") == "45,461"
