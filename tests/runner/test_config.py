"""The run's configuration: model size from flags over the preset, impossible shapes refused before anything is
built, and the trackers and price a run is given."""

import pytest

from conftest import run_cli
from mtbench.errors import MtbenchError
from mtbench.keras_models.presets import PRESETS
from mtbench.runner import config as config_module
from mtbench.runner.config import TrainConfig


def test_size_flags_override_the_preset_and_layers_sets_both_stacks():
    config = TrainConfig(preset="tiny", layers=3, d_model=96, heads=4, ff_dim=200, dropout=0.1)
    model = config.model
    assert (model.encoder_layers, model.decoder_layers, model.d_model, model.num_heads, model.ff_dim,
            model.dropout) == (3, 3, 96, 4, 200, 0.1)
    assert model.vocab_size == PRESETS["tiny"].vocab_size  # what no flag sets stays the preset's
    only_decoder = TrainConfig(preset="small", decoder_layers=1).model
    assert (only_decoder.encoder_layers, only_decoder.decoder_layers) == (PRESETS["small"].encoder_layers, 1)
    recorded = TrainConfig(preset="tiny", d_model=96, heads=4).to_dict()
    assert recorded["d_model"] == 96 and recorded["model"]["d_model"] == 96 and recorded["model"]["num_heads"] == 4
    assert TrainConfig.from_dict(recorded).model == TrainConfig(preset="tiny", d_model=96, heads=4).model


def test_the_feed_forward_keeps_the_presets_width_per_model_dimension_unless_given():
    """nanoGPT's `n_embd` sets its MLP's width (4x): `--d-model 64` on `char` kept the preset's 1,536 units (24x),
    and a run labelled as nanoGPT's 64-wide model trained another."""
    def shape(**flags):
        model = TrainConfig(**flags).model
        return model.d_model, model.ff_dim

    assert shape(model_name="gpt", preset="char", d_model=64, heads=4) == (64, 256)
    assert shape(model_name="gpt", preset="char") == (384, 1536)
    assert shape(model_name="gpt", preset="char", d_model=64, heads=4, ff_dim=100) == (64, 100)
    assert shape(preset="tiny", d_model=96, heads=4) == (96, 192)  # the translation preset's 2x
    assert TrainConfig(preset="tiny", d_model=96, heads=4).to_dict()["ff_dim"] is None  # recorded as given


@pytest.mark.parametrize("flags, message", [
    ({"d_model": 100, "heads": 3}, "--d-model 100 is not divisible by --heads 3"),
    ({"heads": 3}, "--d-model 64 is not divisible by --heads 3"),  # the preset's d_model
    ({"layers": 0}, "--layers must be at least 1, got 0"),
    ({"ff_dim": -4}, "--ff-dim must be at least 1, got -4"),
    ({"d_model": 0}, "--d-model must be at least 1, got 0"),
    ({"dropout": 1.0}, "--dropout must be in [0, 1), got 1.0"),
    ({"layers": 2, "encoder_layers": 1}, "give --layers (both stacks), or --encoder-layers/--decoder-layers"),
    ({"price_per_hour": -1.0}, "--price-per-hour must be a finite number, not negative, got -1.0"),
])
def test_impossible_configurations_are_refused(flags, message):
    with pytest.raises(MtbenchError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        TrainConfig(preset="tiny", **flags)


def test_a_bad_size_is_one_line_before_anything_is_built(tmp_path):
    proc = run_cli("train", "--preset", "tiny", "--d-model", "60", "--heads", "8", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: --d-model 60 is not divisible by --heads 8: each head needs a whole "
                                   "share of the model dimension")
    assert list(tmp_path.iterdir()) == []
    proc = run_cli("compare", "--matrix", "jax:d-model=64,heads=2;jax:d-model=64,heads=3", "--preset", "tiny",
                   "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("Error: run 'jax:d-model=64,heads=3': --d-model 64 is not divisible")
    proc = run_cli("compare", "--matrix", "jax:width=3", "--preset", "tiny", "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 2 and "is not flag=value with a size or sweep flag" in proc.stderr


def test_trackers_are_a_comma_separated_list_and_none_means_none():
    assert TrainConfig(report_to="tensorboard, mlflow,tensorboard").report_to == ("tensorboard", "mlflow")
    assert TrainConfig(report_to="none").report_to == ()
    assert TrainConfig().to_dict()["report_to"] == []


@pytest.fixture
def guides_family(monkeypatch):
    """The decoder-only family of docs/plugins.md, as a plugin registers it, and a family of each task that brings
    no presets."""
    from conftest import guide_example
    from mtbench import ModelFamily
    namespace = {}
    exec(guide_example("**A decoder-only family**"), namespace)

    class PlainLanguageModel(ModelFamily):
        task = "language-modelling"

    families = {"one-block-lm": namespace["OneBlockLM"](), "plain-lm": PlainLanguageModel(),
                "plain-translation": ModelFamily()}
    monkeypatch.setattr(config_module, "plugin_family", families.get)


def test_a_plugins_family_sizes_its_runs_by_its_own_presets_and_steps(guides_family):
    config = TrainConfig(model_name="one-block-lm", preset="mini", d_model=48)
    assert (config.max_len, config.steps, config.decoder_only) == (32, 40, True)
    # the feed-forward at the preset's width per model dimension (128 for its 32): 4x
    assert (config.model.d_model, config.model.ff_dim, config.model.num_heads) == (48, 192, 2)
    assert config.length_option == "--block-size"
    with pytest.raises(MtbenchError, match="unknown preset 'tiny' for --model one-block-lm; choose one of mini, small"):
        TrainConfig(model_name="one-block-lm", preset="tiny")


def test_a_plugins_family_without_presets_takes_its_tasks(guides_family):
    language_model = TrainConfig(model_name="plain-lm", preset="char")
    assert (language_model.max_len, language_model.steps, language_model.model.dropout) == (256, 5000, 0.2)
    assert language_model.decoder_only and TrainConfig(model_name="plain-lm", layers=3).model.encoder_layers == 0
    translation = TrainConfig(model_name="plain-translation")
    assert (translation.max_len, translation.steps, translation.decoder_only) == (48, 450, False)


def test_a_vocabulary_given_is_recorded_as_given_even_at_the_presets_size():
    """--vocab-size equal to the preset's is still asked for (a byte model refuses it; token files train it), and
    that survives the configuration's record; a record written before it was kept is read as before: a vocabulary
    other than the preset's was given."""
    preset_size = PRESETS["small"].vocab_size
    given, default = TrainConfig(vocab_size=preset_size), TrainConfig()
    assert given.vocab_size == default.vocab_size == preset_size
    assert given.vocab_size_given and not default.vocab_size_given
    assert TrainConfig.from_dict(given.to_dict()).vocab_size_given
    assert not TrainConfig.from_dict(default.to_dict()).vocab_size_given
    older = {key: value for key, value in given.to_dict().items() if key != "vocab_size_given"}
    assert not TrainConfig.from_dict(older).vocab_size_given
    assert TrainConfig.from_dict({**older, "vocab_size": preset_size // 2}).vocab_size_given
