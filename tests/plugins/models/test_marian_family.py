"""Fine-tuning a pretrained MarianMT checkpoint through the command line: a comparison of both backends from the
checkpoint's weights (held to the parity check), the pretrained model's BLEU recorded, the fine-tuned model kept
and translating on the backend that did not train it; bad checkpoints and options end in one line."""

import json
import os
import shutil

import pytest

from conftest import run_cli, traced_matmul_flops
from marian_fixture import build_checkpoint, parallel_sentences

FINE_TUNE = ["--data", None, "--valid-size", "16", "--test-size", "16", "--max-len", "32", "--steps", "12",
             "--batch-size", "16", "--learning-rate", "1e-3", "--warmup-steps", "4", "--dropout", "0",
             "--report", "none", "--dtype", "float32"]  # float32 on a GPU too: equal translations are compared


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("marian")
    build_checkpoint(str(directory / "opus-mt-tiny"))
    pairs = directory / "pairs.tsv"
    pairs.write_text("".join(f"{s}\t{t}\n" for s, t in parallel_sentences()), encoding="utf-8")
    return {"model": str(directory / "opus-mt-tiny"), "pairs": str(pairs), "directory": directory}


def fine_tune_args(checkpoint):
    return ["--model", f"marian:{checkpoint['model']}",
            *[checkpoint["pairs"] if arg is None else arg for arg in FINE_TUNE]]


@pytest.fixture(scope="module")
def compared(checkpoint, cache_dir):
    out = checkpoint["directory"] / "compare.json"
    proc = run_cli("compare", "--matrix", "jax;torch", *fine_tune_args(checkpoint), "--cache-dir", cache_dir,
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_both_backends_fine_tune_the_checkpoint_alike(compared):
    results = [run["result"] for run in compared["runs"]]
    assert compared["parity"]["passed"] and compared["parity"]["pairs"], compared["parity"]
    for result in results:
        assert result["model"]["family"] == "marian" and result["model"]["d_model"] == 32
        assert (result["model"]["init"], result["config"]["init"]) == ("pretrained", None)  # the checkpoint's
        assert result["data"]["tokenizer"]["special"] == {"pad": 87, "eos": 0, "start": 87}
        assert result["history"][-1]["loss"] < result["history"][0]["loss"]
        # The source's padding mask computed on the device: `ops.not_equal(ids, pad)` made torch copy the pad id
        # from the host at every step.
        assert result["host_syncs_per_step"] == 0, result["host_syncs"]
    # The pretrained weights translate the same on both backends before any training.
    before = [result["model"]["before_training"] for result in results]
    assert before[0]["bleu"] == pytest.approx(before[1]["bleu"], abs=1e-6)
    assert before[0]["bleu_signature"] == results[0]["metrics"]["bleu_signature"]


@pytest.mark.slow
def test_the_fine_tuned_model_is_kept_and_translates_on_the_other_backend(compared, tmp_path):
    torch_run = next(run for run in compared["runs"] if run["result"]["backend"] == "torch")
    saved = torch_run["result"]["model"]["saved"]
    assert {"config.json", "source.spm", "target.spm", "vocab.json", "weights.npz", "model.json"} <= set(
        os.listdir(saved))
    with open(torch_run["result"]["hypotheses_file"], encoding="utf-8") as f:
        hypotheses = f.read().splitlines()
    sources = [line.split("\t")[0] for line in open(torch_run["result"]["config"]["data_file"], encoding="utf-8")]
    # Which test sentences the run scored is the corpus split's business; any sentences will do here: the same
    # model must give the same translation on both backends.
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(s + "\n" for s in sources[:20]), encoding="utf-8")
    translations = {}
    for backend in ("jax", "torch"):
        proc = run_cli("translate", torch_run["result_file"], "--backend", backend, str(sentences))
        assert proc.returncode == 0, proc.stderr[-3000:]
        translations[backend] = proc.stdout.splitlines()
    assert translations["jax"] == translations["torch"] and len(translations["jax"]) == 20
    assert len(hypotheses) == torch_run["result"]["metrics"]["test_sentences_scored"]


@pytest.mark.parametrize("breakage, message", [
    ("no-directory", "does not exist"),
    ("source.spm", "source.spm"),
    ("model.safetensors", "model.safetensors"),
    ("size-flag", "--d-model"),
    ("vocabulary", "--vocab-size 8000: a MarianMT checkpoint's vocabulary is its own"),  # the preset's, given
])
def test_a_bad_checkpoint_or_option_is_one_line(checkpoint, tmp_path, breakage, message):
    model = str(tmp_path / "missing")
    extra = []
    if breakage == "size-flag":
        model, extra = checkpoint["model"], ["--d-model", "64"]
    elif breakage == "vocabulary":
        model, extra = checkpoint["model"], ["--vocab-size", "8000"]
    elif breakage != "no-directory":
        model = str(tmp_path / "broken")
        shutil.copytree(checkpoint["model"], model)
        os.remove(os.path.join(model, breakage))
    proc = run_cli("train", *fine_tune_args(checkpoint)[2:], "--model", f"marian:{model}", *extra,
                   "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # a process and transformers' generation, about 10 s
def test_the_checkpoint_as_published_translates_as_transformers_generates(checkpoint, tmp_path):
    """`marian:DIR` as MODEL: its pretrained weights translate greedily as transformers' `generate` does, for every
    sentence that ends before the length both stop at."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer
    sources = [source for source, _ in parallel_sentences()[:12]]
    text = tmp_path / "sources.txt"
    text.write_text("".join(source + "\n" for source in sources), encoding="utf-8")
    proc = run_cli("translate", f"marian:{checkpoint['model']}", str(text), "--backend", "torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokenizer = MarianTokenizer.from_pretrained(checkpoint["model"])
    model = MarianMTModel.from_pretrained(checkpoint["model"]).eval()
    with torch.no_grad():
        batch = tokenizer(sources, padding=True, return_tensors="pt")
        generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=40)  # below its 48
    # At the length limit transformers forces </s> into the last position (`forced_eos_token_id`): not an end.
    ended = [row for row, tokens in enumerate(generated[:, 1:-1].tolist()) if model.config.eos_token_id in tokens]
    assert ended, "the checkpoint's weights end no sentence early: nothing to compare"
    translations = proc.stdout.splitlines()
    theirs = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert [translations[row] for row in ended] == [theirs[row] for row in ended]



@pytest.mark.slow
def test_a_checkpoint_fine_tunes_recomputing_its_layers_to_the_same_losses(checkpoint, cache_dir, tmp_path):
    """`--extra remat` on Marian's post-norm layers (encoder and decoder): every layer recomputed in the backward
    pass of one row, the losses those of the run that keeps its activations, with dropout."""
    results = {}
    for name, extra in (("keeping", []), ("recomputing", ["--extra", "remat"])):
        out = tmp_path / f"{name}.json"
        # eager on a GPU too (`--step auto` compiles there): the two runs' masks and sums are then the same kernels'
        # --measure-only: the losses and the record are written before the scoring, which nothing here reads
        proc = run_cli("train", "--backend", "torch", *fine_tune_args(checkpoint), "--dropout", "0.1", *extra,
                       "--step", "eager", "--measure-only", "--cache-dir", cache_dir, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads(out.read_text())
    layers = results["recomputing"]["extras_record"]["remat"]
    assert layers["blocks"] == layers["recomputed_in_backward"] >= 2
    assert [h["loss"] for h in results["recomputing"]["history"]] == [h["loss"] for h in results["keeping"]["history"]]


def test_a_decoder_wider_than_its_encoder_is_counted_at_its_own_width():
    """MFU's FLOPs are the matmuls the model runs: here counted in the traced forward pass of a MarianMT whose
    decoder's feed-forward width (256) is not its encoder's (64). The family counted the encoder's for both, a third
    of this model's work short."""
    import numpy as np

    from mtbench.keras_models.marian import build_marian
    from mtbench.plugins.models.marian import MarianFamily

    settings = {"vocab_size": 101, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 256, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                "pad_token_id": 100, "decoder_start_token_id": 100, "max_position_embeddings": 64, "dropout": 0.0}
    tokens = np.ones((2, 16), np.int32)
    ran = traced_matmul_flops(build_marian(settings), (tokens, tokens))
    shape = MarianFamily._shape(settings, 16)
    assert shape.decoder_ff_dim == 256
    assert MarianFamily().training_flops(shape, 2, 16, 16) == 3 * ran
