"""Using a trained model: `mtbench translate` (sentences in, translations out), `mtbench evaluate` (BLEU and
chrF on another test set) and `mtbench generate` (a language model's text from a prompt), on any backend, whichever
backend trained it: the saved weights are numpy arrays by Keras variable path, so they load wherever the model
builds."""

import dataclasses
import os
import time
from dataclasses import dataclass

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.plugins.api import ModelFamily, RunContext
from mtbench.plugins.manager import A_DICT
from mtbench.runner.choices import dtype_refusal
from mtbench.runner.config import TrainConfig, decoding_name
from mtbench.runner.evaluation.sampling import (continuation, continued_text, drawable_ids, numpy_logits,
                                                 unknown_id, unknown_prompt_tokens)
from mtbench.runner.saved_model import ModelSource, find_model, load_weights, model_files
from mtbench.runner.setup import (import_keras, resolve_backend, resolve_model, RunPlugins, set_matmul_precision,
                                  starting_weights)


@dataclass
class Translator:
    """A trained model ready to translate, and how it decodes."""
    tokenizer: object
    decode: object
    config: object
    backend: str
    source_label: str
    decoding: str
    truncated: int = 0   # input sentences cut to the model's --max-len

    def translate(self, sentences, batch_size, progress=None):
        """Translations of `sentences`, in order; an empty line translates to an empty line."""
        from mtbench.runner.evaluation.decoding import translate
        special, max_len = self.tokenizer.special, self.config.max_len
        wanted = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        encoded = self.tokenizer.encode_source(sentences[i] for i in wanted)
        sources = []
        for ids in encoded:
            if len(ids) + 1 > max_len:  # the model was trained on, and has positions for, max_len tokens
                self.truncated += 1
                ids = ids[:max_len - 1]
            sources.append(ids + [special.eos])
        ids = translate(self.decode, sources, batch_size, max_len, special, progress)
        translations = [""] * len(sentences)
        for i, text in zip(wanted, self.tokenizer.decode(ids)):
            translations[i] = text
        return translations


@dataclass
class LocatedModel:
    """A model found on disk and the plugins that rebuild it, before any framework is imported."""
    source: object       # saved_model.ModelSource, its configuration in the command's dtype policy where given
    backend: object
    family: object       # the ModelFamily
    family_path: object  # its --model path (a checkpoint's NAME:DIR), else None
    dtype_given: bool    # the command gave --dtype: checked for the device once the backend is imported


@dataclass
class LoadedModel:
    """A trained model rebuilt on a backend, with its tokenizer."""
    source: object      # saved_model.ModelSource
    plugins: object     # setup.RunPlugins: the backend, the model family and its task
    model: object
    tokenizer: object
    keras: object


def model_task(path, registry):
    """The task of the model at `path` (its family's), known without building it."""
    pretrained = pretrained_source(path, registry)
    if pretrained is not None:  # its options, as --block-size, are checked as it opens
        return registry.models[path.partition(":")[0]].task
    return _family(find_model(path), registry)[0].task


def with_trained_languages(path, registry, options):
    """`options` (a ReadOptions) with the languages the translation model at `path` translates between, where
    its run knew them (its --src-lang/--tgt-lang, or its dataset's): a test set that names its languages (JSONL
    keys, sacrebleu's pair) is read in the model's direction. Languages given against it are refused: scored the
    other way round, the BLEU would be of a direction the model never learned."""
    trained = None
    if pretrained_source(path, registry) is None:
        config = find_model(path).config
        trained = (config.src_lang, config.tgt_lang) if config.src_lang and config.tgt_lang else None
        if trained is None and not config.data_file:
            dataset = registry.datasets.get(config.dataset)
            trained = (dataset.source_lang, dataset.target_lang) if dataset and dataset.source_lang else None
    if trained is None:
        return options
    if options.languages is None:
        return dataclasses.replace(options, src_lang=trained[0], tgt_lang=trained[1])
    if tuple(options.languages) != trained:
        raise MtbenchError(f"--src-lang {options.src_lang} --tgt-lang {options.tgt_lang}: the model translates "
                           f"{trained[0]} -> {trained[1]}")
    return options


def pretrained_family(path, registry):
    """The model family of `NAME:DIR`, the checkpoint of a pretrained model family as it was published (refused
    for a family that publishes none); None where `path` names something on disk or no model family."""
    name, colon, directory = path.partition(":")
    if not colon or not directory or os.path.exists(path):
        return None
    if name not in registry.models:
        if name.isidentifier() or "-" in name and name.replace("-", "_").isidentifier():  # no file, a family's name
            readers = ", ".join(sorted(n for n, family in registry.models.items() if family.pretrained))
            raise MtbenchError(f"{path}: no such file or directory, nor a pretrained checkpoint: no model family "
                               f"'{name}' (those that read one: {readers or 'none installed'})")
        return None
    family = registry.models[name]
    if not family.pretrained or type(family).tokenizer is ModelFamily.tokenizer:
        raise MtbenchError(f"{path}: --model {name} is no pretrained model family with its own tokenizer; give a "
                           f"trained model (a result, run directory, saved model or checkpoint) or a pretrained "
                           f"checkpoint as NAME:DIR")
    return family


def pretrained_source(path, registry, block_size=None):
    """The `ModelSource` of `NAME:DIR` (`pretrained_family`; no weights file: the family reads them), built with its
    window of `block_size` tokens (default: the checkpoint's own context, `config.checkpoint_block_size`, as a run
    of it trains in, else the preset's); None where `path` names no such checkpoint."""
    if pretrained_family(path, registry) is None:
        return None
    config = TrainConfig(model_name=path, block_size=block_size)
    return ModelSource(config, None, label=f"checkpoint {path} (pretrained)")


def _refuse_another_task(label, family, task):
    if task is not None and family.task != task:
        raise MtbenchError(f"{label}: a model of the {family.task} task ('{family.name}'); this command serves "
                           f"{task} models")


def located_model(path, registry, backend_name=None, task=None, block_size=None, dtype=None):
    """The `LocatedModel` at `path` (see `saved_model.find_model`,
    or a pretrained checkpoint `NAME:DIR` with its window of `block_size` tokens), in the dtype policy `dtype` where
    given, on `backend_name` (default: the backend that trained it, JAX for a checkpoint); refused for another
    task's model than `task`'s (the command's). Nothing here imports a framework."""
    pretrained = pretrained_family(path, registry)
    if pretrained is not None:  # a checkpoint NAME:DIR, by its task before its own options
        _refuse_another_task(path, pretrained, task)
    source = pretrained_source(path, registry, block_size) or find_model(path)
    if block_size is not None and source.weights is not None:
        raise MtbenchError(f"--block-size sizes a pretrained checkpoint's window (NAME:DIR); {source.label} keeps "
                           f"its run's, {source.config.max_len} tokens")
    if dtype is not None:
        source = dataclasses.replace(source, config=dataclasses.replace(source.config, dtype=dtype))
    backend = resolve_backend(source.config.backend if backend_name is None else backend_name, registry)
    family, family_path = _family(source, registry)
    _refuse_another_task(source.label, family, task)
    return LocatedModel(source, backend, family, family_path, dtype is not None)


def open_model(path, registry, backend_name=None, task=None, block_size=None, dtype=None):
    """The model at `path` (`located_model`) rebuilt on `backend_name` (default: the backend that trained it, JAX
    for a checkpoint) with its weights, in the dtype policy `dtype` (default: the run's, float32 for a checkpoint);
    `task`: the task the command serves, refused for another's model."""
    return rebuilt_model(located_model(path, registry, backend_name, task, block_size, dtype), registry)


def rebuilt_model(located, registry):
    """The `LoadedModel` of what `located_model` found: keras imported on its backend, the model built and its
    weights loaded; the dtype policy the command gave, if it gave one, checked for the device."""
    source, backend, family = located.source, located.backend, located.family
    config = source.config
    plugins = RunPlugins(backend, [], [], registry, family, located.family_path,
                         registry.lookup("tasks", family.task))
    keras = import_keras(config, backend, registry=registry)
    # The run's persistent compilation cache: decoding and scoring the model again compile nothing already kept.
    backend.open_compile_cache(config)
    device = registry.answer("backends", backend, "device_info", expect=A_DICT)
    refused = dtype_refusal(backend, config.dtype, device, registry) if located.dtype_given else None
    if refused:
        raise MtbenchError(refused)
    # The float32 matmuls as the run trained them: a GPU's JAX default (TF32) would decode differently.
    set_matmul_precision(backend, config.matmul_precision)
    keras.config.set_dtype_policy(config.dtype)
    plugins.model_path, tokenizer = model_files(source, plugins)
    run = RunContext(config=config, backend=backend, device=device)
    with plugins.model_code():
        model, _ = family.build(run, plugins.model_path, tokenizer, config.max_len)
    if source.weights is None:
        starting_weights(config, plugins, model, None)
    else:
        load_weights(source, keras, model, config)
    return LoadedModel(source, plugins, model, tokenizer, keras)


def decoding_refusal(config, beam, length_penalty):
    """Why decoding the model of `config` with `beam` hypotheses (None: as its run did) and `length_penalty` is
    refused, or None."""
    beam_given, beam = beam is not None, config.beam if beam is None else beam
    if beam > config.vocab_size:  # its hypotheses would be tokens the model has not (and XLA's memory, exhausted)
        return (f"--beam {beam} is more hypotheses than the model's {config.vocab_size:,} tokens; give at most "
                f"{config.vocab_size:,}")
    if beam == 1 and length_penalty is not None:  # as train refuses it: asked for, and nothing would use it
        return (f"--length-penalty {length_penalty:g} weighs beam search's hypotheses by length; greedy decoding "
                f"({'--beam 1' if beam_given else 'the run decoded with --beam 1'}) has none to weigh: give --beam N")
    return None


def open_translator(path, registry, backend_name=None, beam=None, length_penalty=None, dtype=None):
    """The Translator of the model at `path` on `backend_name` (default: the backend that trained it), decoding
    as the run did unless `beam`/`length_penalty` (or `dtype`, the dtype policy) say otherwise. Decoding options
    the model cannot take are refused before it is built."""
    located = located_model(path, registry, backend_name, task="translation", dtype=dtype)
    config = located.source.config
    refused = decoding_refusal(config, beam, length_penalty)
    if refused:
        raise MtbenchError(refused)
    loaded = rebuilt_model(located, registry)
    source, backend, model, tokenizer = loaded.source, loaded.plugins.backend, loaded.model, loaded.tokenizer
    beam = config.beam if beam is None else beam
    length_penalty = config.length_penalty if length_penalty is None else length_penalty
    from mtbench.runner.evaluation.decoding import make_decoder
    decode = backend.compile_inference(make_decoder(model, tokenizer.special, beam, length_penalty), model)
    return Translator(tokenizer, decode, config, backend.name, source.label, decoding_name(beam, length_penalty))


def _family(source, registry):
    """(the model family of `source`, its --model path)."""
    if source.is_checkpoint:
        return resolve_model(source.config, registry)
    return registry.lookup("models", source.description["family"]), None


def evaluate_translator(translator, pairs, batch_size, progress=None, target_lang=None):
    """BLEU and chrF (sacrebleu, with signatures) of the translations of `pairs`' sources against their targets,
    in `target_lang` where it is known."""
    from mtbench.runner.evaluation.scoring import bleu_tokenizer_note, score
    started = time.perf_counter()
    hypotheses = translator.translate([source for source, _ in pairs], batch_size, progress)
    translate_s = time.perf_counter() - started
    references = [target for _, target in pairs]
    bleu, chrf, bleu_signature, chrf_signature = score(hypotheses, references, target_lang)
    return {
        "model": translator.source_label, "backend": translator.backend, "dtype": translator.config.dtype,
        "decoding": translator.decoding, "sentences": len(pairs), "sources_truncated": translator.truncated, "max_len": translator.config.max_len,
        "bleu": bleu, "chrf": chrf, "bleu_signature": bleu_signature, "chrf_signature": chrf_signature,
        "bleu_note": bleu_tokenizer_note(target_lang, references), "translate_s": translate_s,
    }, hypotheses


def generate_text(path, registry, prompt, backend_name=None, max_new_tokens=200, temperature=1.0, top_k=None,
                  seed=0, block_size=None, dtype=None):
    """(the prompt's continuation, what generated it) by the language model at `path` on `backend_name`: one
    token at a time from the model's logits at the last position of the last --block-size tokens, greedily
    (`temperature` 0) or sampled from the softmax of logits / `temperature`, restricted to the `top_k` most
    likely tokens, with numpy's generator from `seed` (the same text on every backend, up to the arithmetic)."""
    loaded = open_model(path, registry, backend_name, task="language-modelling", block_size=block_size, dtype=dtype)
    ids = list(loaded.tokenizer.encode_text(prompt))
    if not ids:
        raise MtbenchError("--prompt is empty: give the text to continue")
    # What of the prompt the model cannot read (a character tokenizer's <unk>): it continues something else.
    unknown = unknown_prompt_tokens(loaded.tokenizer, prompt)
    block = loaded.source.config.max_len
    model = loaded.model
    forward = numpy_logits(model, lambda fn: loaded.plugins.backend.compile_inference(fn, model))
    started = time.perf_counter()
    generated = continuation(forward, ids, block, max_new_tokens, temperature, top_k, np.random.default_rng(seed),
                             drawable_ids(loaded.tokenizer), unknown_id(loaded.tokenizer))
    seconds = time.perf_counter() - started
    return continued_text(loaded.tokenizer, ids, generated), {
        "model": loaded.source.label, "backend": loaded.plugins.backend.name,
        "dtype": loaded.source.config.dtype, "prompt_tokens": len(ids), "prompt_unknown_tokens": int(unknown),
        "new_tokens": len(generated), "seconds": seconds,
        "sampling": "greedy" if temperature == 0 else f"temperature {temperature:g}"
                    + (f", top-k {top_k}" if top_k else "") + f", seed {seed}"}


def score_text(path, registry, text_path, backend_name=None, rows=64, stride=None, block_size=None, dtype=None):
    """The language model at `path` scored on `text_path` (a file, or a folder's .txt files, as `train --data`
    reads them, or the val.bin of a folder of nanoGPT's token files) on `backend_name`: every token of the text
    predicted once, in windows of the model's --block-size from its start `stride` tokens apart (default: the run's
    --eval-stride), `rows` to a batch, with the loss and accuracy its run was scored by."""
    from mtbench.runner.data.token_files import TOKEN_FILES, is_token_folder, named_token_file
    from mtbench.runner.setup import compile_model
    from mtbench.runner.tasks.language_modelling import stream_scores
    if named_token_file(text_path):  # the folder's val.bin, named: scored as the folder's is
        folder = os.path.dirname(os.path.abspath(text_path))
        if os.path.basename(text_path) != TOKEN_FILES["val"] or not is_token_folder(folder):
            raise MtbenchError(f"{text_path}: one of nanoGPT's token files; a model is scored on the "
                               f"{TOKEN_FILES['val']} of their folder: give the folder or its {TOKEN_FILES['val']}")
        text_path = folder
    loaded = open_model(path, registry, backend_name, task="language-modelling", block_size=block_size, dtype=dtype)
    stream, text = (token_folder_stream if is_token_folder(text_path) else text_stream)(loaded, text_path)
    if len(stream) < 2:
        raise MtbenchError(f"{text_path}: {len(stream)} token of this model's tokenizer; scoring needs two (the "
                           f"first predicts the second)")
    config = loaded.source.config
    stride = stride if stride is not None else config.eval_stride or config.max_len
    if not 1 <= stride <= config.max_len:
        raise MtbenchError(f"--eval-stride must be from 1 to the model's --block-size {config.max_len}, got {stride}")
    # No more rows than the text has windows (--batch-size 100000000000000000000 failed in numpy's allocation).
    rows = min(rows, len(stream) // stride + 1)
    compile_model(loaded.keras, loaded.model, config, 1, {}, loaded.plugins.model)
    started = time.perf_counter()
    # A budget of every byte the text has (of every token, where its bytes are not known): all of it is scored.
    scores = stream_scores(loaded.model, stream, rows, config.max_len, text["bytes"] or len(stream), stride)
    return {"model": loaded.source.label, "backend": loaded.plugins.backend.name, "dtype": config.dtype,
            "text": text_path, **text,
            "tokens": len(stream), "unknown_characters": stream.unknown, "block_size": config.max_len,
            "stride": stride, **scores, "seconds": time.perf_counter() - started}


def text_stream(loaded, text_path):
    """(the model's `TokenStream` of a text, {origin, bytes})."""
    from mtbench.runner.data.text import read_text_path, token_stream
    if not hasattr(loaded.tokenizer, "stream"):
        raise MtbenchError(f"{loaded.source.label}: trained on token files, whose ids no tokenizer here makes from "
                           f"text; it scores the val.bin of a folder of token files, not a text")
    from mtbench.runner.data.text import NotUtf8
    text = read_text_path(text_path)
    try:
        stream, _ = token_stream(loaded.tokenizer, text.data, None)
    except NotUtf8 as error:  # its advice is train's (--tokenizer byte): this model's tokenizer is chosen
        raise MtbenchError(f"{text_path}: not UTF-8 at byte {error.position} ({error.reason}), which "
                           f"{loaded.source.label}'s tokenizer reads; a model trained at the byte level scores any "
                           f"bytes") from None
    return stream, {"origin": text.origin, "bytes": len(text.data)}


def token_folder_stream(loaded, folder):
    """(the `TokenStream` of a token folder's val.bin, {origin, bytes}: None where the model's tokenizer does not
    know each id's bytes) for a model that reads token files: one trained on them, or one whose family brings the
    tokenizer that made them (GPT-2's)."""
    from mtbench.runner.data.token_files import TokenIds, held_out_ids
    family = loaded.plugins.model
    reads_ids = isinstance(loaded.tokenizer, TokenIds) or type(family).tokenizer is not ModelFamily.tokenizer
    if not reads_ids:
        raise MtbenchError(f"{loaded.source.label}: trained on text with its {loaded.tokenizer.describe()['type']} "
                           f"tokenizer; {folder} holds token files, ids another tokenizer made")
    stream, total_bytes = held_out_ids(folder, loaded.tokenizer, loaded.source.label)
    return stream, {"origin": f"val.bin of the token files in {folder}", "bytes": total_bytes}
