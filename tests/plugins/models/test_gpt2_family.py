"""Fine-tuning a pretrained GPT-2 checkpoint (`--model gpt2:DIR`) against transformers' own GPT-2 on a tiny random
checkpoint that transformers wrote: the same token ids as its GPT2Tokenizer, the same logits from the loaded
weights, the same test loss before training on both backends (held to its loss over the same text); a comparison
of both backends fine-tuning it, held to the parity check; the fine-tuned model kept and scoring the run's test
text on the other backend; bad checkpoints and options end in one line."""

import json
import math
import os
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import CPU_ONLY, assert_refused_in_one_line, run_cli
from gpt2_fixture import build_checkpoint, transformers_windows_loss
from result_keys import undocumented_keys
from mtbench.runner.results.schema import schema_errors
from tests.runner.tasks.test_token_files import split_alike

BLOCK = 32
FINE_TUNE = ["--data", None, "--block-size", str(BLOCK), "--batch-size", "8", "--steps", "12", "--valid-size", "4",
             "--test-size", "100000", "--learning-rate", "1e-3", "--warmup-steps", "2", "--report", "none",
             "--dtype", "float32"]  # float32 on a GPU too: the losses are held to transformers' in float32
# Contractions, digits, runs of spaces and tabs, non-ASCII letters and symbols: each rule of GPT-2's word pattern.
TRICKY = ("It's 12,345 o'clock; we'll  see.\n\n\tThey'd  said:  «Où est-il?»   日本語  \n  end  ")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, cache_dir):
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    from mtbench.runner.data.corpus import load_dataset_pairs
    directory = tmp_path_factory.mktemp("gpt2")
    lines = [source for source, _ in load_dataset_pairs(BibleDataset("en", "fr"), cache_dir,
                                                        progress=lambda done, total: None)[:600]]
    text = directory / "verses.txt"
    text.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return {"model": build_checkpoint(str(directory / "gpt2-tiny"), lines), "text": str(text),
            "directory": directory}


def fine_tune_args(checkpoint):
    return ["--model", f"gpt2:{checkpoint['model']}", *[checkpoint["text"] if a is None else a for a in FINE_TUNE]]


def test_the_tokenizer_makes_transformers_ids_and_each_tokens_bytes(checkpoint):
    from transformers import GPT2Tokenizer as TransformersTokenizer

    from mtbench.plugins.models.gpt2_tokenizer import GPT2Tokenizer
    directory = checkpoint["model"]
    theirs = TransformersTokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
    ours = GPT2Tokenizer(directory)
    with open(checkpoint["text"], encoding="utf-8") as f:
        text = f.read()[:20000] + TRICKY
    stream = ours.stream(text.encode("utf-8"))
    expected = theirs(text)["input_ids"]
    assert len(expected) > 3000 and stream.ids.tolist() == expected
    assert ours.encode_text(TRICKY) == theirs(TRICKY)["input_ids"]
    # Each token stands for whole bytes: their counts sum to the text's, and decoding gives the text back.
    assert int(stream.token_bytes.sum()) == len(text.encode("utf-8"))
    assert [len(theirs.convert_tokens_to_string([t]).encode("utf-8")) for t in
            theirs.convert_ids_to_tokens(expected[:500])] == stream.token_bytes[:500].tolist()
    assert ours.decode_text(stream.ids) == text
    # The end-of-text mark between documents (token files) stands for no bytes of text, as transformers decodes it.
    end = theirs.convert_tokens_to_ids("<|endoftext|>")
    assert ours.bytes_per_id()[end] == len(theirs.decode([end], skip_special_tokens=True).encode("utf-8")) == 0
    assert ours.bytes_per_id()[expected[0]] == len(theirs.decode(expected[:1]).encode("utf-8")) > 0


def test_the_loaded_weights_compute_transformers_logits_and_need_its_gelu(checkpoint):
    """On JAX here (the test process's backend); torch's are held to transformers' by the comparison below."""
    import keras
    import torch
    from transformers import GPT2LMHeadModel

    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.models.gpt2 import GPT2Family
    family, directory = GPT2Family(), checkpoint["model"]
    ids = np.random.default_rng(0).integers(0, 400, (2, BLOCK)).astype(np.int32)
    with torch.no_grad():
        expected = GPT2LMHeadModel.from_pretrained(directory).eval()(torch.tensor(ids, dtype=torch.long)).logits
    config = SimpleNamespace(max_len=BLOCK, model=GPT_PRESETS["tiny"], data_file=checkpoint["text"])
    run = SimpleNamespace(config=config, model_options={})
    model, shape = family.build(run, directory, family.tokenizer(directory, config), BLOCK)
    assert (shape.d_model, shape.decoder_layers, shape.num_heads, shape.ff_dim, shape.vocab_size, shape.max_len) == \
        (32, 2, 2, 128, 400, BLOCK)
    weights = family.pretrained_weights(directory, model)
    for variable in model.weights:
        variable.assign(weights[variable.path])
    logits = keras.ops.convert_to_numpy(model(ids))
    assert np.abs(expected.numpy()).max() > 3  # far from uniform: a wrong weight shows
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=1e-4)
    for block in model.blocks:  # the exact GELU instead of GPT-2's approximation: measurably other logits
        block.mlp.hidden.activation = keras.activations.gelu
    assert np.abs(keras.ops.convert_to_numpy(model(ids)) - expected.numpy()).max() > 1e-3


@pytest.fixture(scope="module")
def compared(checkpoint, cache_dir):
    out = checkpoint["directory"] / "compare.json"
    proc = run_cli("compare", "--matrix", "jax;torch", *fine_tune_args(checkpoint), "--cache-dir", cache_dir,
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_both_backends_start_from_transformers_loss_and_fine_tune_alike(compared, checkpoint):
    results = [run["result"] for run in compared["runs"]]
    assert compared["parity"]["passed"] and compared["parity"]["pairs"], compared["parity"]
    start, end = results[0]["data"]["byte_ranges"]["test"]
    with open(checkpoint["text"], "rb") as f:
        test_text = f.read()[start:end].decode("utf-8")
    expected_loss, predicted, first_bytes = transformers_windows_loss(checkpoint["model"], test_text, BLOCK)
    for result in results:
        assert result["model"]["family"] == "gpt2" and result["model"]["init"] == "pretrained"
        assert result["data"]["tokenizer"]["type"] == "gpt2-bpe"
        before = result["model"]["before_training"]
        assert before["tokens_evaluated"] == predicted and before["bytes_evaluated"] == end - start - first_bytes
        assert before["loss"] == pytest.approx(expected_loss, rel=1e-5)
        assert result["metrics"]["test_loss"] < before["loss"]  # fine-tuning learnt the text
        # the summary train ends with sets the starting loss beside the fine-tuned one (it was in the JSON alone)
        from mtbench.plugins.reporters.table_reporter import summary_lines
        quality = next(line for line in summary_lines(result) if line.startswith("  quality "))
        assert f"; before training (test) loss {before['loss']:.3f}, perplexity " in quality, quality


@pytest.mark.slow
def test_the_fine_tuned_model_scores_the_runs_test_text_on_the_other_backend(compared, tmp_path):
    torch_run = next(run for run in compared["runs"] if run["result"]["backend"] == "torch")
    result = torch_run["result"]
    assert {"config.json", "vocab.json", "merges.txt", "weights.npz"} <= set(os.listdir(result["model"]["saved"]))
    start, end = result["data"]["byte_ranges"]["test"]
    with open(result["config"]["data_file"], "rb") as f:
        (tmp_path / "test.txt").write_bytes(f.read()[start:end])
    proc = run_cli("evaluate", torch_run["result_file"], "--test", str(tmp_path / "test.txt"), "--backend", "jax",
                   "--out", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["loss"] == pytest.approx(result["metrics"]["test_loss"], rel=1e-5)
    proc = run_cli("generate", torch_run["result_file"], "--prompt", "In the beginning", "--max-new-tokens", "5",
                   "--temperature", "0", "--backend", "jax")
    assert proc.returncode == 0 and proc.stdout.startswith("In the beginning"), proc.stderr[-3000:]


@pytest.mark.slow
def test_torch_splits_and_shards_the_checkpoint_after_scoring_it_whole(checkpoint, cache_dir, tmp_path):
    """A fresh run of a pretrained model scores the checkpoint before its first step: under tensor parallelism and
    FSDP on torch, with the weights whole (they were split or sharded when the step was built), then trains them
    split or sharded as one device does."""
    out = tmp_path / "split.json"
    # On the CPU, also on a GPU machine: two processes each need a device of their own.
    proc = run_cli("compare", "--matrix", "jax;torch+tensor-parallel@2;torch+fsdp@2", *fine_tune_args(checkpoint),
                   "--test-size", "4", "--steps", "6", "--cache-dir", cache_dir, "--out", str(out), env=CPU_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    compared = json.loads(out.read_text())
    assert compared["parity"]["passed"] and len(compared["parity"]["pairs"]) == 2, compared["parity"]
    before = [run["result"]["model"]["before_training"]["loss"] for run in compared["runs"]]
    assert before[1:] == pytest.approx([before[0]] * 2, rel=1e-5)
    assert {"tensor-parallel", "fsdp"} <= {extra for run in compared["runs"] for extra in run["result"]["extras"]}


@pytest.mark.parametrize("breakage, args, message", [
    ("no-directory", [], "GPT-2 model directory"),
    ("merges.txt", [], "merges.txt is missing from the GPT-2 model directory"),
    ("model.safetensors", [], "model.safetensors (or pytorch_model.bin) is missing"),
    ("gelu-exact-is-fine-but-relu-is-not", [], "activation_function 'relu' is not implemented by mtbench's GPT"),
    ("marian-config", [], "describes a 'marian' model, not a GPT-2"),
    (None, ["--d-model", "64"], "--d-model: a pretrained model's size comes from its config.json"),
    (None, ["--tokenizer", "char"], "--tokenizer char: a GPT-2 checkpoint reads text with its own BPE"),
    # The default preset's own size, given, is refused all the same (it was taken as not given).
    (None, ["--vocab-size", "8000"], "--vocab-size 8000: a GPT-2 checkpoint's vocabulary is its own (400 tokens)"),
    (None, ["--block-size", "65"], "--block-size 65 is longer than the 64 positions of the pretrained model"),
    (None, ["--init", "gpt2"], "--init gpt2: --model gpt2 starts from its checkpoint's weights"),
    ("characters", [], "holds meta.pkl: its token files are a character-level text's ids, not GPT-2's tokens"),
])
def test_a_bad_checkpoint_or_option_is_one_line(checkpoint, tmp_path, breakage, args, message):
    model = checkpoint["model"]
    if breakage == "characters":
        folder = write_token_files(tmp_path / "chars", [1, 2, 3] * 100)
        (tmp_path / "chars" / "meta.pkl").write_bytes(b"")
        args = ["--data", folder]
    elif breakage == "no-directory":
        model = str(tmp_path / "missing")
    elif breakage is not None:
        model = str(tmp_path / "broken")
        shutil.copytree(checkpoint["model"], model)
        config_file = os.path.join(model, "config.json")
        config = json.loads(open(config_file).read())
        if breakage.endswith("relu-is-not"):
            config["activation_function"] = "relu"
        elif breakage == "marian-config":
            config["model_type"] = "marian"
        else:
            os.remove(os.path.join(model, breakage))
        open(config_file, "w").write(json.dumps(config))
    proc = run_cli("train", *fine_tune_args(checkpoint)[2:], "--model", f"gpt2:{model}", *args,
                   "--out", str(tmp_path / "r.json"))
    assert_refused_in_one_line(proc, message)
    assert not (tmp_path / "r.json").exists()


def test_translating_with_a_language_model_is_refused_as_one(checkpoint):
    """The checkpoint's task is told before its options are: it said '--block-size 128 is longer than the 64
    positions of the pretrained model', an option translate does not have."""
    model = f"gpt2:{checkpoint['model']}"
    assert_refused_in_one_line(run_cli("translate", model, "/dev/null"),
                               f"{model}: a model of the language-modelling task ('gpt2'); this command serves "
                               f"translation models")
    # a family that publishes no checkpoint is no model of another task, but no checkpoint at all
    assert_refused_in_one_line(run_cli("generate", "transformer:foo", "--prompt", "a"),
                               "transformer:foo: --model transformer is no pretrained model family")


def write_token_files(folder, ids):
    """nanoGPT's token files of `ids`: nine tenths train.bin, the rest val.bin (its `prepare.py`'s split)."""
    os.makedirs(folder)
    cut = len(ids) * 9 // 10
    np.asarray(ids[:cut], np.uint16).tofile(os.path.join(folder, "train.bin"))
    np.asarray(ids[cut:], np.uint16).tofile(os.path.join(folder, "val.bin"))
    return str(folder)


@pytest.mark.slow
def test_token_files_of_its_tokenizers_ids_train_with_its_vocabulary_and_bytes_and_others_are_refused(
        checkpoint, tmp_path, cache_dir):
    """nanoGPT's `finetune_shakespeare.py` reads GPT-2's ids from token files: their vocabulary is the checkpoint's
    tokenizer's (token files alone would round their largest id up to a multiple of 64), which also tells the bytes
    each id stands for (bits per byte) and continues a prompt; an id past it is refused."""
    from transformers import GPT2Tokenizer as TransformersTokenizer
    from mtbench.plugins.models.gpt2_tokenizer import GPT2Tokenizer
    with open(checkpoint["text"], "rb") as f:
        ids = GPT2Tokenizer(checkpoint["model"]).stream(f.read()).ids.tolist()
    folder = write_token_files(tmp_path / "tokens", ids)
    args = [*fine_tune_args(checkpoint)[2:], "--model", f"gpt2:{checkpoint['model']}", "--data", folder,
            "--steps", "2", "--cache-dir", cache_dir]
    summary = [{"none": "summary"}.get(arg, arg) for arg in args]  # the reporter that prints the run's size
    proc = run_cli("train", *summary, "--backend", "torch", "--step", "eager", "--eval-every", "2",
                   "--sample-prompt", "And God", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert schema_errors(result) == [] and undocumented_keys(result) == []
    assert result["data"]["tokenizer"]["type"] == "gpt2-bpe"
    assert result["data"]["tokenizer"]["vocab_size"] == result["model"]["vocab_size"] == 400
    # Its size is the checkpoint's, not --preset's, and the summary says so.
    assert f"(checkpoint gpt2-tiny: {result['model']['parameters']:,} parameters)" in proc.stdout
    assert result["data"]["largest_id"] == max(ids)  # alone, the files would make a vocabulary of 448
    # The bytes are transformers' text of the very ids: val.bin's halves, and the test tokens scored (1 to n).
    theirs = TransformersTokenizer(os.path.join(checkpoint["model"], "vocab.json"),
                                   os.path.join(checkpoint["model"], "merges.txt"))
    val = ids[len(ids) * 9 // 10:]
    halves = {"valid": val[:len(val) // 2], "test": val[len(val) // 2:]}

    def text_bytes(some_ids):
        return len(theirs.decode(some_ids, clean_up_tokenization_spaces=False).encode("utf-8"))
    assert result["data"]["bytes"] == {"train": None} | {split: text_bytes(part) for split, part in halves.items()}
    metrics, scored = result["metrics"], result["metrics"]["test_tokens_evaluated"]
    assert metrics["test_bytes_evaluated"] == text_bytes(halves["test"][1:scored + 1])
    assert metrics["test_bits_per_byte"] == pytest.approx(
        metrics["test_loss"] * scored / math.log(2) / metrics["test_bytes_evaluated"], rel=1e-6)
    assert result["model"]["before_training"]["bits_per_byte"] is not None
    assert result["target"]["evaluations"][0]["sample"].startswith("And God")
    past = write_token_files(tmp_path / "past", ids[:-1] + [400])
    proc = run_cli("train", *args, "--data", past, "--out", str(tmp_path / "p.json"))
    assert_refused_in_one_line(proc, "the token files hold id 400, past the 400 ids of the model's own tokenizer")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.slow  # two fine-tuning processes, about 10 s each
def test_token_files_of_a_text_fine_tune_as_the_text_does(checkpoint, tmp_path, cache_dir):
    """GPT-2's ids of a text written as nanoGPT's token files: the same run as on the text, loss for loss, and the
    same bits per byte."""
    from mtbench.plugins.models.gpt2_tokenizer import GPT2Tokenizer
    tokenizer = GPT2Tokenizer(checkpoint["model"])
    lines = Path(checkpoint["text"]).read_text(encoding="utf-8").splitlines()
    train_text, held_out = split_alike(lines, 60)
    (tmp_path / "text.txt").write_text(train_text + held_out + held_out, encoding="utf-8")
    folder = tmp_path / "tokens"
    folder.mkdir()
    tokenizer.stream(train_text.encode()).ids.astype(np.uint16).tofile(folder / "train.bin")
    np.tile(tokenizer.stream(held_out.encode()).ids.astype(np.uint16), 2).tofile(folder / "val.bin")
    results = {}
    for name, data in (("text", tmp_path / "text.txt"), ("tokens", folder)):
        proc = run_cli("train", *fine_tune_args(checkpoint), "--data", str(data), "--backend", "jax",
                       "--cache-dir", cache_dir, "--out", str(tmp_path / f"{name}.json"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / f"{name}.json").read_text())
    by_text, by_ids = results["text"], results["tokens"]
    assert by_ids["data"]["tokens"] == by_text["data"]["tokens"]
    assert [h["loss"] for h in by_ids["history"]] == pytest.approx([h["loss"] for h in by_text["history"]], rel=1e-6)
    for figure in ("loss", "bits_per_byte", "tokens_evaluated", "bytes_evaluated"):
        for split in ("val", "test"):
            assert by_ids["metrics"][f"{split}_{figure}"] == pytest.approx(
                by_text["metrics"][f"{split}_{figure}"], rel=1e-6), (split, figure)
        assert by_ids["model"]["before_training"][figure] == pytest.approx(
            by_text["model"]["before_training"][figure], rel=1e-6), figure
    # `evaluate` of a folder whose val.bin is the test split's ids gives the run's test figures, on the other backend.
    test_split = tmp_path / "test-split"
    test_split.mkdir()
    tokenizer.stream(held_out.encode()).ids.astype(np.uint16).tofile(test_split / "val.bin")
    proc = run_cli("evaluate", str(tmp_path / "tokens.json"), "--test", str(test_split), "--backend", "torch",
                   "--out", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert undocumented_keys(scores) == [] and scores["bytes"] == len(held_out.encode())
    for figure in ("loss", "bits_per_byte", "tokens_evaluated", "bytes_evaluated"):
        assert scores[figure] == pytest.approx(by_ids["metrics"][f"test_{figure}"], rel=1e-5), figure
    (test_split / "val.bin").write_bytes(np.array([1, 2, 400], np.uint16).tobytes())
    refused = run_cli("evaluate", str(tmp_path / "tokens.json"), "--test", str(test_split))
    assert_refused_in_one_line(refused, "val.bin holds id 400, past the 400 ids of the model")
    with open(test_split / "meta.pkl", "wb") as f:  # a character-level text's ids
        pickle.dump({"vocab_size": 3, "itos": {0: "a", 1: "b", 2: "c"}}, f)
    refused = run_cli("evaluate", str(tmp_path / "tokens.json"), "--test", str(test_split))
    assert_refused_in_one_line(refused, "its meta.pkl gives each id a character, which the model")
    refused = run_cli("evaluate", str(tmp_path / "tokens.json"), "--test", str(test_split), "--block-size", "16")
    assert_refused_in_one_line(refused, "--block-size sizes a pretrained checkpoint's window (NAME:DIR)")


@pytest.mark.slow  # two processes reading the checkpoint, about 8 s each
def test_evaluate_and_generate_read_the_checkpoint_as_published(checkpoint, tmp_path):
    """nanoGPT's `eval_gpt2.py` and `sample.py --init_from=gpt2`: `gpt2:DIR` as MODEL scores a text with
    transformers' loss in the same windows, and continues a prompt greedily as transformers' `generate` does."""
    import torch
    from transformers import GPT2LMHeadModel, GPT2Tokenizer as TransformersTokenizer
    text = Path(checkpoint["text"]).read_text(encoding="utf-8")
    proc = run_cli("evaluate", f"gpt2:{checkpoint['model']}", "--test", checkpoint["text"], "--block-size",
                   str(BLOCK), "--backend", "torch", "--out", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    loss, count, first_bytes = transformers_windows_loss(checkpoint["model"], text, BLOCK)
    assert scores["loss"] == pytest.approx(loss, rel=1e-5) and scores["tokens_evaluated"] == count
    assert scores["bytes_evaluated"] == len(text.encode("utf-8")) - first_bytes
    assert scores["model"] == f"checkpoint gpt2:{checkpoint['model']} (pretrained)" and undocumented_keys(scores) == []
    tokenizer = TransformersTokenizer(os.path.join(checkpoint["model"], "vocab.json"),
                                      os.path.join(checkpoint["model"], "merges.txt"))
    prompt = "And God said"
    with torch.no_grad():
        theirs = GPT2LMHeadModel.from_pretrained(checkpoint["model"]).eval().generate(
            torch.tensor([tokenizer(prompt)["input_ids"]]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    proc = run_cli("generate", f"gpt2:{checkpoint['model']}", "--prompt", prompt, "--temperature", "0",
                   "--max-new-tokens", "12", "--block-size", str(BLOCK), "--backend", "jax")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip("\n") == tokenizer.decode(theirs[0], clean_up_tokenization_spaces=False)


def test_a_checkpoint_as_published_reads_its_own_context_unless_block_size_is_given(checkpoint, tmp_path):
    """`evaluate gpt2:DIR` scores GPT-2 in its 1,024 positions (config.json's n_positions), as nanoGPT's
    `eval_gpt2.py` does; it took the preset's 128-token block, and refused this 64-position checkpoint outright."""
    from mtbench.plugins import manager
    from mtbench.runner.inference import located_model, score_text
    registry = manager.registry()
    model = f"gpt2:{checkpoint['model']}"
    scores = score_text(model, registry, checkpoint["text"], "jax", rows=64)
    assert scores["block_size"] == scores["stride"] == 64
    assert located_model(model, registry, block_size=32).source.config.max_len == 32
    published = tmp_path / "gpt2-1024"  # GPT-2's own context, past every preset's block
    shutil.copytree(checkpoint["model"], published)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(json.dumps({**config, "n_positions": 1024, "n_ctx": 1024}))
    assert located_model(f"gpt2:{published}", registry).source.config.max_len == 1024


@pytest.mark.parametrize("model, args, message", [
    ("gpt2:{model}", ["--block-size", "65"], "--block-size 65 is longer than the 64 positions of the pretrained "
                                             "model"),
    ("gpt2:{missing}", [], "missing does not exist (a directory that transformers' save_pretrained wrote"),
    ("gpt2:{weights}", [], "model.safetensors is not a directory (a directory that transformers' save_pretrained"),
    ("transformer:{model}", [], "--model transformer is no pretrained model family with its own tokenizer"),
])
def test_a_checkpoint_that_cannot_be_read_as_model_is_one_line(checkpoint, tmp_path, model, args, message):
    path = model.format(model=checkpoint["model"], missing=tmp_path / "missing",
                        weights=os.path.join(checkpoint["model"], "model.safetensors"))
    proc = run_cli("evaluate", path, "--test", checkpoint["text"], *args)
    assert_refused_in_one_line(proc, message)


def test_weights_that_do_not_fit_are_named(checkpoint):
    from safetensors.numpy import load_file

    from mtbench import MtbenchError
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import ModelPreset
    from mtbench.plugins.models.gpt2_checkpoint import keras_weights
    state = load_file(os.path.join(checkpoint["model"], "model.safetensors"))
    model = build_gpt(ModelPreset(d_model=32, num_heads=2, encoder_layers=0, decoder_layers=2, ff_dim=128,
                                  vocab_size=400, max_len=BLOCK))
    assert len(keras_weights(state, model)) == len(model.weights)
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.2.ln_1.weight"] = np.ones(32, np.float32)
    with pytest.raises(MtbenchError, match=r"missing: h\.1\.mlp\.c_fc\.bias; unexpected: h\.2\.ln_1\.weight"):
        keras_weights(state, model)


def test_fine_tuning_takes_the_checkpoints_own_context_unless_block_size_is_given(checkpoint, tmp_path):
    """`train --model gpt2:DIR` fine-tunes in the checkpoint's positions (nanoGPT fine-tunes GPT-2 at its 1,024), as
    `evaluate` and `generate` read it: it took the preset's 128-token block, refused outright by this 64-position
    checkpoint. The configuration records the block that ran; compare's runs are configured alike."""
    from mtbench.runner.config import TrainConfig
    model = f"gpt2:{checkpoint['model']}"
    assert TrainConfig.from_options(model_name=model).max_len == 64
    assert TrainConfig.from_options(model_name=model, block_size=BLOCK).max_len == BLOCK
    assert TrainConfig.from_options(model_name=model, max_len=BLOCK).max_len == BLOCK
    out = tmp_path / "r.json"
    proc = run_cli("train", "--model", model, "--data", checkpoint["text"], "--batch-size", "2", "--steps", "2",
                   "--valid-size", "4", "--test-size", "100", "--measure-only", "--dtype", "float32", "--report",
                   "none", "--out", str(out), env=CPU_ONLY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["max_len"] == result["model"]["max_len"] == 64
