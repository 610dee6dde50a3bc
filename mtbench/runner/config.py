"""The configuration of one training run: every knob that can change a figure is here, and all of it is
written beside the figures."""

import dataclasses
import os
import time
from dataclasses import dataclass, field

from mtbench.errors import MtbenchError
from mtbench.keras_models.presets import PRESETS

DEFAULT_STEPS = {"tiny": 40, "small": 450, "base": 2000}
DTYPES = ("float32", "bfloat16", "float16", "mixed_bfloat16", "mixed_float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mtbench")


@dataclass
class TrainConfig:
    backend: str = "jax"
    extras: tuple = ()
    dataset: str = "bible-en-fr"
    data_file: str = None          # a TSV file (source TAB target) used instead of a registered dataset
    preset: str = "small"
    steps: int = None              # default: DEFAULT_STEPS of the preset, unless epochs is given
    epochs: float = None
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    max_pairs: int = None          # keep only the first N pairs of the corpus (before the split)
    valid_size: int = 500
    test_size: int = 500
    vocab_size: int = None         # default: the preset's
    max_len: int = None            # tokens per side, special tokens included; default: the preset's
    dtype: str = "float32"
    compile_mode: str = "default"  # torch.compile's mode, for the torch-compile extra
    seed: int = 0
    initial_weights: str = None    # a weights file (.npz by variable path) instead of the numpy draw from seed
    log_every: int = 10
    decode_batch_size: int = 128
    cache_dir: str = field(default_factory=default_cache_dir)
    out: str = None                # result JSON; default mtbench-results/<time>-<backend>.json
    overwrite: bool = False

    def __post_init__(self):
        self.extras = tuple(self.extras)
        if self.preset not in PRESETS:
            raise MtbenchError(f"unknown preset '{self.preset}'; choose one of {', '.join(PRESETS)}")
        model = PRESETS[self.preset]
        if self.vocab_size is None:
            self.vocab_size = model.vocab_size
        if self.max_len is None:
            self.max_len = model.max_len
        if self.steps is None and self.epochs is None:
            self.steps = DEFAULT_STEPS[self.preset]
        if self.steps is not None and self.epochs is not None:
            raise MtbenchError("give --steps or --epochs, not both")
        if self.dtype not in DTYPES:
            raise MtbenchError(f"unknown dtype '{self.dtype}'; choose one of {', '.join(DTYPES)}")
        if self.compile_mode not in COMPILE_MODES:
            raise MtbenchError(f"unknown compile mode '{self.compile_mode}'; choose one of {', '.join(COMPILE_MODES)}")
        for name in ("batch_size", "steps", "valid_size", "test_size", "vocab_size", "max_len", "log_every",
                     "decode_batch_size", "max_pairs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise MtbenchError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.epochs is not None and self.epochs <= 0:
            raise MtbenchError(f"--epochs must be positive, got {self.epochs}")
        if self.learning_rate <= 0:
            raise MtbenchError(f"--learning-rate must be positive, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise MtbenchError(f"--warmup-steps must not be negative, got {self.warmup_steps}")
        if self.vocab_size < 16:
            raise MtbenchError(f"--vocab-size must be at least 16, got {self.vocab_size}")
        if self.max_len < 8:
            raise MtbenchError(f"--max-len must be at least 8, got {self.max_len}")
        if self.out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.out = os.path.join("mtbench-results", f"{stamp}-{self.backend}.json")

    @property
    def model(self):
        """The model shape: the preset with this run's vocabulary and length."""
        return dataclasses.replace(PRESETS[self.preset], vocab_size=self.vocab_size, max_len=self.max_len)

    @property
    def corpus_name(self):
        return os.path.basename(self.data_file) if self.data_file else self.dataset

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["extras"] = list(self.extras)
        data["model"] = self.model.to_dict()
        return data
