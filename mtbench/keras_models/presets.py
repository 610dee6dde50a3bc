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

    def to_dict(self):
        return asdict(self)


PRESETS = {
    # For tests: trains in seconds and still learns something.
    "tiny": ModelPreset(d_model=64, num_heads=2, encoder_layers=1, decoder_layers=1, ff_dim=128,
                        vocab_size=1000, max_len=32),
    # The CPU default: sized so a full run (data, training, evaluation) stays within minutes on 2 cores.
    "small": ModelPreset(d_model=256, num_heads=4, encoder_layers=3, decoder_layers=3, ff_dim=1024,
                         vocab_size=8000, max_len=48),
    # Vaswani et al. (2017), "base".
    "base": ModelPreset(d_model=512, num_heads=8, encoder_layers=6, decoder_layers=6, ff_dim=2048,
                        vocab_size=32000, max_len=128, dropout=0.1),
}
