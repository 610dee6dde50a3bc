"""`mtbench train --model gpt` and `mtbench generate` as users run them: real text (the built-in corpus's English
Bible, as files), both backends, the task's figures in the result and none of translation's."""

import json
import math
import os

import numpy as np
import pytest

from conftest import CPU_ONLY, assert_refused_in_one_line, cache_of_its_own, env_with, run_cli
from result_keys import undocumented_keys
from mtbench.runner.results.schema import schema_errors

TINY_GPT = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8", "--valid-size", "10",
            "--test-size", "10", "--dtype", "float32"]  # float32 on a GPU too, whose `--dtype auto` is 16-bit


def bible_verses(count, skip=0):
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    pairs = BibleDataset("en", "fr").read_pairs(lambda *_: None)
    return [source for _, (source, _) in zip(range(skip + count), pairs)][skip:]


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    """Two .txt files of real text (and a file that is not .txt, left out)."""
    folder = tmp_path_factory.mktemp("text")
    verses = bible_verses(4000)
    (folder / "a-genesis.txt").write_text("\n".join(verses[:2000]) + "\n", encoding="utf-8")
    (folder / "b-exodus.txt").write_text("\n".join(verses[2000:]) + "\n", encoding="utf-8")
    (folder / "notes.md").write_text("not part of the text\n", encoding="utf-8")
    return str(folder)


def train(backend, out, *arguments, cache_dir):
    proc = run_cli("train", "--backend", backend, *TINY_GPT, *arguments, "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.mark.slow  # 15-35 s: one training process
def test_a_byte_level_model_reports_perplexity_and_bits_per_byte_and_no_bleu(text_folder, cache_dir, tmp_path):
    result = train("jax", tmp_path / "bytes.json", "--data", text_folder, "--steps", "20", "--eval-every", "10",
                   "--target-loss", "10", cache_dir=cache_dir)
    assert schema_errors(result) == [] and undocumented_keys(result) == []
    assert result["config"]["task"] == "language-modelling" and result["data"]["tokenizer"]["type"] == "byte"
    metrics = result["metrics"]
    assert not any(key.startswith(("bleu", "chrf")) for key in metrics) and "hypotheses_file" not in result
    for split in ("val", "test"):
        # One token is one byte: bits per byte is the loss in bits, and perplexity its exponential.
        assert metrics[f"{split}_bits_per_byte"] == pytest.approx(metrics[f"{split}_loss"] / math.log(2), rel=1e-6)
        assert metrics[f"{split}_perplexity"] == pytest.approx(math.exp(metrics[f"{split}_loss"]), rel=1e-6)
        assert metrics[f"{split}_tokens_evaluated"] == metrics[f"{split}_bytes_evaluated"] == 10 * 32
    assert metrics["val_loss"] < math.log(256)  # it learned something beyond a uniform guess over bytes
    blown_up = json.loads(json.dumps(result))  # a finite loss past 709 nats has no perplexity, and is readable
    blown_up["metrics"].update(val_loss=720.0, val_perplexity=None)
    assert schema_errors(blown_up) == []
    blown_up["metrics"].update(val_loss=7.0)
    assert schema_errors(blown_up) == ["metrics.val_perplexity: null in a completed result"]
    # GPT-2's draw by default: logits of normal(0, 0.02) weights are near 0, the first loss a uniform guess's.
    assert result["model"]["init"] == result["config"]["init"] == "gpt2"
    assert result["history"][0]["loss"] == pytest.approx(math.log(256), abs=0.1)  # glorot: 0.27 above
    ranges = result["data"]["byte_ranges"]
    assert ranges["train"][1] == ranges["valid"][0] and ranges["valid"][1] == ranges["test"][0]
    steady = [h for h in result["history"] if not h["first_of_shape"]]
    assert all(h["tokens"] == 8 * 32 for h in steady)  # tokens/s counts every position the loss counts
    target = result["target"]  # a loss of 10 nats is below a uniform guess's 5.5: reached at the first evaluation
    assert target["metric"] == "loss" and target["outcome"] == "reached" and target["steps_to_target"] == 10
    assert result["status_reason"] == "validation loss " + f"{target['evaluations'][0]['loss']:.4g}" + \
        " reached the target 10.0 at step 10"


@pytest.mark.slow  # two training processes
def test_a_sentencepiece_model_tokenizes_its_text_once_and_later_runs_read_the_tokens(text_folder, tmp_path,
                                                                                       cache_dir):
    # Its own: the first run must find no tokens kept (the CPU's peak and the compiled programs are the session's).
    cache_dir = cache_of_its_own(cache_dir, tmp_path / "cache", ("calibration", "compile"))
    runs, outputs = [], []
    for n in range(2):
        proc = run_cli("train", "--backend", "jax", *TINY_GPT, "--data", text_folder, "--tokenizer", "sentencepiece",
                       "--vocab-size", "300", "--steps", "4", "--cache-dir", cache_dir,
                       "--out", str(tmp_path / f"{n}.json"), env=CPU_ONLY)  # losses equal bit for bit: the CPU's
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads((tmp_path / f"{n}.json").read_text()))
        outputs.append(proc.stdout + proc.stderr)
    kept = os.path.join(cache_dir, "tokens")
    assert f"(read from {kept})" not in outputs[0] and f"(read from {kept})" in outputs[1]
    assert len(os.listdir(kept)) == 3  # train, validation, test
    assert runs[0]["data"] == runs[1]["data"] and runs[0]["data"]["tokenizer"]["type"] == "sentencepiece-unigram"
    assert [h["loss"] for h in runs[0]["history"]] == [h["loss"] for h in runs[1]["history"]]
    assert runs[0]["metrics"]["test_bits_per_byte"] == runs[1]["metrics"]["test_bits_per_byte"]


@pytest.fixture(scope="module")
def char_runs(text_folder, cache_dir, tmp_path_factory):
    """The same character-level model trained on each backend from a folder of .txt files."""
    out = tmp_path_factory.mktemp("char-runs")
    return {backend: train(backend, out / f"{backend}.json", "--data", text_folder, "--tokenizer", "char",
                           "--steps", "50", "--checkpoint-every", "50", cache_dir=cache_dir)
            for backend in ("jax", "torch")}


@pytest.mark.slow
def test_both_backends_follow_one_loss_curve_from_the_same_weights(char_runs):
    jax_losses = [h["loss"] for h in char_runs["jax"]["history"]]
    torch_losses = [h["loss"] for h in char_runs["torch"]["history"]]
    assert len(jax_losses) == len(torch_losses) == 50
    assert max(abs(a - b) / a for a, b in zip(jax_losses, torch_losses)) < 0.01
    assert jax_losses[-1] < jax_losses[0] - 0.5
    data = char_runs["jax"]["data"]
    assert data["tokenizer"]["type"] == "char" and data["origin"].startswith("2 .txt files")
    assert char_runs["jax"]["metrics"]["val_bits_per_byte"] == pytest.approx(
        char_runs["torch"]["metrics"]["val_bits_per_byte"], rel=0.01)


@pytest.mark.slow
def test_the_gpt_recipe_trains_alike_on_both_backends_and_is_recorded(char_runs, logged_run):
    """GPT's recipe (betas 0.9/0.95, decay 0.1 on the matrices alone, clipping by the global norm) is what both
    backends train with, torch's fused AdamW and Keras's on JAX step for step; the user's options win over it."""
    for result in char_runs.values():
        recipe = result["compile_options"]["optimizer_recipe"]
        assert (recipe["beta_2"], recipe["epsilon"], recipe["weight_decay"]) == (0.95, 1e-8, 0.1)
        assert (recipe["decay"], recipe["clip"], recipe["clip_norm"]) == ("matrices", "global", 1.0)
    jax_losses = np.array([h["loss"] for h in char_runs["jax"]["history"]])
    torch_losses = np.array([h["loss"] for h in char_runs["torch"]["history"]])
    np.testing.assert_allclose(torch_losses, jax_losses, rtol=1e-4)
    recipe = logged_run["result"]["compile_options"]["optimizer_recipe"]  # trained with USERS_RECIPE
    assert (recipe["clip"], recipe["decay"], recipe["beta_2"], recipe["weight_decay"]) == (
        "per-variable", "all", 0.99, 0.1)
    assert recipe["alpha"] == pytest.approx(0.1)  # 1e-4 of the 1e-3 peak


@pytest.fixture(scope="module")
def greedy_continuations(char_runs):
    """{backend: what `generate` continues a prompt with, greedily, from the torch run's saved model on it}."""
    texts = {}
    for backend in ("jax", "torch"):
        proc = run_cli("generate", char_runs["torch"]["config"]["out"], "--prompt", "And God said", "--backend",
                       backend, "--max-new-tokens", "24", "--temperature", "0")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("And God said") and "24 tokens" in proc.stderr
        texts[backend] = proc.stdout
    return texts


@pytest.mark.slow
def test_generate_continues_a_prompt_alike_on_the_other_backend(char_runs, greedy_continuations):
    texts = greedy_continuations
    assert texts["jax"] == texts["torch"]  # greedy, from the same weights
    sampled = run_cli("generate", char_runs["jax"]["config"]["out"], "--prompt", "And", "--max-new-tokens", "40",
                      "--top-k", "5", "--seed", "1")
    assert sampled.returncode == 0 and len(sampled.stdout.rstrip("\n")) > len("And")
    assert "Warning" not in texts["jax"] + sampled.stderr
    unread = run_cli("generate", char_runs["jax"]["config"]["out"], "--prompt", "And €€", "--max-new-tokens", "2")
    assert unread.returncode == 0 and ("Warning: 2 of the prompt's 6 tokens are unknown to the model's tokenizer "
                                       "(read as <unk>)") in unread.stderr, unread.stderr


@pytest.mark.slow
def test_a_checkpoint_generates_as_the_saved_model_does(char_runs, greedy_continuations):
    """An interrupted run keeps no saved model, only checkpoints: its character tokenizer, made from its text, is
    kept beside them, and its last checkpoint (here the final step's) generates what the saved model does (on
    torch, the backend that trained it: `greedy_continuations`)."""
    checkpoint = os.path.join(char_runs["torch"]["run_dir"], "checkpoint-000050")
    proc = run_cli("generate", checkpoint, "--prompt", "And God said", "--max-new-tokens", "24", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == greedy_continuations["torch"] and proc.stdout.startswith("And God")


def run_text(text_folder):
    """The bytes a run reads from `text_folder`: its .txt files in name order."""
    names = sorted(name for name in os.listdir(text_folder) if name.endswith(".txt"))
    return b"".join(open(os.path.join(text_folder, name), "rb").read() for name in names)


@pytest.fixture(scope="module")
def scored_test_split(char_runs, text_folder, tmp_path_factory):
    """The bytes the jax run scored its test figures on, in a file of their own ('text'), and what `evaluate` of its
    saved model scores them at on each backend ({'jax': {'scores', 'stdout'}, 'torch': ...})."""
    result = char_runs["jax"]
    start, _ = result["data"]["byte_ranges"]["test"]
    folder = tmp_path_factory.mktemp("test-split")
    text = folder / "test-split.txt"
    text.write_bytes(run_text(text_folder)[start:start + result["metrics"]["test_bytes_evaluated"] + 1])
    evaluated = {"text": text}
    for backend in ("jax", "torch"):
        out = folder / f"{backend}.json"
        proc = run_cli("evaluate", result["config"]["out"], "--test", str(text), "--backend", backend,
                       "--batch-size", str(result["config"]["batch_size"]), "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        evaluated[backend] = {"scores": json.loads(out.read_text()), "stdout": proc.stdout}
    return evaluated


@pytest.mark.slow
def test_evaluate_scores_a_text_as_the_run_scored_its_test_split(char_runs, scored_test_split, tmp_path):
    """The bytes the run scored its test figures on, in a file of their own, get the test loss and bits per byte its
    result records: from its saved model, on the backend that trained it and on the other."""
    result, text = char_runs["jax"], scored_test_split["text"]
    for backend in ("jax", "torch"):
        scores, stdout = scored_test_split[backend]["scores"], scored_test_split[backend]["stdout"]
        assert scores["backend"] == backend and scores["block_size"] == 32 and undocumented_keys(scores) == []
        assert (scores["tokens_evaluated"], scores["bytes_evaluated"]) == (
            result["metrics"]["test_tokens_evaluated"], result["metrics"]["test_bytes_evaluated"])
        assert scores["loss"] == pytest.approx(result["metrics"]["test_loss"], rel=1e-5)
        assert scores["bits_per_byte"] == pytest.approx(result["metrics"]["test_bits_per_byte"], rel=1e-5)
        assert f"{scores['perplexity']:.2f}" in stdout
    strided = run_cli("evaluate", result["config"]["out"], "--test", str(text), "--eval-stride", "8", "--out",
                      str(tmp_path / "strided.json"))
    assert strided.returncode == 0, strided.stderr
    with open(tmp_path / "strided.json") as f:
        scores = json.load(f)
    assert scores["stride"] == 8 and "32 tokens, 8 apart" in strided.stdout
    assert scores["tokens_evaluated"] == result["metrics"]["test_tokens_evaluated"]
    refused = run_cli("evaluate", result["config"]["out"], "--test", str(text), "--beam", "4")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "--beam is an option of translation" in refused.stderr
    # Columns translation's reader would refuse on their own: named as translation's, not as equal columns.
    assert_refused_in_one_line(run_cli("evaluate", result["config"]["out"], "--test", str(text), "--src-col", "2"),
                               "--src-col is an option of translation")
    latin1 = tmp_path / "latin1.txt"  # the model's character tokenizer reads UTF-8 alone; evaluate has no --tokenizer
    latin1.write_bytes("Et Dieu dit : que la lumière soit.\n".encode("latin-1"))
    assert_refused_in_one_line(run_cli("evaluate", result["config"]["out"], "--test", str(latin1)),
                               f"{latin1}: not UTF-8 at byte 25 (invalid continuation byte), which ")
    ids = tmp_path / "ids"
    ids.mkdir()
    np.arange(100, dtype=np.uint16).tofile(ids / "val.bin")
    refused = run_cli("evaluate", result["config"]["out"], "--test", str(ids))
    assert_refused_in_one_line(refused, "trained on text with its char tokenizer; "
                                        f"{ids} holds token files, ids another tokenizer made")


@pytest.mark.slow
def test_evaluate_and_generate_run_the_model_in_the_dtype_asked(char_runs, scored_test_split, tmp_path):
    """--dtype runs a trained model in another policy: mixed bfloat16 scores the run's test bytes near its float32
    figures (bfloat16 matmuls keep 3 significant digits) and says so; a dtype the backend refuses here is refused
    in one line. The jax run's saved model on torch, whose float32 scores are `scored_test_split`'."""
    float32 = scored_test_split["torch"]["scores"]
    out = tmp_path / "mixed_bfloat16.json"
    proc = run_cli("evaluate", char_runs["jax"]["config"]["out"], "--test", str(scored_test_split["text"]),
                   "--backend", "torch", "--batch-size", str(char_runs["jax"]["config"]["batch_size"]), "--out",
                   str(out), "--dtype", "mixed_bfloat16")
    assert proc.returncode == 0, proc.stderr
    scores = {None: float32, "mixed_bfloat16": json.loads(out.read_text())}
    assert scores[None]["dtype"] == "float32" and scores[None]["loss"] == pytest.approx(
        char_runs["jax"]["metrics"]["test_loss"], rel=1e-5)
    assert scores["mixed_bfloat16"]["dtype"] == "mixed_bfloat16"
    assert scores["mixed_bfloat16"]["loss"] != scores[None]["loss"]
    assert scores["mixed_bfloat16"]["loss"] == pytest.approx(scores[None]["loss"], rel=2e-2)
    result = char_runs["torch"]
    generated = run_cli("generate", result["config"]["out"], "--prompt", "And God", "--max-new-tokens", "4",
                        "--dtype", "mixed_bfloat16")
    assert generated.returncode == 0 and " on torch in mixed_bfloat16 (" in generated.stderr, generated.stderr
    refused = run_cli("evaluate", char_runs["jax"]["config"]["out"], "--test", str(scored_test_split["text"]),
                      "--dtype", "float16", env=CPU_ONLY)
    assert_refused_in_one_line(refused, "--dtype float16: XLA on the CPU has no float16 matmul")


def bad_input_cases(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    no_text = tmp_path / "no-text"
    no_text.mkdir()
    (no_text / "readme.md").write_text("hello\n")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(("word " * 2000).encode() + "café".encode("latin-1") + b" more" * 3000)
    late = tmp_path / "latin1-late.txt"  # 20,000 bytes of words, then a byte that is not UTF-8 in the test split
    late.write_bytes(("word " * 4000).encode() + "café".encode("latin-1") + b" more" * 100)
    short = tmp_path / "short.txt"
    short.write_text("a short text\n" * 30)
    return {
        "empty file": (["--data", str(empty)], "the text is empty"),
        "folder without .txt": (["--data", str(no_text)], "holds no .txt file"),
        "not UTF-8": (["--data", str(latin1), "--tokenizer", "char"], "not UTF-8 at byte 10003"),
        # counted from the text's start, not the test split's
        "not UTF-8 in the test split": (["--data", str(late), "--tokenizer", "char"], "not UTF-8 at byte 20003 "),
        "shorter than a block": (["--data", str(short), "--block-size", "64"], "fewer than one block"),
        "encoder flag": (["--encoder-layers", "2"], "a decoder-only model has one stack"),
        "beam": (["--beam", "4"], "--beam is an option of translation"),
        "target BLEU": (["--target-bleu", "10", "--eval-every", "5"], "--target-bleu is an option of translation"),
        "validation pairs": (["--valid", str(short)], "--valid is an option of translation"),
        "preset": (["--preset", "base"], "unknown preset 'base' for --model gpt"),
        "sample without validation": (["--sample-prompt", "And"], "--sample-prompt needs --eval-every"),
        # The preset's own size, given, is asked for all the same (it was taken as not given).
        "vocabulary of bytes": (["--vocab-size", "2000"], "--vocab-size sizes a sentencepiece vocabulary "
                                "(--tokenizer sentencepiece); the byte tokenizer's vocabulary is its own"),
    }


@pytest.mark.parametrize("name", [
    "empty file", "folder without .txt", "not UTF-8", "not UTF-8 in the test split", "shorter than a block",
    "encoder flag", "beam", "target BLEU", "validation pairs",
    "preset", "sample without validation", "vocabulary of bytes"])
def test_bad_input_gets_one_line_and_nothing_written(name, tmp_path, cache_dir):
    arguments, expected = bad_input_cases(tmp_path)[name]
    out = tmp_path / "result.json"
    proc = run_cli("train", *TINY_GPT, *arguments, "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_an_empty_prompt_is_refused_before_the_model_is_opened(tmp_path):
    # The model named does not exist: the prompt is refused before it is looked for, let alone built.
    assert_refused_in_one_line(run_cli("generate", str(tmp_path / "absent.json"), "--prompt", ""),
                               "--prompt is empty: give the text to continue")


@pytest.mark.parametrize("option", [["--block-size", "32"], ["--eval-stride", "4"]])
def test_translation_refuses_a_language_models_options(option, tmp_path, cache_dir):
    proc = run_cli("train", "--preset", "tiny", *option, "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"Error: task 'translation': {option[0]} is an option of language models; the "
                                   f"'transformer' model family is trained on translation")


@pytest.mark.slow
def test_the_guides_decoder_only_family_trains_compares_and_is_scored_by_perplexity(plugin_path, text_folder,
                                                                                   cache_dir, tmp_path):
    """The decoder-only family of docs/plugins.md, copied as a reader would, in a plugin package of its own."""
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-oneblock"}
    out = tmp_path / "compare.json"
    proc = run_cli("compare", "--matrix", "jax;torch", "--model", "one-block-lm", "--preset", "mini", "--steps", "12",
                   "--batch-size", "8", "--valid-size", "5", "--test-size", "5", "--data", text_folder, "--cache-dir",
                   cache_dir, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation perplexity" in proc.stdout and "BLEU" not in proc.stdout and "test translation" not in proc.stdout
    combined = json.loads(out.read_text())
    for run in combined["runs"]:
        result = run["result"]
        assert result["config"]["task"] == "language-modelling" and result["model"]["family"] == "one-block-lm"
        # Sized by the family's own preset: its width, and its block of 32 tokens.
        assert (result["model"]["d_model"], result["config"]["max_len"]) == (32, 32)
        assert result["metrics"]["val_perplexity"] > 1 and "bleu" not in result["metrics"]
    assert combined["parity"]["passed"] and combined["parity"]["pairs"], combined["parity"]


# A user's choices in GPT's recipe, which win over the family's (test_the_gpt_recipe_trains_alike_on_both_backends_
# and_is_recorded): the learning rate of a step in the warm-up is the same whatever the schedule's floor.
USERS_RECIPE = ["--clip", "per-variable", "--weight-decay-on", "all", "--adam-beta2", "0.99", "--min-learning-rate",
                "1e-4"]


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, cache_dir):
    """A jax run read from a pipe ('stdout'; its result, 'result') that logs every 4 steps and validates every 6, with
    USERS_RECIPE (a run of its own for the recipe: 9 CPU s)."""
    folder = tmp_path_factory.mktemp("logged")
    proc = run_cli("train", "--backend", "jax", *TINY_GPT, "--steps", "12", "--log-every", "4", "--eval-every", "6",
                   *USERS_RECIPE, "--data", text_file(folder), "--cache-dir", cache_dir, "--out",
                   str(folder / "run.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"stdout": proc.stdout, "result": json.loads((folder / "run.json").read_text())}


@pytest.mark.slow
def test_off_a_terminal_training_logs_a_line_every_n_steps_and_each_validation(logged_run):
    """Read from a pipe, as a log file under nohup or SLURM gets them: the step, loss, learning rate (here in
    warm-up, which min(100, 12 - 1) = 11 steps make: 1e-3 x 3 / 11 at step 4), step time and tokens/s."""
    lines = logged_run["stdout"].splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["4/12", "8/12", "12/12"]
    history = {entry["step"]: entry for entry in logged_run["result"]["history"]}
    fields = steps[0].split()
    assert fields[2:4] == ["loss", f"{history[4]['loss']:.4f}"] and fields[4] == "lr"
    assert float(fields[5]) == pytest.approx(1e-3 * 3 / 11, rel=1e-3)
    assert fields[7] == "ms" and fields[9] == "tok/s"
    validations = [line for line in lines if line.startswith("validation at step")]
    assert [line.split(":")[0] for line in validations] == ["validation at step 6", "validation at step 12"]
    assert "loss" in validations[0] and "bits per byte" in validations[0]


def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("\n".join(bible_verses(600)) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_each_validation_prints_a_sample_and_the_best_model_is_kept_beside_the_last(tmp_path, cache_dir):
    """nanoGPT's evaluation: the model's continuation of --sample-prompt at each validation, and the weights of the
    best validation loss kept (RESULT.run/best), a saved model that `generate` reads as it reads the final one."""
    out = tmp_path / "run.json"
    proc = run_cli("train", "--backend", "torch", *TINY_GPT, "--steps", "12", "--eval-every", "4", "--sample-prompt",
                   "And God", "--sample-tokens", "12", "--data", text_file(tmp_path), "--tokenizer", "char",
                   "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    evaluations = result["target"]["evaluations"]
    assert [e["step"] for e in evaluations] == [4, 8, 12]
    for evaluation in evaluations:
        assert evaluation["sample"].startswith("And God") and len(evaluation["sample"]) > len("And God")
        assert f"sample: {evaluation['sample']}" in proc.stdout
    best = min(evaluations, key=lambda e: e["loss"])
    kept = str(tmp_path / "run.run" / "best")
    assert result["target"]["best"] == {"step": best["step"], "loss": best["loss"], "saved": kept}
    with np.load(f"{kept}/weights.npz") as best_weights, \
            np.load(str(tmp_path / "run.run" / "model" / "weights.npz")) as final_weights:
        same = all(np.array_equal(best_weights[name], final_weights[name]) for name in final_weights.files)
    assert same == (best["step"] == 12)  # the final weights are the best only when the last validation was
    generated = run_cli("generate", kept, "--prompt", "And God", "--max-new-tokens", "8", "--temperature", "0")
    assert generated.returncode == 0 and generated.stdout.startswith("And God"), generated.stderr


@pytest.mark.parametrize("args, expected", [
    (["--temperature", "nan"], "Invalid value for '--temperature': must be a finite number, got nan"),
    (["--temperature", "inf"], "Invalid value for '--temperature': must be a finite number, got inf"),
    (["--temperature", "0", "--top-k", "5"], "--top-k samples among the K most likely tokens; --temperature 0 takes "
                                             "the most likely one: drop --top-k"),
])
def test_generate_refuses_sampling_it_cannot_do_before_it_looks_for_the_model(tmp_path, args, expected):
    assert_refused_in_one_line(run_cli("generate", str(tmp_path / "no-model.json"), "--prompt", "And", *args),
                               expected)


def test_evaluate_shows_a_loss_past_a_floats_range_with_no_perplexity(monkeypatch, tmp_path):
    """A blown-up model's loss above 709 nats has no perplexity (`perplexity_of`, tested on a real model in
    test_language_model_scores.py): `evaluate` prints its scores and writes them, where it raised TypeError."""
    from click.testing import CliRunner
    import mtbench.runner.inference as inference
    from mtbench.cli import main
    scores = {"model": "m", "backend": "jax", "dtype": "float32", "text": "t.txt", "tokens_evaluated": 99,
              "bytes_evaluated": 99, "block_size": 32, "stride": 32, "loss": 812.5, "perplexity": None,
              "bits_per_byte": 812.5 / math.log(2), "unknown_characters": 0}
    monkeypatch.setattr(inference, "model_task", lambda model, registry: "language-modelling")
    monkeypatch.setattr(inference, "score_text", lambda *args: scores)
    out = tmp_path / "scores.json"
    ran = CliRunner().invoke(main, ["evaluate", str(tmp_path), "--test", "t.txt", "--out", str(out)],
                             env={"COLUMNS": "200"})
    assert ran.exit_code == 0, ran.output
    assert "812.5000" in ran.output and "n/a (past a float's range)" in ran.output
    assert json.loads(out.read_text())["perplexity"] is None
