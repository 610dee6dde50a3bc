"""mtbench's Keras MarianMT against transformers' MarianMTModel on a tiny random checkpoint that transformers
itself wrote: the same logits (float32, on JAX here and on torch in a fresh process), the same greedy
translation as `generate(num_beams=1)`, the same token ids and text as transformers' MarianTokenizer, and clear
errors for a directory that cannot serve."""

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPOSITORY, TESTS_DIR, json_answer, python_path
from marian_fixture import WORD_WITH_MISSING_PIECE, build_checkpoint, copy_with_torch_weights
from marian_probe import build_loaded_model, mtbench_outputs

from mtbench import MtbenchError
from mtbench.runner.config import TrainConfig

# A Marian checkpoint written by transformers and loaded on both backends (19 s in all): the full suite's.
pytestmark = pytest.mark.slow

TOLERANCE = 1e-4
NEW_TOKENS = 12
WEIGHT_DRAWS = 8  # seeds the checkpoint fixture tries
# Of different lengths (a padded batch), one with a language code, one with a piece vocab.json lacks.
SOURCES = ["The cat sees the bread.", ">>fra<< My brother loves a red apple in the morning!", "Hi",
           "A child hides some water today."]
TARGETS = ["Le chat voit le pain.", "Mon frère aime une pomme rouge le matin !", "Salut",
           f"Un enfant cache de l'eau {WORD_WITH_MISSING_PIECE}."]


def transformers_outputs(model, tokenizer, sources, targets):
    """The torch model's inputs, logits and greedy generation for a batch."""
    import torch
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    labels = batch["labels"]
    decoder_input = torch.full_like(labels, model.config.decoder_start_token_id)
    decoder_input[:, 1:] = labels[:, :-1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_input).logits
        generated = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   num_beams=1, do_sample=False, max_new_tokens=NEW_TOKENS)
    # Rows that ended early are padded; so is the whole output when every row ended early.
    padded = np.full((len(sources), NEW_TOKENS + 1), model.config.pad_token_id, np.int32)
    padded[:, :generated.shape[1]] = generated.numpy()
    return {"source": batch["input_ids"].numpy().astype(np.int32),
            "decoder_input": decoder_input.numpy().astype(np.int32),
            "logits": logits.numpy(), "generated": padded, "new_tokens": np.int32(NEW_TOKENS)}


def comparable(tokens):
    """All but the last position: at its length limit transformers forces </s> there (`forced_eos_token_id`),
    where mtbench's decoder leaves the sentence unfinished for the caller to cut."""
    return np.asarray(tokens)[:, :NEW_TOKENS]


def some_end_early(generated, eos):
    """Whether transformers' greedy translation ends some rows before their length limit and runs others on to
    it: then comparing mtbench's with it checks both where a sentence stops and what it says."""
    ended_early = [eos in row[1:-1] for row in comparable(generated)]
    return any(ended_early) and not all(ended_early)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """(directory, torch model, transformers tokenizer) of the tiny checkpoint with a shared vocabulary: the first
    weights drawn whose greedy translation of SOURCES is worth comparing (`some_end_early`). Which draw that is
    depends on transformers' and sentencepiece's versions (on an H100 machine's, the first translated every
    sentence to one token repeated)."""
    for seed in range(WEIGHT_DRAWS):
        directory = str(tmp_path_factory.mktemp("marian") / "opus-mt-tiny-en-fr")
        model, tokenizer = build_checkpoint(directory, seed=seed)
        if some_end_early(transformers_outputs(model, tokenizer, SOURCES, TARGETS)["generated"],
                          tokenizer.eos_token_id):
            return directory, model, tokenizer
    pytest.fail(f"none of {WEIGHT_DRAWS} weight draws translates SOURCES ending some sentences early, not all")


@pytest.fixture(scope="module")
def reference(checkpoint):
    _, model, tokenizer = checkpoint
    return transformers_outputs(model, tokenizer, SOURCES, TARGETS)


@pytest.fixture(scope="module")
def on_jax(checkpoint, reference):
    model, tokenizer, logits, tokens = mtbench_outputs(checkpoint[0], reference["source"],
                                                       reference["decoder_input"], NEW_TOKENS)
    return SimpleNamespace(model=model, tokenizer=tokenizer, logits=logits, tokens=tokens)


def test_the_logits_are_those_of_transformers_on_jax(reference, on_jax):
    assert on_jax.logits.dtype == np.float32 and on_jax.logits.shape == reference["logits"].shape
    assert np.max(np.abs(on_jax.logits - reference["logits"])) <= TOLERANCE
    # The checkpoint's dropout (0.1) is there for training; the logits above are those of inference.
    assert on_jax.model.embedding_dropout.rate == 0.1


def test_greedy_translation_is_that_of_generate_on_jax(checkpoint, reference, on_jax):
    _, _, hf_tokenizer = checkpoint
    expected = comparable(reference["generated"])
    eos, pad = on_jax.tokenizer.special.eos, on_jax.tokenizer.special.pad
    assert some_end_early(reference["generated"], eos), expected  # the fixture's weights make it worth something
    np.testing.assert_array_equal(comparable(on_jax.tokens), expected)
    assert on_jax.tokenizer.decode(comparable(on_jax.tokens)[:, 1:]) == \
        hf_tokenizer.batch_decode(expected, skip_special_tokens=True)
    for row in comparable(on_jax.tokens)[:, 1:].tolist():
        assert pad not in (row[:row.index(eos)] if eos in row else row)


def test_decoding_never_yields_the_padding_the_model_would_choose(checkpoint, reference, on_jax):
    """The fixture's model ranks <pad> first at some positions. Training's logits keep it there (they matched
    transformers' above); decoding never chooses it, as transformers' generation forbids it."""
    import torch
    _, model, _ = checkpoint
    special = on_jax.tokenizer.special
    assert on_jax.model.pad_id == special.pad
    assert (np.argmax(reference["logits"], axis=-1) == special.pad).any()
    tokens = comparable(on_jax.tokens)
    with torch.no_grad():
        own_logits = model(input_ids=torch.tensor(reference["source"]),
                           attention_mask=torch.tensor(reference["source"] != special.pad),
                           decoder_input_ids=torch.tensor(tokens)).logits.numpy()
    would_choose_pad = False
    for row, choices in zip(tokens[:, 1:].tolist(), np.argmax(own_logits, axis=-1).tolist()):
        decoded = row[:row.index(special.eos)] if special.eos in row else row
        assert special.pad not in decoded
        would_choose_pad |= special.pad in choices[:len(decoded)]
    assert would_choose_pad


def test_the_torch_backend_gives_the_same_logits_and_translation(tmp_path, checkpoint, reference):
    reference_path = str(tmp_path / "reference.npz")
    np.savez(reference_path, **reference)
    env = {**os.environ, "KERAS_BACKEND": "torch",
           "PYTHONPATH": python_path(REPOSITORY)}
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "marian_probe.py"), checkpoint[0],
                           reference_path], capture_output=True, text=True, env=env, timeout=300)
    probe = json_answer(proc)
    assert probe["backend"] == "torch"
    assert probe["max_abs_diff"] <= TOLERANCE
    np.testing.assert_array_equal(comparable(probe["tokens"]), comparable(reference["generated"]))


def test_separate_vocabularies_and_an_untied_output_layer(tmp_path):
    """transformers' other layout: each side its own vocabulary file and embeddings, a separate lm_head, and other
    activation and embedding settings."""
    directory = str(tmp_path / "opus-mt-tiny-separate")
    model, hf_tokenizer = build_checkpoint(directory, separate_vocabs=True, tie_word_embeddings=False,
                                           activation_function="gelu", scale_embedding=False)
    assert os.path.isfile(os.path.join(directory, "target_vocab.json"))
    reference = transformers_outputs(model, hf_tokenizer, SOURCES, TARGETS)
    keras_model, tokenizer = build_loaded_model(directory)
    assert keras_model.lm_head is not None and keras_model.encoder_embedding is not keras_model.decoder_embedding
    assert tokenizer.encode_source(SOURCES) == [ids[:-1] for ids in hf_tokenizer(SOURCES)["input_ids"]]
    logits = keras_model.predict_on_batch((reference["source"], reference["decoder_input"]))
    assert np.max(np.abs(logits - reference["logits"])) <= TOLERANCE
    expected_targets = [ids[:-1] for ids in hf_tokenizer(text_target=TARGETS)["input_ids"]]
    assert tokenizer.encode_target(TARGETS) == expected_targets


def test_pytorch_model_bin_gives_the_same_weights(tmp_path, checkpoint, on_jax):
    from mtbench.plugins.models import marian_checkpoint
    from mtbench.plugins.models.marian import MarianFamily
    directory, model, _ = checkpoint
    torch_copy = copy_with_torch_weights(directory, model, str(tmp_path / "with-bin"))
    MarianFamily().check(torch_copy, run_config())
    from_safetensors = marian_checkpoint.pretrained_weights(directory, on_jax.model)
    from_torch = marian_checkpoint.pretrained_weights(torch_copy, on_jax.model)
    assert sorted(from_torch) == sorted(from_safetensors) == sorted(v.path for v in on_jax.model.weights)
    for path, value in from_safetensors.items():
        np.testing.assert_array_equal(from_torch[path], value, err_msg=path)


def test_weights_that_do_not_fit_the_config_are_refused(checkpoint, on_jax):
    from mtbench.plugins.models import marian_checkpoint
    directory = checkpoint[0]
    state = marian_checkpoint.read_state_dict(directory)
    config = marian_checkpoint.read_config(directory)
    broken = dict(state)
    del broken["model.encoder.layers.1.fc2.weight"]
    broken["model.encoder.layers.7.fc2.weight"] = state["model.encoder.layers.1.fc2.weight"]
    broken["model.decoder.layers.0.fc1.bias"] = np.zeros(3, np.float32)
    with pytest.raises(MtbenchError) as error:
        marian_checkpoint.keras_weights(broken, config, on_jax.model)
    message = str(error.value)
    assert "missing: model.encoder.layers.1.fc2.weight" in message
    assert "unexpected: model.encoder.layers.7.fc2.weight" in message
    assert "model.decoder.layers.0.fc1.bias (3,) (config.json implies (64,))" in message


def run_config(**overrides):
    return TrainConfig(preset="tiny", max_len=overrides.pop("max_len", 32), **overrides)


@pytest.mark.parametrize("missing", ["source.spm", "target.spm", "vocab.json", "config.json", "model.safetensors"])
def test_a_directory_missing_a_file_is_refused_naming_it(tmp_path, checkpoint, missing):
    from mtbench.plugins.models.marian import MarianFamily
    incomplete = str(tmp_path / "incomplete")
    shutil.copytree(checkpoint[0], incomplete)
    os.remove(os.path.join(incomplete, missing))
    with pytest.raises(MtbenchError) as error:
        MarianFamily().check(incomplete, run_config())
    message = str(error.value)
    assert missing in message and incomplete in message and "\n" not in message


def test_check_refuses_a_missing_directory_size_flags_and_too_long_sequences(tmp_path, checkpoint):
    from mtbench.plugins.models.marian import MarianFamily
    family, directory = MarianFamily(), checkpoint[0]
    family.check(directory, run_config(max_len=64))
    with pytest.raises(MtbenchError, match="does not exist"):
        family.check(str(tmp_path / "nowhere"), run_config())
    with pytest.raises(MtbenchError, match="marian:PATH"):
        family.check(None, run_config())
    for flag in ({"layers": 2}, {"d_model": 64}, {"heads": 4}, {"ff_dim": 128}, {"encoder_layers": 1}):
        with pytest.raises(MtbenchError, match="size comes from its config.json"):
            family.check(directory, run_config(**flag))
    with pytest.raises(MtbenchError, match="64 positions"):
        family.check(directory, run_config(max_len=65))


TOKENIZER_SENTENCES = ["The old woman finds the green book in the morning!", ">>spa<< Our teacher brings bread.",
                       "  Spaces   and Zebras ", "", "a </s> inside <unk> text", f"{WORD_WITH_MISSING_PIECE} x"]


def test_token_ids_are_those_of_transformers(checkpoint, on_jax):
    _, _, hf_tokenizer = checkpoint
    tokenizer = on_jax.tokenizer
    source = hf_tokenizer(TOKENIZER_SENTENCES)["input_ids"]
    target = hf_tokenizer(text_target=TOKENIZER_SENTENCES)["input_ids"]
    # transformers appends </s>; mtbench appends it itself.
    assert all(ids[-1] == tokenizer.special.eos for ids in source + target)
    assert tokenizer.encode_source(TOKENIZER_SENTENCES) == [ids[:-1] for ids in source]
    assert tokenizer.encode_target(TOKENIZER_SENTENCES) == [ids[:-1] for ids in target]
    assert hf_tokenizer.unk_token_id in tokenizer.encode_target([TOKENIZER_SENTENCES[-1]])[0]


def test_decoded_text_is_that_of_transformers(checkpoint, on_jax):
    _, _, hf_tokenizer = checkpoint
    tokenizer = on_jax.tokenizer
    special = tokenizer.special
    batches = [ids + [special.eos, special.pad] for ids in tokenizer.encode_target(TOKENIZER_SENTENCES)]
    batches.append([3, 2, hf_tokenizer.unk_token_id, 40, special.eos, 41, special.pad])  # a language code, <unk>
    assert tokenizer.decode(batches) == [hf_tokenizer.decode(ids, skip_special_tokens=True) for ids in batches]
    assert tokenizer.special == type(special)(pad=hf_tokenizer.pad_token_id, eos=hf_tokenizer.eos_token_id,
                                              start=checkpoint[1].config.decoder_start_token_id)


def test_a_saved_model_rebuilds_the_same_tokenizer_and_architecture(tmp_path, checkpoint, on_jax):
    from mtbench.plugins.models.marian import MarianFamily
    family, saved = MarianFamily(), str(tmp_path / "saved")
    on_jax.tokenizer.save(saved)
    record = family.save(checkpoint[0], None, saved)
    assert json.loads(json.dumps(record)) == record
    path, tokenizer = family.load_saved(saved, record)
    assert tokenizer.fingerprint == on_jax.tokenizer.fingerprint and tokenizer.special == on_jax.tokenizer.special
    assert tokenizer.encode_source(SOURCES) == on_jax.tokenizer.encode_source(SOURCES)
    run = SimpleNamespace(config=SimpleNamespace(dropout=None), model_options={})
    model, shape = family.build(run, path, tokenizer, 32)
    assert [(v.path, tuple(v.shape)) for v in model.weights] == \
        [(v.path, tuple(v.shape)) for v in on_jax.model.weights]
    assert (shape.d_model, shape.num_heads, shape.encoder_layers, shape.ff_dim, shape.vocab_size) == \
        (32, 2, 2, 64, checkpoint[1].config.vocab_size)


def test_the_positions_and_activations_are_transformers_own():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from mtbench.keras_models.marian import ACTIVATIONS, MARIAN_DEFAULTS, sinusoidal_positions
    from mtbench.plugins.models.marian_checkpoint import CONFIG_DEFAULTS, SUPPORTED_ACTIVATIONS
    for count, dim in ((64, 32), (10, 7)):
        expected = MarianSinusoidalPositionalEmbedding(count, dim).create_weight().numpy()
        np.testing.assert_array_equal(sinusoidal_positions(count, dim), expected)
    assert set(ACTIVATIONS) == set(SUPPORTED_ACTIVATIONS)
    # Each activation against transformers' own function of that name, on float32 values across its bend.
    import torch
    from transformers import MarianConfig
    from transformers.activations import ACT2FN
    x = np.linspace(-6, 6, 241, dtype=np.float32)
    for name in SUPPORTED_ACTIVATIONS:
        np.testing.assert_allclose(np.asarray(ACTIVATIONS[name](x)), ACT2FN[name](torch.from_numpy(x)).numpy(),
                                   rtol=1e-5, atol=2e-6, err_msg=name)
    # The defaults against MarianConfig's (a decoder vocabulary of None is the shared one, as MarianConfig sets it).
    marian = MarianConfig().to_dict()
    assert marian["decoder_vocab_size"] == marian["vocab_size"] and MARIAN_DEFAULTS["decoder_vocab_size"] is None
    assert {key: marian[key] for key in MARIAN_DEFAULTS if key not in ("decoder_vocab_size", "bad_words_ids")} == \
        {key: value for key, value in MARIAN_DEFAULTS.items() if key not in ("decoder_vocab_size", "bad_words_ids")}
    assert CONFIG_DEFAULTS == {key: marian[key] for key in CONFIG_DEFAULTS}
