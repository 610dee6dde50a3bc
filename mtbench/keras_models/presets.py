"""Model sizes. Kept free of keras so the CLI can list and validate them before a backend is chosen."""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelPreset:
    d_model: int
    num_heads: int
    encoder_layers: int
    decoder_layers: int
    ff_dim: int
    vocab_size: int
    max_len: int
    dropout: float = 0.0
    # A byte-level language model's embedding rows: the 256 bytes, or more rows that no byte uses so that the
    # output layer does the work of a larger vocabulary's (nanoGPT pads GPT-2's 50,257 to 50,304 likewise).
    byte_vocab_size: int = 256

    def to_dict(self):
        return asdict(self)


PRESETS = {
    # For tests: trains in seconds and still learns something.
    "tiny": ModelPreset(d_model=64, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=128,
                        vocab_size=1000, max_len=32),
    # The CPU default: sized so a full run (data, training, evaluation) stays within minutes on 2 cores.
    "small": ModelPreset(d_model=256, num_heads=4, encoder_layers=3, decoder_layers=3, ff_dim=1024,
                         vocab_size=8000, max_len=48),
    # Vaswani et al. (2017), "base": its size; its recipe's label smoothing (0.1) is not applied (the loss is plain
    # cross-entropy, whose exponent is the perplexity reported), so its BLEU is not the paper's recipe's.
    "base": ModelPreset(d_model=512, num_heads=8, encoder_layers=6, decoder_layers=6, ff_dim=2048,
                        vocab_size=32000, max_len=128, dropout=0.1),
}

# The decoder-only language model (`--model gpt`): `decoder_layers` blocks, no encoder, `max_len` the block size.
# Its vocabulary is the tokenizer's (bytes: 256); `vocab_size` is what a sentencepiece tokenizer is trained to.
GPT_PRESETS = {
    # For tests.
    "tiny": ModelPreset(d_model=64, num_heads=2, encoder_layers=0, decoder_layers=2, ff_dim=256,
                        vocab_size=2000, max_len=64),
    # The CPU default: minutes on 2 cores.
    "small": ModelPreset(d_model=256, num_heads=4, encoder_layers=0, decoder_layers=4, ff_dim=1024,
                         vocab_size=8000, max_len=128),
    # nanoGPT's Shakespeare-character model (config/train_shakespeare_char.py).
    "char": ModelPreset(d_model=384, num_heads=6, encoder_layers=0, decoder_layers=6, ff_dim=1536,
                        vocab_size=8000, max_len=256, dropout=0.2),
    # GPT-2 small (124 M parameters with GPT-2's 50,304-entry padded vocabulary), for GPUs. At the byte level its
    # embedding keeps GPT-2's 50,304 rows (bytes use the first 256), so that a step does GPT-2 small's work.
    "gpt2-small": ModelPreset(d_model=768, num_heads=12, encoder_layers=0, decoder_layers=12, ff_dim=3072,
                              vocab_size=50304, max_len=1024, byte_vocab_size=50304),
}
# The built-in families' presets (a plugin's family brings its own, or takes its task's: `runner.config`). A
# pretrained GPT-2 (`--model gpt2:DIR`) takes the GPT presets' block, steps and dropout; its size is its checkpoint's.
PRESETS_BY_FAMILY = {"transformer": PRESETS, "marian": PRESETS, "gpt": GPT_PRESETS, "gpt2": GPT_PRESETS}


def presets_for(family):
    """A built-in family's presets (the translation presets for any other name)."""
    return PRESETS_BY_FAMILY.get(family, PRESETS)
