"""A trained model kept and used again: `mtbench translate` and `mtbench evaluate` with a run's saved model or one
of its checkpoints, on the backend that trained it and on the other one."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from mtbench.plugins.manager import registry
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.batches import encode_split
from mtbench.runner.data.corpus import load_corpus
from mtbench.runner.data.tokenizer import JointTokenizer
from conftest import CPU_ONLY, assert_refused_in_one_line, cli_environment, json_answer, run_cli
from result_keys import undocumented_keys


@pytest.fixture(scope="module")
def trained(translation_run):
    """The session's JAX run of conftest's TRANSLATION_TRAINED (150 steps, a checkpoint at 75), which
    test_beam_search.py decodes too: its result, hypotheses, references and the sources they translate."""
    result = translation_run["result"]
    with open(result["hypotheses_file"], encoding="utf-8") as f:
        hypotheses = f.read().splitlines()
    with open(result["references_file"], encoding="utf-8") as f:
        references = f.read().splitlines()
    return {"path": translation_run["path"], "result": result, "hypotheses": hypotheses, "references": references,
            "sources": scored_test_sources(result)}


def scored_test_sources(result):
    """The source sentences the run translated for its BLEU, in the order of its hypotheses file."""
    recorded = ("initial_weights_sha256", "parameters")  # what the result adds to the configuration
    config = TrainConfig.from_dict({k: v for k, v in result["config"].items() if k not in recorded})
    corpus = load_corpus(config, registry(), lambda *_: None)
    split = encode_split(corpus.test, JointTokenizer.from_file(result["data"]["tokenizer"]["file"]), config.max_len)
    return [corpus.test[i][0] for i in split.pair_index]


def test_a_completed_run_keeps_its_model(trained):
    saved = trained["result"]["model"]["saved"]
    assert sorted(os.listdir(saved)) == ["model.json", "tokenizer.model", "weights.npz"]
    description = json.loads(open(os.path.join(saved, "model.json")).read())
    assert description["family"] == "transformer" and description["special"] == {"pad": 0, "eos": 3, "start": 2}
    assert len(set(trained["hypotheses"])) > 10, "the model should translate into varied sentences"


def test_a_result_moved_with_its_run_folder_finds_its_model_beside_it(trained, tmp_path):
    """The result records where its model was saved; moved with its RESULT.run folder, it was 'gone'."""
    result = json.loads(json.dumps(trained["result"]))
    result["model"]["saved"] = str(tmp_path / "gone" / "r.run" / "model")
    result.pop("run_dir", None)
    moved = tmp_path / "moved"
    shutil.copytree(trained["result"]["model"]["saved"], moved / "r.run" / "model")
    (moved / "r.json").write_text(json.dumps(result))
    sources = tmp_path / "sources.txt"
    sources.write_text("".join(line + "\n" for line in trained["sources"][:3]), encoding="utf-8")
    proc = run_cli("translate", str(moved / "r.json"), str(sources))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == trained["hypotheses"][:3]
    # The progress bar is a terminal's: on a pipe it showed nothing but left an empty line.
    assert [line for line in proc.stderr.splitlines() if not line.strip()] == []
    shutil.rmtree(moved / "r.run")
    assert_refused_in_one_line(run_cli("translate", str(moved / "r.json"), str(sources)),
                               f"its saved model is gone (not in {result['model']['saved']}, nor in {moved / 'r.run'})")


def test_a_result_gives_the_model_of_its_own_run_not_one_written_to_the_same_place_since(trained, tmp_path):
    """A result copied with its run folder loaded the model its run had written (where a later run had replaced
    it); a partial result loaded its run's newest checkpoint (a resumed run's), not the one it names."""
    from mtbench import MtbenchError
    from mtbench.runner.saved_model import find_model
    result, saved = trained["result"], trained["result"]["model"]["saved"]
    with open(os.path.join(result["run_dir"], "run.json")) as f:  # what a resume holds the data to, named alike
        assert result["data_fingerprint"] == json.load(f)["data_fingerprint"]
    archived = tmp_path / "archive"
    shutil.copytree(saved, archived / "r.run" / "model")
    (archived / "r.json").write_text(json.dumps(result))
    assert find_model(str(archived / "r.json")).label == f"model {archived / 'r.run' / 'model'}"
    # The same result alone, the run at its recorded place since trained again with other options.
    (tmp_path / "alone.json").write_text(json.dumps(dict(result, config={**result["config"], "steps": 20})))
    with pytest.raises(MtbenchError, match=f"the model {saved} found for it is another run's \\(steps 150 where "
                                           f"the result has 20\\)"):
        find_model(str(tmp_path / "alone.json"))
    halfway = os.path.join(result["run_dir"], "checkpoint-000075")
    partial = dict(result, status="interrupted", checkpoint=halfway, model={**result["model"], "saved": None},
                   history=result["history"][:75])
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    assert find_model(str(tmp_path / "partial.json")).weights == halfway
    gone = dict(partial, checkpoint=os.path.join(result["run_dir"], "checkpoint-000010"))
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    with pytest.raises(MtbenchError, match="its checkpoint is gone"):
        find_model(str(tmp_path / "gone.json"))
    # A run that kept no model, its result naming a checkpoint before its last step: not the model it trained.
    (tmp_path / "unsaved.json").write_text(json.dumps(dict(partial, status="completed", history=result["history"])))
    with pytest.raises(MtbenchError, match="it holds step 75, the result's run trained 150"):
        find_model(str(tmp_path / "unsaved.json"))


@pytest.mark.slow  # two translations beyond the trained model, 10 s
def test_translating_again_compiles_nothing_the_first_translation_kept(trained, tmp_path):
    """translate opens the run's persistent compilation cache, as training does: its programs are written once and
    read back by the next translation of the model (on a GPU, tens of seconds of compiling a command)."""
    model = tmp_path / "model"
    shutil.copytree(trained["result"]["model"]["saved"], model)
    description = json.loads((model / "model.json").read_text())
    description["config"]["cache_dir"] = str(tmp_path / "cache")  # its own, whatever the other tests compile
    (model / "model.json").write_text(json.dumps(description))
    sources = tmp_path / "sources.txt"
    sources.write_text("".join(line + "\n" for line in trained["sources"][:3]), encoding="utf-8")

    def translated_and_kept():
        proc = run_cli("translate", str(model), str(sources))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.splitlines() == trained["hypotheses"][:3]
        return sorted(name for folder, _, names in os.walk(tmp_path / "cache" / "compile") for name in names
                      if name.endswith("-cache"))

    first = translated_and_kept()
    assert first  # the decoding's programs, kept
    assert translated_and_kept() == first  # every one read back: none compiled and written again


def test_a_model_trained_on_jax_translates_identically_on_torch(trained, tmp_path):
    sources = trained["sources"]
    # A blank line stays a blank line: the output lines match the input lines one for one.
    lines = sources[:5] + [""] + sources[5:]
    expected = trained["hypotheses"][:5] + [""] + trained["hypotheses"][5:]
    input_file = tmp_path / "sources.txt"
    input_file.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    proc = run_cli("translate", trained["path"], "--backend", "torch", str(input_file))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == expected


@pytest.fixture(scope="module")
def translated_with_carriage_returns(trained, tmp_path_factory):
    """The trained model translating a file of three lines: one holding a lone carriage return, one ending in CRLF,
    and one too long for the model's --max-len 32 (one translate for the tests that read it; batches of three rows,
    as in the moved result's translation of the same model, whose programs the session's cache may hold)."""
    source = tmp_path_factory.mktemp("translate") / "cr.txt"
    source.write_bytes(b"In the beginning\rGod created.\nAnd God said\r\n" + b"And God said, let there be light. " * 20
                       + b"\n")
    proc = run_cli("translate", trained["path"], str(source))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_translate_ends_a_line_at_a_newline_only(translated_with_carriage_returns):
    """As the corpus readers read lines: click's text mode also split at the lone carriage return inside a sentence,
    and the output had a line more than the input (4 for 3 here), none beside its own."""
    translations = translated_with_carriage_returns.stdout.split("\n")
    assert len(translations) == 3 + 1 and translations[-1] == "", translations  # each line ends with "\n"


def test_translate_counts_one_cut_sentence_in_the_singular(translated_with_carriage_returns):
    assert translated_with_carriage_returns.stderr.splitlines()[-1] == (
        "Warning: 1 sentence was longer than the model's 32 tokens and was cut")


@pytest.mark.slow
def test_evaluate_scores_the_runs_test_set_as_the_run_did(trained, tmp_path):
    test_file = tmp_path / "test.tsv"
    test_file.write_text("".join(f"{s}\t{r}\n" for s, r in zip(trained["sources"], trained["references"])),
                         encoding="utf-8")
    out = tmp_path / "scores.json"
    proc = run_cli("evaluate", os.path.dirname(trained["result"]["model"]["saved"]), "--test", str(test_file),
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores, metrics = json.loads(out.read_text()), trained["result"]["metrics"]
    assert scores["sentences"] == len(trained["sources"]) and scores["backend"] == "jax"
    assert scores["bleu"] == pytest.approx(metrics["bleu"], abs=1e-9)
    assert scores["chrf"] == pytest.approx(metrics["chrf"], abs=1e-9)
    assert scores["bleu_signature"] == metrics["bleu_signature"]
    assert undocumented_keys(scores) == [] and undocumented_keys(trained["result"]) == []
    assert open(scores["hypotheses_file"], encoding="utf-8").read().splitlines() == trained["hypotheses"]
    # Each signature says whose it is.
    assert f"BLEU signature: {metrics['bleu_signature']}\nchrF signature: {metrics['chrf_signature']}\n" in proc.stdout
    # A test set that names its languages is read in the model's direction (en -> fr, its dataset's), and scored
    # the other way round never: 'fr' read as the source would have translated French the model never saw.
    # Pairs with an empty side are left out, as the run left them out of its test set (scored, they lowered it).
    jsonl = tmp_path / "test.jsonl"
    jsonl.write_text("".join(json.dumps({"translation": {"fr": r, "en": s}}) + "\n"
                             for s, r in [*zip(trained["sources"], trained["references"]), ("", "Au commencement"),
                                          ("In the beginning", "")]), encoding="utf-8")
    proc = run_cli("evaluate", trained["path"], "--test", str(jsonl), "--out", str(tmp_path / "jsonl.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "jsonl.json").read_text())
    assert scores["bleu"] == pytest.approx(metrics["bleu"], abs=1e-9)
    assert (scores["sentences"], scores["empty_pairs_left_out"]) == (len(trained["sources"]), 2)
    assert "2 pairs with an empty side left out, as a run leaves them out of its test set" in proc.stdout
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(jsonl), "--src-lang", "fr",
                                       "--tgt-lang", "en"),
                               "--src-lang fr --tgt-lang en: the model translates en -> fr")


def test_a_checkpoint_translates_with_its_own_weights(trained, tmp_path):
    checkpoint = os.path.join(trained["result"]["run_dir"], "checkpoint-000075")
    input_file = tmp_path / "sources.txt"
    input_file.write_text("".join(s + "\n" for s in trained["sources"]), encoding="utf-8")
    proc = run_cli("translate", checkpoint, str(input_file))
    assert proc.returncode == 0, proc.stderr[-3000:]
    halfway = proc.stdout.splitlines()
    assert len(halfway) == len(trained["sources"])
    assert halfway != trained["hypotheses"], "step 75's weights should translate differently from step 150's"


def test_decoding_a_model_cannot_take_is_refused_before_the_model_is_built(trained, monkeypatch):
    """--beam and --length-penalty are checked against the run's configuration, before keras (and the framework)
    is imported and the model built: a refusal in a moment, not after loading the model."""
    from mtbench import MtbenchError
    from mtbench.runner import inference
    monkeypatch.setattr(inference, "import_keras", lambda *args, **kwargs: pytest.fail("the model was built"))
    vocabulary = trained["result"]["config"]["vocab_size"]
    for options, message in [({"length_penalty": 3.0}, "--length-penalty 3 weighs beam search's hypotheses"),
                             ({"beam": vocabulary + 1}, f"--beam {vocabulary + 1} is more hypotheses than")]:
        with pytest.raises(MtbenchError, match=message):
            inference.open_translator(trained["path"], registry(), **options)


def test_a_result_without_a_model_or_a_path_that_is_none_are_clear_errors(trained, tmp_path):
    result = dict(trained["result"], model={**trained["result"]["model"], "saved": None}, run_dir=None, checkpoint=None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(result))
    for args, message in [((str(bare),), "kept no model"), ((str(tmp_path / "missing.json"),), "no such file"),
                          ((f"nonesuch:{tmp_path}",), "nor a pretrained checkpoint: no model family 'nonesuch' "
                                                      "(those that read one: gpt2, marian)")]:
        proc = run_cli("translate", *args, "/dev/null")
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    test_file = tmp_path / "test.tsv"
    test_file.write_text("a b\tc d\n")
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(test_file),
                                       "--block-size", "16"), "--block-size is an option of language models")
    vocabulary = trained["result"]["config"]["vocab_size"]  # more hypotheses than tokens: XLA ran out of memory
    assert_refused_in_one_line(run_cli("translate", trained["path"], "/dev/null", "--beam", str(vocabulary + 1)),
                               f"--beam {vocabulary + 1} is more hypotheses than the model's {vocabulary:,} tokens")
    # A dtype the device cannot decode in, checked once the framework says what it computes on (the CPU's XLA).
    assert_refused_in_one_line(run_cli("translate", trained["path"], "/dev/null", "--dtype", "float16", env=CPU_ONLY),
                               "--dtype float16: XLA on the CPU has no float16 matmul")
    # A length penalty greedy decoding would not use: translate and evaluate decoded greedily, as if not given.
    assert trained["result"]["config"]["beam"] == 1
    assert_refused_in_one_line(run_cli("translate", trained["path"], "/dev/null", "--length-penalty", "3"),
                               "--length-penalty 3 weighs beam search's hypotheses by length; greedy decoding (the "
                               "run decoded with --beam 1) has none to weigh: give --beam N")
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(test_file), "--beam", "1",
                                       "--length-penalty", "1"), "greedy decoding (--beam 1) has none to weigh")
    # Its own input, even told to replace what exists: the scores would have replaced the run's result.
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(test_file), "--out",
                                       trained["path"], "--overwrite"),
                               f"{trained['path']}: is the file this command reads ({trained['path']}); give another "
                               f"--out")
    # nor the test set by the hypotheses written beside --out (scores.hyp.txt read as the test set was replaced)
    read_as_test = tmp_path / "scores.hyp.txt"
    read_as_test.write_text("a b\tc d\n")
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(read_as_test), "--out",
                                       str(tmp_path / "scores.json"), "--overwrite"),
                               f"{read_as_test}: is the file this command reads ({read_as_test}); --out "
                               f"{tmp_path / 'scores.json'} writes it beside; give another --out")
    assert read_as_test.read_text() == "a b\tc d\n"
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(test_file), "--out", ""),
                               "'': names a directory, not a file")  # it wrote nothing and ended 0
    # a result of another layout ended in 'AttributeError: 'str' object has no attribute 'get''
    for name, change, message in (("layout.json", {"model": "x"}, "not an mtbench result (model: expected an object)"),
                                  ("saved.json", {"model": {**trained["result"]["model"], "saved": 5}},
                                   "model.saved: 5 is not a path")):
        (tmp_path / name).write_text(json.dumps(dict(trained["result"], **change)))
        assert_refused_in_one_line(run_cli("translate", str(tmp_path / name), "/dev/null"),
                                   f"{tmp_path / name}: {message}")
    latin = tmp_path / "latin-1.txt"  # a UnicodeDecodeError ended in 'Error: UnicodeDecodeError: ...', no file named
    latin.write_bytes("déjà vu\n".encode("latin-1"))
    assert_refused_in_one_line(run_cli("translate", trained["path"], str(latin)),
                               f"{latin}: not valid UTF-8; expected one sentence a line")


def test_a_saved_model_whose_configuration_is_not_of_its_kinds_is_named_with_its_file(trained, tmp_path):
    """As a run file's and a resumed run's: it said 'batch_size: 8.5 is not an integer' without a file."""
    with open(os.path.join(trained["result"]["model"]["saved"], "model.json")) as f:
        description = json.load(f)
    description["config"]["batch_size"] = 8.5
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.json").write_text(json.dumps(description))
    assert_refused_in_one_line(run_cli("translate", str(tmp_path / "model"), "/dev/null"),
                               f"{tmp_path / 'model' / 'model.json'}: batch_size: 8.5 is not an integer")


def test_evaluate_keeps_a_hypotheses_file_its_out_would_write_over(trained, tmp_path):
    from mtbench.runner.results.schema import sidecar_paths
    test_file = tmp_path / "test.tsv"
    test_file.write_text("a b\tc d\n")
    out = tmp_path / "scores"  # no .json: its hypotheses file is scores.hyp.txt, which a run may have written
    hypotheses = sidecar_paths(str(out))[0]
    with open(hypotheses, "w") as f:
        f.write("an earlier run's translations\n")
    assert_refused_in_one_line(run_cli("evaluate", trained["path"], "--test", str(test_file), "--out", str(out)),
                               f"{hypotheses}: already exists (--out {out} writes its hypotheses there); pass "
                               f"--overwrite to replace it")
    assert open(hypotheses).read() == "an earlier run's translations\n" and not out.exists()


def test_evaluate_overwrites_only_scores_not_a_models_description_nor_a_runs_result(trained, tmp_path):
    """`--overwrite` replaced any JSON object: the scores over the model's own model.json (which then loaded no
    more), or over a training run's result."""
    test_file = tmp_path / "test.tsv"
    test_file.write_text("a b\tc d\n")
    model = tmp_path / "model"
    shutil.copytree(trained["result"]["model"]["saved"], model)
    result = tmp_path / "result.json"
    shutil.copy(trained["path"], result)
    before = {path: path.read_bytes() for path in (model / "model.json", result)}
    for out in before:
        assert_refused_in_one_line(run_cli("evaluate", str(model), "--test", str(test_file), "--out", str(out),
                                           "--overwrite"),
                                   f"{out}: is no scores .json file, as mtbench writes; --overwrite replaces only "
                                   f"those")
    assert {path: path.read_bytes() for path in before} == before


@pytest.mark.parametrize("args, expected", [
    (["--src-col", "0"], "--src-col must be at least 1, got 0"),
    (["--src-col", "2", "--tgt-col", "2"], "--src-col and --tgt-col are both 2; they must differ"),
    (["--length-penalty", "-5"], "Invalid value for '--length-penalty'"),
    (["--length-penalty", "nan"], "Invalid value for '--length-penalty': must be a finite number, got nan"),
    (["--src-lang", "en"], "give both --src-lang and --tgt-lang, or neither"),
])
def test_evaluate_refuses_what_train_refuses_before_it_loads_a_model(tmp_path, args, expected):
    """A column 0 would read the last column (Python counts from the end), as `train` refuses it."""
    test_file = tmp_path / "test.tsv"
    test_file.write_text("a b\tc d\te f\n")
    assert_refused_in_one_line(run_cli("evaluate", str(tmp_path / "no-model.json"), "--test", str(test_file), *args),
                               expected)


def test_an_empty_backend_is_refused_rather_than_taken_for_the_default(trained, tmp_path):
    """`--backend ''` opened the model on the backend that trained it, as if no --backend were given."""
    for command in (("translate", trained["path"], "/dev/null"), ("generate", trained["path"], "--prompt", "In")):
        assert_refused_in_one_line(run_cli(*command, "--backend", ""), "unknown backend ''; available: ")


def test_a_compare_json_given_as_the_model_names_its_runs(tmp_path):
    compared = tmp_path / "c.json"
    compared.write_text(json.dumps({"kind": "mtbench-compare", "config": {}, "runs": [
        {"result_file": "/r/c.runs/jax-1.json"}, {"result_file": "/r/c.runs/torch-1.json"}]}))
    for command in (("translate", str(compared), "/dev/null"), ("generate", str(compared), "--prompt", "In")):
        assert_refused_in_one_line(run_cli(*command), "c.json: a compare JSON of several runs; give one run's "
                                                      "result: /r/c.runs/jax-1.json, /r/c.runs/torch-1.json")


def test_a_saved_model_computes_its_float32_matmuls_as_its_run_trained(trained):
    """On a GPU JAX's own default is TF32 (and unset, None, on a CPU): a model opened again must decode in the
    arithmetic its run trained in (true float32 here), or `evaluate` would not score the run's translations. Counted
    in the program: the opened model's forward pass lowered for CUDA (on this CPU too), every product at XLA's
    HIGHEST."""
    program = textwrap.dedent(rf"""
        import json, re
        import numpy as np
        from mtbench.plugins.manager import registry
        from mtbench.runner.inference import open_model
        loaded = open_model({trained['path']!r}, registry())
        import jax, keras
        model = loaded.model

        def forward(values, inputs):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return model(inputs)

        ids = np.ones((2, 8), np.int32)
        text = jax.jit(forward).trace([v.value for v in model.variables], (ids, ids)).lower(
            lowering_platforms=("cuda",)).as_text()
        products = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
        print(json.dumps({{"setting": jax.config.jax_default_matmul_precision, "products": len(products),
                          "precisions": sorted({{" ".join(re.findall(r"precision = \[(\w+), (\w+)\]", line)[0])
                                                if "precision" in line else "DEFAULT" for line in products}})}}))
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=cli_environment())
    report = json_answer(proc)
    assert trained["result"]["config"]["matmul_precision"] == "highest"
    assert report["setting"] == "float32"
    assert report["products"] > 10 and report["precisions"] == ["HIGHEST HIGHEST"]


TINY_CHAR_GPT = ["--backend", "jax", "--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8",
                 "--valid-size", "4", "--test-size", "4", "--dtype", "float32", "--tokenizer", "char", "--steps", "4"]


@pytest.fixture(scope="module")
def char_language_models(cache_dir, tmp_path_factory):
    """A tiny character-level GPT that kept its model, on the built-in corpus's English verses as a text file."""
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    folder = tmp_path_factory.mktemp("char-gpt")
    pairs = BibleDataset("en", "fr").read_pairs(lambda *_: None)
    text = folder / "verses.txt"
    text.write_text("".join(source + "\n" for _, (source, _) in zip(range(600), pairs)), encoding="utf-8")
    out = folder / "saved.json"
    proc = run_cli("train", *TINY_CHAR_GPT, "--data", str(text), "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"text": str(text), "saved": str(out)}


@pytest.mark.slow  # a training process and five more
def test_a_measure_only_run_and_an_evaluate_scores_file_are_named_for_what_they_are(char_language_models, shared_runs,
                                                                                   tmp_path):
    """A --measure-only result was said to have kept no model because of '--no-save-model, or it did not complete',
    and `report` called evaluate's scores file 'not an mtbench result (schema_version: missing and 22 more
    problems)'."""
    # A language model's --measure-only result: the session's float16 GPT run (conftest's FLOAT16_GPT), which the
    # slow tests of the parallel extras and the report train anyway; what is refused is read from the result alone.
    measured = shared_runs.get("torch-float16-gpt")["torch-float16-gpt"]["path"]
    for command in (["generate", measured, "--prompt", "And"],
                    ["evaluate", measured, "--test", char_language_models["text"]]):
        assert_refused_in_one_line(run_cli(*command), "the run kept no model (--measure-only: it trained and timed "
                                                      "only), and it has no checkpoint")
    scores = tmp_path / "eval.json"
    evaluated = run_cli("evaluate", char_language_models["saved"], "--test", char_language_models["text"], "--out",
                        str(scores))
    assert evaluated.returncode == 0, evaluated.stderr
    model = json.loads(scores.read_text())["model"]
    assert_refused_in_one_line(run_cli("report", str(scores)),
                               f"{scores}: `mtbench evaluate`'s scores ({model} on a test set), not a run's figures; "
                               f"give the result JSON of the run that trained it")


@pytest.mark.slow
def test_generate_prints_control_characters_escaped_and_warns_of_those_the_tokenizer_lacks(char_language_models):
    """A byte-level model's backspace or NUL, printed raw, ate characters on the console and made grep take a log
    for binary; the prompt is printed back as well, so a prompt's control characters show how they are written."""
    proc = run_cli("generate", char_language_models["saved"], "--prompt", "And\x08God\x07", "--max-new-tokens", "6",
                   "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("And\\x08God\\x07") and "\x08" not in proc.stdout and "\x07" not in proc.stdout
    assert all(c.isprintable() or c in "\n\t" for c in proc.stdout)
    # Neither control character is in the training text: the character tokenizer reads both as <unk>.
    assert ("Warning: 2 of the prompt's 8 tokens are unknown to the model's tokenizer (read as <unk>)"
            in proc.stderr), proc.stderr
    assert "6 tokens by" in proc.stderr


@pytest.mark.slow  # two evaluate processes, 20-40 s
def test_evaluate_takes_a_batch_of_more_rows_than_the_text_has_windows(char_language_models, tmp_path):
    """--batch-size 10**20 ended in numpy's 'ValueError: Maximum allowed dimension exceeded' (exit 1): the batch
    was padded to its rows. It holds the text's windows, and scores them as a batch of the default's 64 does."""
    scores = {}
    for rows in ("64", str(10 ** 20)):
        out = tmp_path / f"{len(rows)}.json"
        proc = run_cli("evaluate", char_language_models["saved"], "--test", char_language_models["text"],
                       "--batch-size", rows, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        scores[rows] = json.loads(out.read_text())
    assert scores["64"]["tokens_evaluated"] == scores[str(10 ** 20)]["tokens_evaluated"]
    assert scores[str(10 ** 20)]["loss"] == pytest.approx(scores["64"]["loss"], rel=1e-5)
