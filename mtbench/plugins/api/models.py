"""Model families: what `--model NAME[:PATH]` names. A family builds the Keras model a run trains and, when the
model comes with its own vocabulary (a pretrained checkpoint), the tokenizer that goes with it.

The Keras model a family builds answers what training and decoding call:
- `model((source_ids, target_input_ids))` -> float32 logits (batch, length, vocab);
- `model.encode(source_ids)` -> (memory, source mask); `model.decode(target_input_ids, memory, source_mask)`
  -> logits;
- `model.start_decoding(memory, length)` -> (cross, caches) and `model.decode_step(token_ids (batch, 1),
  position, caches, cross, source_mask)` -> (logits (batch, vocab), caches): incremental decoding with a
  key/value cache;
- `model.pad_id`: the id its source mask treats as padding.
A language model (a family of the 'language-modelling' task) is called on `(input_ids,)` and returns the logits of
the next token at every position; the tokenizer it brings turns text into a `TokenStream`.
"""

from dataclasses import dataclass

# The size of a built model, for FLOP counts and the result: the fields of mtbench's presets (d_model, num_heads,
# encoder_layers, decoder_layers, ff_dim, vocab_size, max_len, dropout).
from mtbench.keras_models.presets import ModelPreset as ModelShape  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class SpecialTokens:
    """The ids batching and decoding need: padding, end of sentence, and the id a target starts with (BOS, or
    the decoder-start id of a pretrained model)."""
    pad: int
    eos: int
    start: int

    def to_dict(self):
        return {"pad": self.pad, "eos": self.eos, "start": self.start}


@dataclass
class TokenStream:
    """A split as tokens, and the bytes of text each token stands for. Both in the narrowest unsigned integers that
    hold them (the bytes of a byte stream a view of the text, its sizes one broadcast 1): a byte model of enwik9
    held 12 bytes a byte of text in int32 ids and float64 sizes."""
    ids: object              # numpy unsigned integers (or int32)
    token_bytes: object      # numpy, one per token; they sum to the split's bytes. None: not known (token files)
    unknown: int = 0         # characters the tokenizer had no id for (a character tokenizer's <unk>)

    def __len__(self):
        return len(self.ids)


class Tokenizer:
    """Text to ids and back. Sources and targets may use different sentencepiece models (MarianMT does); ids
    come without special tokens: mtbench appends EOS and prepends the start id.

    A language model's tokenizer (plugin API 1.14) answers instead `stream(data)`: the `TokenStream` of `data`
    (bytes of UTF-8 text); `encode_text(text)`: [id, ...]; `decode_text(ids)`: the text, a replacement character
    for what no text stands behind; and may have `stream_key`, a text that changes whenever the ids of some text
    would, under which a split's stream is kept in the cache (for a tokenizer that takes a while); and (1.15)
    `bytes_per_id()`: numpy integers, one per id, the bytes of text each stands for, which gives a run on token
    files (ids alone) bits per byte."""
    special: SpecialTokens = None
    vocab_size = 0
    fingerprint = ""  # changes whenever the ids of some text would change (keys caches, guards --resume)

    def encode_source(self, sentences):
        """[[id, ...], ...] of source sentences."""
        raise NotImplementedError

    def encode_target(self, sentences):
        raise NotImplementedError

    def decode(self, ids_batch):
        """Target sentences of id lists (special ids may be present and are dropped)."""
        raise NotImplementedError

    def describe(self):
        """What the result JSON records of the tokenizer."""
        return {"type": type(self).__name__, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint,
                "special": self.special.to_dict()}

    def save(self, directory):
        """Writes what `ModelFamily.load_saved` needs to rebuild this tokenizer into `directory`."""
        raise NotImplementedError


class ModelFamily:
    """A kind of model mtbench can train. `--model NAME` (or `NAME:PATH` for a family with `takes_path`) picks
    one. Called in this order: `check` (before any framework is imported), `shape` and `tokenizer`, then in the
    training process `build`, `pretrained_weights`, `training_flops` (per batch shape) and, once a run completed,
    `save`; `load_saved` by `translate` and `evaluate`."""
    name = ""
    description = ""
    takes_path = False   # whether the family needs `:PATH` (a checkpoint directory)
    pretrained = False   # whether `pretrained_weights` gives trained weights: a fresh run then scores them first
    # The kinds of attention the model runs through `keras.ops.dot_product_attention` with the `flash_attention`
    # and `flash_attention_masked` options of `run.model_options`: 'causal' (the decoder's self-attention),
    # 'masked' (attention over padded keys) and 'decoding' (incremental decoding). The result's `model.attention`
    # names what each ran; () (the default): the model has none that mtbench holds to a kernel, and none is named.
    attention_kinds = ()
    # Whether the model drops attention probabilities at the run's dropout (`config.model.dropout`) while it
    # trains, as nanoGPT's and GPT-2's do (plugin API 1.16). The fused kernels Keras calls drop none, so such a
    # run with dropout above 0 attends unfused (`RunContext.attention_dropout`).
    attention_dropout = False
    # Whether `build` takes `run.model_options["remat"]` (True: each Transformer block recomputes its activations in
    # the backward pass, `keras.remat`, and has a `remat` attribute that says so), which `--extra remat` sets
    # (plugin API 1.17). Since 1.18 it may instead be a function that makes a function recompute (`--remat-policy
    # matmuls`: all but its matrix products), which the blocks call in place of `keras.remat` and hold as `remat`.
    recomputes_blocks = False
    # The task the model is trained on and scored by (`mtbench.Task`, registered by name): 'translation' (an
    # encoder-decoder, the model protocol above) or 'language-modelling' (a decoder-only model called on
    # `(input_ids,)`, returning logits for the next token at every position).
    task = "translation"
    # {name: `ModelShape`}: the sizes --preset chooses from for this family (plugin API 1.15; the run's config
    # gives the chosen one, with the size flags, vocabulary and block over it, as `config.model`). None (the
    # default): its task's, the translation Transformer's (tiny, small, base) or the language model's (tiny,
    # small, char, gpt2-small).
    presets = None
    # {preset name: steps} of a run that gives neither --steps nor --epochs (1.15). None, or a preset it leaves
    # out: the task's for that name, else the task's "small".
    default_steps = None

    def check(self, path, config):
        """Raises `MtbenchError` with one line when `path` (None for a family without one) or `config` cannot
        serve (a missing file, a size flag the family does not take)."""

    def optimizer_recipe(self, config):
        """The family's AdamW recipe over mtbench's (the translation Transformer's): any of `beta_1`, `beta_2`,
        `epsilon`, `weight_decay`, `decay` ('all' or 'matrices': weights of 2 or more dimensions), `min_lr_ratio`
        (the cosine floor's share of the peak), `clip` ('per-variable', 'global', 'none') and `clip_norm`, as it
        depends on `config` (its preset). The user's options win over it. {} (the default): mtbench's."""
        return {}

    def initialization(self, config):
        """The scheme its fresh models are drawn with where --init is not given: one of
        `mtbench.keras_models.initialization.INIT_SCHEMES` ('glorot', the default; 'gpt2', 'torch', 'flax'), as it
        depends on `config`. Not asked of a family whose `pretrained_weights` gives the weights. Plugin API 1.13."""
        return "glorot"

    def tokenizer(self, path, config):
        """The family's own `Tokenizer`, or None to train mtbench's joint sentencepiece model on the corpus."""
        return None

    def default_block_size(self, path):
        """The block (positions) a run fine-tunes the checkpoint at `path` in, and `evaluate` and `generate` read it
        in, where neither --block-size nor --max-len is given: a pretrained language model's own context (GPT-2's
        1,024). None (the default): the preset's. Called before any framework is imported. Plugin API 1.31."""
        return None

    def shape(self, path, config):
        """The `ModelShape` the model will have (its vocabulary as far as known before the tokenizer exists), for
        extras to check before the model is built (`RunContext.model_shape`); None (the default) where it is not
        known before `build`."""
        return None

    def build(self, run, path, tokenizer, max_len):
        """(keras model with its variables created, `ModelShape`) for `tokenizer`'s vocabulary and sequences of
        up to `max_len` tokens. `run.model_options` holds what extras asked for (`flash_attention`)."""
        raise NotImplementedError(f"model family '{self.name}' ({type(self).__name__}) does not implement "
                                  f"build(run, path, tokenizer, max_len), which every run calls")

    def training_flops(self, model_shape, rows, source_length, target_length):
        """FLOPs of one training step (forward and backward) over a padded batch of `rows` sources of
        `source_length` tokens and targets of `target_length`, of the model `build` returned with `model_shape`:
        the numerator of MFU. None (the default): not counted, and the result's MFU is n/a, saying why."""
        return None

    def pretrained_weights(self, path, model):
        """{variable path: numpy array} for every variable of `model`, or None to start from mtbench's seeded
        draw."""
        return None

    def save(self, path, model_shape, directory):
        """Writes what `load_saved` needs besides the weights and the tokenizer (a checkpoint's config) into
        `directory`; returns a JSON-able dict kept in the saved model's description."""
        return {}

    def load_saved(self, directory, description):
        """(path, tokenizer) to rebuild a model that `save` and `Tokenizer.save` wrote into `directory`:
        `build(run, path, tokenizer, max_len)` then gives the same architecture."""
        raise NotImplementedError(f"model family '{self.name}' ({type(self).__name__}) does not implement "
                                  f"load_saved(directory, description), which translate and evaluate call for a "
                                  f"saved model")
