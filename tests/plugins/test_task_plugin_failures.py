"""A task plugin's mistakes, each named with the task and its plugin, and a run that trained keeps its result: an
evaluator that raises or returns the wrong thing, a validation without the task's validation_metric, a prepare or
batches of the wrong type, a model variable no initialisation rule knows; and a task written to the docs, whose
results `report` reads."""

import json
import textwrap

import pytest

from conftest import assert_refused_in_one_line, env_with, install_plugin_module, run_cli

# A task as docs/plugins.md describes one: a decoder-only model reads 4 digits and writes them sorted. TASK_BAD
# (comma-separated) chooses its mistakes.
SORT_TASK = textwrap.dedent('''
    import os

    import numpy as np

    from mtbench import (Batch, Evaluator, Extra, ModelFamily, ModelShape, SpecialTokens, Task, TaskData, Tokenizer,
                         WrappingStep, hookimpl)

    N = 4
    BAD = os.environ.get("TASK_BAD", "").split(",")


    class Digits(Tokenizer):
        special = SpecialTokens(pad=0, eos=1, start=2)
        vocab_size = 14
        fingerprint = "digits"

        def encode_source(self, sentences):
            return [[4 + int(c) for c in s] for s in sentences]

        encode_target = encode_source

        def decode(self, ids_batch):
            return ["".join(str(i - 4) for i in ids if i >= 4) for ids in ids_batch]

        def save(self, directory):
            pass


    def examples(rng, rows):
        x = rng.integers(0, 10, size=(rows, N))
        seq = np.concatenate([x + 4, np.full((rows, 1), 3), np.sort(x, axis=1) + 4, np.full((rows, 1), 1)], axis=1)
        target_input = np.concatenate([np.full((rows, 1), 2), seq[:, :-1]], axis=1).astype("int32")
        weight = np.zeros(seq.shape, "float32")
        weight[:, N + 1:] = 1.0
        return target_input, seq.astype("int32"), weight


    class SortDigits(Task):
        name = "sort-digits"
        description = "read digits, write them sorted"
        metrics = ("test_loss",)
        quality_figures = ("test_loss",)
        validation_metric = "val_loss"
        higher_is_better = False

        def read(self, config, registry, progress):
            return None

        def prepare(self, config, raw, tokenizer):
            rng = np.random.default_rng(0)
            splits = {split: examples(rng, 64) for split in ("train", "valid", "test")}
            if "prepare_dict" in BAD:
                return {"splits": splits}
            return TaskData(Digits(), splits, "sort-digits", {"examples": 64})  # a record of its own

        def batches(self, data, config, skip=0):
            target_input, target_output, weight = data.splits["train"]
            rows = config.batch_size
            for step in range(skip, 10 ** 9):
                part = slice((step * rows) % 64, (step * rows) % 64 + rows)
                if "batch_tuple" in BAD:
                    yield 0, (target_input[part], target_output[part], weight[part])
                else:
                    yield 0, Batch(None, target_input[part], target_output[part], weight[part],
                                   np.arange(part.start, part.stop))

        def evaluator(self, model, data, config, compile_inference):
            return SortEvaluator(model, data, compile_inference)

        def load_tokenizer(self, directory, description):
            return Digits()


    class SortEvaluator(Evaluator):
        def __init__(self, model, data, compile_inference):
            self.data = data
            self.logits = compile_inference(lambda ids: model((ids,)))

        def loss(self, split):
            target_input, target_output, weight = self.data.splits[split]
            logits = np.asarray(self.logits(target_input), dtype="float64")
            logits -= logits.max(-1, keepdims=True)
            log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            nll = -np.take_along_axis(log_p, target_output[..., None], -1)[..., 0]
            return float((nll * weight).sum() / weight.sum())

        def validate(self):
            if "validate_raise" in BAD:
                raise ValueError("validation broke")
            if "validate_nokey" in BAD:
                return {"val_acc": 1.0}
            return {"val_loss": self.loss("valid")}

        def evaluate(self, phase):
            if "evaluate_raise" in BAD:
                raise ValueError("scoring broke")
            if "evaluate_dict" in BAD:
                return {"test_loss": self.loss("test")}
            if "evaluate_nokey" in BAD:
                return {"test_los": self.loss("test")}, {}
            return {"test_loss": self.loss("test")}, {}


    class SortModel(ModelFamily):
        name = "sort-model"
        description = "a one-layer decoder for sort-digits"
        task = "sort-digits"
        presets = {"tiny": ModelShape(d_model=16, num_heads=2, encoder_layers=0, decoder_layers=1, ff_dim=32,
                                      vocab_size=16, max_len=2 * N + 2),
                   "wee": ModelShape(d_model=16, num_heads=2, encoder_layers=0, decoder_layers=1, ff_dim=32,
                                     vocab_size=12, max_len=2 * N + 2)}
        default_steps = {"tiny": 4}

        def build(self, run, path, tokenizer, max_len):
            import keras
            from keras import layers, ops

            class Model(keras.Model):
                def __init__(self):
                    super().__init__(name="sorter")
                    self.tokens = layers.Embedding(tokenizer.vocab_size, 16, name="tokens")
                    self.head = layers.Dense(tokenizer.vocab_size, dtype="float32", name="head")
                    if "odd_variable" in BAD:
                        self.scale = self.add_weight(shape=(), initializer="ones", name="scale")

                def call(self, inputs, training=False):
                    ids = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
                    return self.head(self.tokens(ids))

            model = Model()
            model(ops.ones((1, 2 * N + 2), dtype="int32"))
            return model, ModelShape(16, 2, 0, 1, 32, tokenizer.vocab_size, 2 * N + 2)

        def training_flops(self, model_shape, rows, source_length, target_length):
            return "lots" if "flops_text" in BAD else None

        def load_saved(self, directory, description):
            return None, Digits()


    class LossOnly(WrappingStep):
        def __init__(self, inner):
            super().__init__(inner)
            self.name = inner.name + "+loss-only"

        def __call__(self, x, y, sample_weight):
            logs = self.inner(x, y, sample_weight)
            return None if "step_none" in BAD else {"loss": logs["loss"]}


    class Careless(Extra):
        name = "careless"
        backends = ("jax", "torch")
        wraps_step = True

        def compile_options(self, run):
            return ["jit_compile"] if "compile_list" in BAD else {}

        def make_train_step(self, run, model, step):
            return LossOnly(step)


    @hookimpl
    def mtbench_register_extras(register):
        register(Careless())


    @hookimpl
    def mtbench_register_tasks(register):
        register(SortDigits())


    @hookimpl
    def mtbench_register_models(register):
        register(SortModel())
''')


@pytest.fixture(scope="module")
def sort_plugin(tmp_path_factory):
    site = tmp_path_factory.mktemp("sort-site")
    install_plugin_module(site, "mtbench_sorttask", "sorttask", SORT_TASK)
    return str(site)


def train(sort_plugin, cache_dir, out, bad, *arguments):
    return run_cli("train", "--model", "sort-model", "--backend", "jax", "--preset", "tiny", "--steps", "4",
                   "--batch-size", "8", "--dtype", "float32", "--cache-dir", cache_dir, "--out", str(out),
                   *arguments, env={**env_with(sort_plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_sorttask",
                                    "TASK_BAD": bad})


def last_line(proc):
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def failed_result(out):
    """The result a run that trained and then failed wrote: status failed, its steps' figures kept."""
    result = json.loads(out.read_text())
    assert result["status"] == "failed"
    assert len(result["history"]) == result["timing"]["steps"] > 0
    return result


# An evaluator that raises: `test_a_failed_evaluation_after_training_keeps_the_trained_state_which_resume_evaluates`,
# whose run is that one.
@pytest.mark.parametrize("bad, said", [
    ("evaluate_dict", "TypeError: Evaluator.evaluate returned a dict of ['test_loss'], not (metrics, sidecar), two "
                      "dicts"),
    ("evaluate_nokey", "ValueError: Evaluator.evaluate's metrics leave out test_loss, a key of the task's metrics"),
])
def test_an_evaluation_that_fails_after_training_names_the_task_and_keeps_the_result(sort_plugin, cache_dir,
                                                                                       tmp_path, bad, said):
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, bad)
    assert_evaluation_failed_naming_the_task(proc, out, said)


def assert_evaluation_failed_naming_the_task(proc, out, said):
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = last_line(proc)
    assert line.startswith("Error: training failed after step 4, in the evaluation: task 'sort-digits' of plugin "
                           "'sorttask' failed: ") and said in line and f"partial result in {out}" in line, line
    result = failed_result(out)
    assert result["metrics"]["test_loss"] is None and said in result["status_reason"]
    return line, result


def test_a_failed_evaluation_after_training_keeps_the_trained_state_which_resume_evaluates(sort_plugin, cache_dir,
                                                                                          tmp_path):
    """No --checkpoint-every: the trained state was held only by the process, and the failed run left nothing for
    `--resume` to continue ("wrote no checkpoint; there is nothing to resume")."""
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, "evaluate_raise")
    line, failed = assert_evaluation_failed_naming_the_task(proc, out, "ValueError: scoring broke")
    run_dir = tmp_path / "r.run"
    kept = failed["metrics"]["unevaluated_checkpoint"]
    assert kept == str(run_dir / "checkpoint-000004")
    assert f"the trained weights are in {kept} (mtbench train --resume {run_dir} evaluates them)" in line
    resumed = run_cli("train", "--resume", str(run_dir),
                      env={**env_with(sort_plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_sorttask"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["metrics"]["test_loss"] > 0
    assert [h["step"] for h in result["history"]] == [1, 2, 3, 4]  # evaluated, not trained again


def test_a_failed_validation_still_writes_the_checkpoint_due_at_its_step(sort_plugin, cache_dir, tmp_path):
    """--checkpoint-every 2 with --eval-every 2: the validation at step 2 ran before the checkpoint, and its failure
    ended the run without it."""
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, "validate_raise", "--eval-every", "2", "--checkpoint-every", "2")
    assert_validation_failed_naming_the_task(proc, out, "ValueError: validation broke")
    assert failed_result(out)["timing"]["steps"] == 2
    assert sorted(path.name for path in (tmp_path / "r.run").glob("checkpoint-*")) == ["checkpoint-000002"]


def test_a_family_presets_vocabulary_under_16_is_refused_naming_the_preset(sort_plugin, tmp_path):
    """It was refused as "--vocab-size must be at least 16, got 12", an option the user did not give."""
    out = tmp_path / "r.json"
    proc = run_cli("train", "--model", "sort-model", "--backend", "jax", "--preset", "wee", "--out", str(out),
                   env={**env_with(sort_plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_sorttask"})
    assert_refused_in_one_line(proc, "preset 'wee' of model family 'sort-model' (plugin 'sorttask') has a vocabulary "
                                     "of 12; the vocabulary must be at least 16 (--vocab-size sets another)")
    assert not out.exists()
    given = run_cli("train", "--model", "sort-model", "--backend", "jax", "--preset", "wee", "--vocab-size", "8",
                    "--out", str(out), env={**env_with(sort_plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_sorttask"})
    assert_refused_in_one_line(given, "--vocab-size must be at least 16, got 8")


# A validation that raises: `test_a_failed_validation_still_writes_the_checkpoint_due_at_its_step`, whose run is that
# one with a checkpoint due at the step.
@pytest.mark.parametrize("bad, said", [
    ("validate_nokey", "Evaluator.validate returned a dict of ['val_acc'], not a dict holding the task's "
                       "validation_metric 'val_loss'"),
])
def test_a_validation_that_fails_names_the_task_and_keeps_the_partial_result(sort_plugin, cache_dir, tmp_path,
                                                                             bad, said):
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, bad, "--eval-every", "2")
    assert_validation_failed_naming_the_task(proc, out, said)


def assert_validation_failed_naming_the_task(proc, out, said):
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = last_line(proc)
    assert line.startswith("Error: training failed after step 2, task 'sort-digits' of plugin 'sorttask' failed: ")
    assert said in line and f"partial result in {out}" in line, line
    assert failed_result(out)["target"]["evaluations"] == []


@pytest.mark.parametrize("bad, extra, said", [
    ("prepare_dict", (), "task 'sort-digits' of plugin 'sorttask' failed: TypeError: Task.prepare returned a dict, not "
                         "a mtbench.TaskData"),
    ("batch_tuple", (), "task 'sort-digits' of plugin 'sorttask' failed: TypeError: Task.batches yielded a tuple of "
                        "(int, tuple), not (epoch, mtbench.Batch)"),
    ("odd_variable", (), "model 'sort-model' of plugin 'sorttask' failed: ValueError: it built a model whose "
                         "weights mtbench cannot draw: no initialisation rule for variable sorter/scale"),
    ("compile_list", ("--extra", "careless"), "extra 'careless' of plugin 'sorttask' failed: TypeError: "
                                              "compile_options returned a list, not a dict of model.compile's options"),
])
def test_a_plugins_mistake_before_training_names_the_plugin_and_writes_no_result(sort_plugin, cache_dir, tmp_path,
                                                                                 bad, extra, said):
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, bad, *extra)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert last_line(proc).startswith(f"Error: {said}"), proc.stderr[-3000:]
    assert not out.exists()


def test_a_familys_flops_that_are_not_a_number_name_the_family(sort_plugin, cache_dir, tmp_path):
    """Counted as the steps are timed: it read `TypeError: unsupported operand type(s) for +: 'int' and 'str'`."""
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, "flops_text")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "model 'sort-model' of plugin 'sorttask' failed: TypeError: training_flops returned a str, not a number " \
           "or None" in last_line(proc), proc.stderr[-3000:]


@pytest.mark.parametrize("bad, said", [("step_none", "returned NoneType at step 1"),
                                       ("", "returned a dict of ['loss'] at step 1")])
def test_a_wrapped_step_that_returns_no_logs_names_its_extra_and_keeps_the_partial_result(sort_plugin, cache_dir,
                                                                                         tmp_path, bad, said):
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, bad, "--extra", "careless")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = last_line(proc)
    assert "of extra 'careless' of plugin 'sorttask' " + said + ", not its logs {'loss': ..., 'accuracy': ...}" \
        in line and f"partial result in {out}" in line, line
    assert json.loads(out.read_text())["status"] == "failed"


def test_a_task_written_to_the_docs_gives_results_that_report_reads(sort_plugin, cache_dir, tmp_path):
    """Its result lacked data.origin, data.tokenizer, metrics.train_loss and metrics.val_loss, which the built-in
    tasks write and the docs never asked of a task: `report` refused it as not an mtbench result."""
    out = tmp_path / "r.json"
    proc = train(sort_plugin, cache_dir, out, "")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["data"] == {"examples": 64}
    report = run_cli("report", str(out), env={**env_with(sort_plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_sorttask"})
    assert report.returncode == 0, report.stderr[-3000:]
    assert "not an mtbench result" not in report.stderr
