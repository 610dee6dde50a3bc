"""Every bad input: one line on stderr (after any warning about a broken plugin), exit code 2, no traceback,
nothing already written lost. Failures that cannot be produced honestly from the command line (a read-only
directory or an unreadable file when the tests run as root, a full disk) are tested on the function that
reports them."""

import errno
import gzip
import json
import os

import pytest

from conftest import assert_refused_in_one_line, cli_environment, env_with, run_cli
from forked_mtbench import ForkingMtbench
from mtbench.errors import MtbenchError, RunFailure

GOOD_TSV = "".join(f"source sentence number {i}\tphrase cible numéro {i}\n" for i in range(60))
EN = "".join(f"source sentence number {i}\n" for i in range(60))
FR = "".join(f"phrase cible numéro {i}\n" for i in range(60))


def write(path, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)
    return str(path)


def jsonl(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def cases(tmp_path, plugin_path):
    """name -> (arguments, the error line must contain, environment)."""
    t = tmp_path
    good = write(t / "good.tsv", GOOD_TSV)
    existing = write(t / "existing.json", '{"keep": "me"}\n')
    translations = [{"translation": {"en": f"sentence {i}", "fr": f"phrase {i}"}} for i in range(60)]
    write(t / "corpus.en", EN)
    write(t / "corpus.fr", FR.rsplit("phrase", 1)[0])  # one line short
    os.mkfifo(t / "pipe.tsv")
    (t / "not-a-run").mkdir()
    (t / "empty-run").mkdir()
    write(t / "empty-run" / "run.json", json.dumps({"mtbench_run": 1, "config": {"preset": "tiny"}}))
    os.makedirs(t / "earlier.run" / "checkpoint-000010")
    write(t / "earlier.run" / "checkpoint-000010" / "state.json", "{}")
    os.makedirs(t / "kept.run" / "model")
    write(t / "kept.run" / "model" / "weights.npz", "an earlier run's model")
    os.makedirs(t / "finished.run" / "model")  # a completed run without --checkpoint-every: no run.json
    write(t / "finished.json", json.dumps({"status": "completed"}))
    (t / "sacrebleu-cache").mkdir()
    write(t / "translated.hyp.txt", "an earlier run's translations\n")  # its result since removed
    plugins = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty,mtbench-broken"}
    empty_cache = {"SACREBLEU": str(t / "sacrebleu-cache")}
    return {
        "unknown backend": (["--backend", "nonesuch"], "unknown backend 'nonesuch'", None),
        "backend framework not installed": (["--backend", "fakeflow"], "backend 'fakeflow' needs "
                                            "fakeflow_is_not_installed, which is not installed "
                                            "(pip install 'mtbench[fakeflow]')", plugins),
        "missing data file": (["--data", str(t / "absent.tsv")], "absent.tsv: no such file", None),
        "data is a directory": (["--data", str(t)], "is a directory", None),
        "data is a pipe": (["--data", str(t / "pipe.tsv")], "pipe.tsv: not a regular file", None),
        "data under a file": (["--data", str(t / "good.tsv" / "x.tsv")], "x.tsv: no such file (a parent of it is a "
                              "file", None),
        "empty file": (["--data", write(t / "empty.tsv", "")], "empty.tsv: the file is empty", None),
        "invalid utf-8": (["--data", write(t / "latin1.tsv", GOOD_TSV.encode() + "café\tcafé\n".encode("latin-1"))],
                          "latin1.tsv:61: not valid UTF-8", None),
        "not gzip": (["--data", write(t / "plain.tsv.gz", GOOD_TSV)], "plain.tsv.gz:1: not a valid gzip file", None),
        "truncated gzip": (["--data", write(t / "cut.tsv.gz", gzip.compress(GOOD_TSV.encode())[:-20])],
                           ": not a valid gzip file (Compressed file ended before the end-of-stream", None),
        "too few columns": (["--data", write(t / "columns.tsv", GOOD_TSV + "only one column here\n")],
                            "columns.tsv:61: expected 2 tab-separated columns", None),
        "column beyond the line": (["--data", good, "--tgt-col", "3"],
                                   "good.tsv:1: expected at least 3 tab-separated columns", None),
        "same column twice": (["--data", good, "--src-col", "2"], "--src-col and --tgt-col are both 2", None),
        "every pair has an empty side": (["--data", write(t / "hollow.tsv", "a\t\n\tb\n\n")],
                                         "hollow.tsv: no pair has both a source and a target sentence", None),
        "moses line counts differ": (["--data", str(t / "corpus"), "--src-lang", "en", "--tgt-lang", "fr"],
                                     "corpus.fr:60: missing line: ", None),
        "moses side missing": (["--data", str(t / "corpus"), "--src-lang", "en", "--tgt-lang", "de"],
                               "corpus.de: no such file", None),
        "jsonl line not json": (["--data", write(t / "broken.jsonl", jsonl(translations[:2]) + "{'en': 'x'}\n"),
                                 "--src-lang", "en", "--tgt-lang", "fr"], "broken.jsonl:3: not valid JSON", None),
        "jsonl lacks the language": (["--data", write(t / "lacks.jsonl", jsonl(translations[:1] + [
            {"translation": {"en": "only english"}}])), "--src-lang", "en", "--tgt-lang", "fr"],
            'lacks.jsonl:2: the translation has no "fr" (it has: en)', None),
        "jsonl without languages": (["--data", write(t / "pairs.jsonl", jsonl(translations))],
                                    "pairs.jsonl: a jsonl corpus needs --src-lang and --tgt-lang", None),
        "one language only": (["--data", good, "--src-lang", "en"], "give both --src-lang and --tgt-lang", None),
        # its references file got a line more than the hypotheses, and sacrebleu refused it
        "jsonl sentence over two lines": (["--data", write(t / "lines.jsonl", jsonl(translations[:1] + [
            {"translation": {"en": "two", "fr": "deux\nlignes"}}])), "--src-lang", "en", "--tgt-lang", "fr"],
            'lines.jsonl:2: the target ("fr") sentence holds a line break', None),
        # read as TSV: 'expected at least 2 tab-separated columns', and no word of the prefix
        "a moses side as the corpus": (["--data", str(t / "corpus.en"), "--src-lang", "en", "--tgt-lang", "fr"],
                                       f"corpus.en is one side of a Moses pair ({t / 'corpus.fr'} beside it): give "
                                       f"their prefix, {t / 'corpus'}, with --src-lang en --tgt-lang fr", None),
        "a moses prefix without languages": (["--data", str(t / "corpus")], f"corpus: no such file; "
                                             f"{t / 'corpus.en'} and {t / 'corpus.fr'} exist: a Moses pair is given "
                                             f"as their prefix with --src-lang and --tgt-lang (en, fr)", None),
        "bad validation file": (["--data", good, "--valid", write(t / "valid.tsv", "one column only\n")],
                                "valid.tsv:1: expected at least 2 tab-separated columns", None),
        "sacrebleu set not cached": (["--data", good, "--test", "sacrebleu:wmt14", "--src-lang", "en",
                                      "--tgt-lang", "fr"], "sacrebleu test set wmt14 en-fr is not in sacrebleu's "
                                     "cache", empty_cache),
        # WMT's XML sets (wmt21 on): sacrebleu's field names of the set downloaded it, 'Error: URLError' and a lock file
        "sacrebleu xml set not cached": (["--data", good, "--test", "sacrebleu:wmt22", "--src-lang", "en",
                                          "--tgt-lang", "de"], "sacrebleu test set wmt22 en-de is not in sacrebleu's "
                                         "cache", empty_cache),
        "unknown sacrebleu set": (["--data", good, "--test", "sacrebleu:wmt41", "--src-lang", "en", "--tgt-lang",
                                   "fr"], "unknown sacrebleu test set 'wmt41'", empty_cache),
        "sacrebleu pair missing": (["--data", good, "--test", "sacrebleu:wmt14", "--src-lang", "en", "--tgt-lang",
                                    "tlh"], "sacrebleu test set 'wmt14' has no en-tlh", empty_cache),
        "corpus too small to split": (["--data", write(t / "small.tsv", "".join(GOOD_TSV.splitlines(True)[:5])),
                                       "--valid-size", "5", "--test-size", "5"], "cannot be split", None),
        "unknown dataset": (["--dataset", "bible-xx-yy"], "unknown dataset 'bible-xx-yy'", None),
        "a file as the dataset": (["--dataset", good], f"; a file is read with --data {good}", None),
        "a file as a language model's dataset": (["--model", "gpt", "--dataset", "corpus/enwik8"],
                                                 "; a file is read with --data corpus/enwik8", None),
        "unknown extra": (["--data", good, "--extra", "warp-drive"], "unknown extra 'warp-drive'", None),
        "extra unavailable here": (["--data", good, "--valid-size", "5", "--test-size", "5", "--extra", "tpu"],
                                   "extra 'tpu' cannot run here: needs TPU devices", None),
        "conflicting extras": (["--data", good, "--extra", "pmap", "--extra", "data-parallel"],
                               "extra 'pmap' cannot run together with 'data-parallel'", None),
        "eager jax step": (["--data", good, "--step", "eager"], "--step eager: no 'torch-compile' extra serves the "
                           "jax backend, which trains its own step (JAX's is always compiled)", None),
        "eager step beside the compile extra": (["--backend", "torch", "--extra", "torch-compile", "--step", "eager"],
                                                "--step eager contradicts --extra torch-compile", None),
        "batch size zero": (["--batch-size", "0"], "--batch-size must be at least 1", None),
        "negative steps": (["--steps", "-3"], "--steps must be at least 1", None),
        "no beam": (["--beam", "0"], "--beam must be at least 1", None),
        # one bound, 16, where 0 was told 'at least 1' and 1 then 'at least 16'
        "no vocabulary": (["--vocab-size", "0"], "--vocab-size must be at least 16, got 0", None),
        # sentencepiece failed on it once the corpus was read: exit 1, 'cannot parse ... as int'
        "vocabulary past 32-bit ids": (["--vocab-size", str(2 ** 64)], "--vocab-size must be at most 2,147,483,647 "
                                       "(a 32-bit token id), got 18,446,744,073,709,551,616", None),
        # each was read as the option not given: the built-in corpus trained, a new run instead of the resumed one,
        # the caches written into the working directory
        "empty corpus path": (["--data", ""], "Invalid value for '--data': '' names no file or folder", None),
        "empty validation path": (["--valid", ""], "Invalid value for '--valid': '' names no file or folder", None),
        "empty resume path": (["--resume", ""], "Invalid value for '--resume': '' names no file or folder", None),
        "empty cache path": (["--cache-dir", ""], "Invalid value for '--cache-dir': '' names no file or folder", None),
        "empty tracker name": (["--report-to", "tensorboard,,"], "--report-to 'tensorboard,,': an empty name (two "
                               "commas in a row, or one at an end)", None),
        # named by the variable the user set, not by a flag never given
        "a price in the environment that is no number": (["--data", good], "MTBENCH_PRICE_PER_HOUR='abc' is not a "
                                                         "number", {"MTBENCH_PRICE_PER_HOUR": "abc"}),
        "no time to wait for the other processes": (["--process-timeout", "0"],
                                                    "Invalid value for '--process-timeout': 0 is not in the range x>=1",
                                                    None),
        "negative length penalty": (["--length-penalty", "-1"], "--length-penalty must be a finite number, not "
                                    "negative, got -1", None),
        "steps and epochs": (["--steps", "3", "--epochs", "1"], "not both", None),
        "endless epochs": (["--epochs", "inf"], "--epochs must be a positive finite number, got inf", None),
        "learning rate not a number": (["--learning-rate", "nan"],
                                       "--learning-rate must be a positive finite number, got nan", None),
        "weight decay not a number": (["--weight-decay", "nan"],
                                      "--weight-decay must be a finite number, not negative, got nan", None),
        "validation past the last step": (["--steps", "2", "--eval-every", "5"],
                                          "--eval-every 5 exceeds --steps 2: no validation would run while training",
                                          None),
        "validation past the last step of the epochs": (["--data", good, "--valid-size", "5", "--test-size", "5",
                                                         "--batch-size", "8", "--epochs", "0.1", "--eval-every", "9"],
                                                        "--eval-every 9 exceeds the 1 step of --epochs 0.1: no "
                                                        "validation would run while training", None),
        "sample length without a prompt": (["--model", "gpt", "--sample-tokens", "5"],
                                           "--sample-tokens is the length of --sample-prompt's continuation; give "
                                           "--sample-prompt", None),
        "trackers' folder without trackers": (["--logging-dir", str(t / "logs")],
                                              "--logging-dir is where --report-to's trackers write; give --report-to",
                                              None),
        "beam search's option for a language model": (["--model", "gpt", "--length-penalty", "1.0"],
                                                      "--length-penalty is an option of translation; the 'gpt' model "
                                                      "family is a language model", None),
        "a column for a language model": (["--model", "gpt", "--src-col", "2"],  # not "both columns are 2"
                                          "--src-col is an option of translation", None),
        "an extra twice": (["--extra", "remat", "--extra", "remat"], "extra 'remat' is given twice; give each extra "
                                                                     "once", None),
        # each trained the whole run, then ran out of memory in its beam search (5,000 of 1,000 tokens: 20 GB)
        "beam past the preset's vocabulary": (["--beam", "1001"], "--beam 1,001 is more hypotheses than the "
                                              "vocabulary's 1,000 tokens (the preset tiny's); give at most 1,000",
                                              None),
        "beam past the vocabulary size": (["--vocab-size", "100", "--beam", "101"], "--beam 101 is more hypotheses "
                                          "than the vocabulary's 100 tokens (--vocab-size); give at most 100", None),
        # sampled at every validation, a token a forward pass, without end
        "endless samples": (["--model", "gpt", "--eval-every", "2", "--sample-prompt", "And", "--sample-tokens",
                             str(10 ** 20)], "--sample-tokens must be at most 100,000 (a forward pass of the model a "
                            "token, at every validation), got 100,000,000,000,000,000,000", None),
        "beam search in a run that decodes nothing": (["--measure-only", "--beam", "4"],
                                                      "--beam 4 decodes the test set, which --measure-only skips",
                                                      None),
        "length penalty of greedy decoding": (["--length-penalty", "1.5"], "--length-penalty 1.5 weighs beam "
                                              "search's hypotheses by length; greedy decoding (--beam 1) has none to "
                                              "weigh: give --beam N", None),
        "no checkpoints kept": (["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1", None),
        "target without evaluations": (["--target-bleu", "20"], "--target-bleu needs --eval-every", None),
        "unknown reporter": (["--report", "fax"], "unknown reporter 'fax'", None),
        # it reported its table beside --report none
        "a reporter of results as a tracker": (["--report-to", "table", "--report", "none"], "--report-to table: "
                                               "reporter 'table' reports a result and follows no training (give it "
                                               "to --report); the trackers: mlflow, tensorboard, wandb", None),
        "reporter of a broken plugin": (["--report", "twoline"], "unknown reporter 'twoline'; available: calls-file, "
                                        "explode, mlflow, oneline, summary, table, tensorboard, wandb; it may come from a "
                                        "plugin that failed: plugin 'broken' failed to load", plugins),
        # recorded beside the dataset's en -> fr pairs, they would have said the run translated fr -> en
        "languages of a dataset's pairs": (["--src-lang", "fr", "--tgt-lang", "en"], "--src-lang fr --tgt-lang en: "
                                           "these say how --data, --valid and --test files are read; the dataset "
                                           "'bible-en-fr' reads none (its pairs are en -> fr)", None),
        "a column of a dataset's pairs": (["--tgt-col", "3"], "--tgt-col 3: these say how --data", None),
        "existing result": (["--data", good, "--out", existing], "already exists; pass --overwrite", None),
        "output is a directory": (["--data", good, "--out", str(t)], "is a directory", None),
        # --overwrite wrote the result over the corpus, and the run's answer was a result where the data had been
        "overwrite of a file mtbench did not write": (["--data", good, "--out", write(t / "notes.json", "my notes\n"),
                                                       "--overwrite"], "notes.json: is no .json file, as mtbench "
                                                      "writes; --overwrite replaces only those", None),
        # each of these was dropped without a word
        "a clipping norm without clipping": (["--data", good, "--clip", "none", "--clip-norm", "2"],
                                             "--clip-norm 2 is the norm gradients are clipped to; --clip none clips "
                                             "none: give one of them", None),
        "a dataset beside a corpus": (["--dataset", "bible-en-de", "--data", good],
                                      "--dataset bible-en-de is not used: --data reads the corpus instead", None),
        "a validation size beside a validation file": (["--data", good, "--valid", good, "--valid-size", "7"],
                                                       "--valid-size 7 is not used: --valid gives the validation "
                                                       "pairs instead of a split of the corpus", None),
        "a test size beside a test file": (["--data", good, "--test", good, "--test-size", "3"],
                                           "--test-size 3 is not used: --test gives the test pairs", None),
        "output is the corpus": (["--data", good, "--out", good, "--overwrite"],
                                 f"{good}: is the file this command reads ({good}); give another --out", None),
        "output is the validation file": (["--data", good, "--valid", good, "--out", good, "--overwrite"],
                                          "is the file this command reads", None),
        "output is the initial weights": (["--data", good, "--initial-weights", existing, "--out", existing,
                                           "--overwrite"], f"{existing}: is the file this command reads", None),
        "output is the config file": (["--config", write(t / "run.toml", "steps = 3\n"), "--data", good, "--out",
                                       str(t / "run.toml"), "--overwrite"],
                                      f"{t / 'run.toml'}: is the file this command reads", None),
        # a directory's name: it failed only once the run was trained, and the figures were lost
        "output names a new directory": (["--data", good, "--out", str(t / "new-folder") + "/"],
                                         "new-folder/': names a directory, not a file", None),
        "output empty": (["--data", good, "--out", ""], "'': names a directory, not a file", None),
        "a model family with an empty path": (["--model", "gpt:"], "--model gpt:: give the checkpoint's directory "
                                              "after the colon, or the family's name alone", None),
        "output of blanks": (["--data", good, "--out", "  "], "'  ': a name of blanks; --out takes a .json file path",
                             None),
        "no report beside a report": (["--data", good, "--report", "none", "--report", "table"],
                                      "--report none reports nothing; it cannot stand beside --report table", None),
        "earlier hypotheses beside the output": (["--data", good, "--out", str(t / "translated.json")],
                                                 "translated.hyp.txt: already exists beside", None),
        "output under a file": (["--data", good, "--out", str(t / "good.tsv" / "r.json")],
                                "good.tsv: it is a file, not a directory", None),
        "earlier run's checkpoints": (["--data", good, "--out", str(t / "earlier.json")],
                                      "earlier.run: holds checkpoints of an earlier run", None),
        "compile mode of an eager step": (["--data", good, "--backend", "torch", "--step", "eager", "--compile-mode",
                                           "max-autotune"], "--compile-mode max-autotune: this run's step is not "
                                          "compiled (--step eager); leave --compile-mode out", None),
        "compile mode on jax": (["--data", good, "--backend", "jax", "--compile-mode", "reduce-overhead"],
                                "this run's step is not compiled (no 'torch-compile' extra serves the jax backend",
                                None),
        "block too short": (["--model", "gpt", "--block-size", "4"], "--block-size must be at least 8, got 4", None),
        "empty block": (["--model", "gpt", "--block-size", "0"], "--block-size must be at least 1, got 0", None),
        "stride past the block": (["--model", "gpt", "--block-size", "16", "--eval-stride", "17"],
                                  "--eval-stride 17 exceeds --block-size 16: the tokens between windows would never "
                                  "be scored", None),
        "negative profile": (["--profile", "-1"], "--profile must not be negative, got -1", None),
        "token batch under a block": (["--model", "gpt", "--max-tokens", "3"],
                                      "--max-tokens 3 cannot hold one row of --block-size 64 tokens", None),
        "seed out of range": (["--data", good, "--seed", "-1"], "--seed must be from 0 to 4294967295, got -1",
                              None),
        "earlier run's saved model": (["--data", good, "--out", str(t / "kept.json")],
                                      "kept.run: holds an earlier run's files", None),
        # sysfs refuses new files even to root, whatever its permission bits say.
        "output where no file can be made": (["--data", good, "--out", "/sys/mtbench-result.json"],
                                             "cannot write into /sys", None),
        "resume a missing directory": (["--resume", str(t / "nowhere")], "nowhere: no such run directory", None),
        "resume a directory that is not a run": (["--resume", str(t / "not-a-run")],
                                                 "not-a-run: not an mtbench run directory (it has no run.json)", None),
        "resume a finished run": (["--resume", str(t / "finished.run")],
                                  f"finished.run: the run finished with status completed ({t / 'finished.json'}) and "
                                  "wrote no checkpoint; there is nothing to resume", None),
        "resume a run without checkpoints": (["--resume", str(t / "empty-run")],
                                             "empty-run: holds no complete checkpoint", None),
        "resume with other options": (["--resume", str(t / "empty-run"), "--steps", "5"],
                                      "--resume continues a run with its own configuration; drop --steps", None),
        "config file missing": (["--config", str(t / "absent.toml")], "--config " + str(t / "absent.toml") +
                                ": no such file", None),
        "config file not toml": (["--config", write(t / "broken.toml", "steps = \n")], "broken.toml: not valid "
                                 "TOML (Invalid value (at line 1, column 9))", None),
        "config key unknown": (["--config", write(t / "unknown.toml", "batch_size = 16\n")],
                               "unknown.toml: unknown key 'batch_size'; did you mean batch-size?", None),
        "config value of the wrong kind": (["--config", write(t / "kind.toml", 'steps = "many"\n')],
                                           "kind.toml: steps must be an integer, got a string 'many'", None),
        "config value the flag refuses": (
            ["--config", write(t / "choice.toml", 'dtype = "float64"\n')],
            "choice.toml: dtype = 'float64': 'float64' is not one of 'auto', 'float32'", None),
        "config value the run refuses": (["--config", write(t / "zero.toml", "batch-size = 0\n")],
                                         "zero.toml: batch-size must be at least 1, got 0", None),
        "config values the run refuses together": (["--config", write(t / "both.toml", "steps = 3\nepochs = 1.0\n")],
                                                   f"--config {t / 'both.toml'}: give --steps or --epochs, not both",
                                                   None),
        "config value the command line replaces": (["--config", write(t / "good.toml", "batch-size = 8\n"),
                                                    "--batch-size", "0"], "Error: --batch-size must be at least "
                                                                           "1, got 0", None),
        "run file beside other options": (["--run-file", write(t / "run.json", "{}"), "--steps", "3"],
                                          "--run-file holds the run's whole configuration; drop --steps", None),
        "run file of another format": (["--run-file", write(t / "later.json", json.dumps(
            {"mtbench_run_file": 2, "config": {}}))], "later.json: a run file of format 2; this mtbench reads format 1",
                                       None),
        "run file with an unknown key": (["--run-file", write(t / "unknown.json", json.dumps(
            {"mtbench_run_file": 1, "config": {"preset": "tiny", "warp_factor": 9}}))],
            "unknown.json: unknown configuration keys warp_factor (written by another mtbench version?)", None),
        # a TypeError deep in the run, blamed on the translation task's plugin
        "run file with a value of the wrong kind": (["--run-file", write(t / "kind.json", json.dumps(
            {"mtbench_run_file": 1, "config": {"preset": "tiny", "batch_size": 8.5}}))],
            "kind.json: batch_size: 8.5 is not an integer", None),
        "run file with extras as a name": (["--run-file", write(t / "extras.json", json.dumps(
            {"mtbench_run_file": 1, "config": {"preset": "tiny", "extras": "remat"}}))],
            'extras.json: extras: "remat" is not a list of names', None),
        # null stands only for a default that is null: the cache folder's is not, and null failed in the run
        "run file with a null cache folder": (["--run-file", write(t / "null.json", json.dumps(
            {"mtbench_run_file": 1, "config": {"preset": "tiny", "cache_dir": None}}))],
            "null.json: cache_dir: null is not a string", None),
        # numpy's EOFError of an empty archive ended in 'Error: EOFError: No data left in file'
        "empty initial weights": (["--initial-weights", write(t / "empty.npz", "")],
                                  "empty.npz: not an .npz file of arrays", None),
    }


CASE_NAMES = [
    "unknown backend", "backend framework not installed", "missing data file", "data is a directory",
    "data is a pipe", "data under a file", "empty file", "invalid utf-8", "not gzip", "truncated gzip",
    "too few columns", "column beyond the line", "same column twice", "every pair has an empty side",
    "moses line counts differ", "moses side missing", "jsonl line not json", "jsonl lacks the language",
    "jsonl without languages", "one language only", "jsonl sentence over two lines", "a moses side as the corpus",
    "a moses prefix without languages", "bad validation file", "sacrebleu set not cached",
    "sacrebleu xml set not cached",
    "unknown sacrebleu set", "sacrebleu pair missing", "corpus too small to split", "unknown dataset",
    "a file as the dataset", "a file as a language model's dataset",
    "vocabulary past 32-bit ids", "empty corpus path", "empty validation path", "empty resume path",
    "empty cache path", "empty tracker name", "unknown extra", "extra unavailable here", "conflicting extras",
    "eager jax step",
    "eager step beside the compile extra", "batch size zero", "negative steps",
    "no beam", "no vocabulary", "no time to wait for the other processes",
    "a price in the environment that is no number",
    "negative length penalty", "steps and epochs", "endless epochs", "learning rate not a number",
    "weight decay not a number",
    "validation past the last step", "validation past the last step of the epochs",
    "sample length without a prompt", "trackers' folder without trackers",
    "beam search's option for a language model", "a column for a language model", "an extra twice",
    "beam past the preset's vocabulary", "beam past the vocabulary size", "endless samples",
    "beam search in a run that decodes nothing", "length penalty of greedy decoding", "no checkpoints kept", "target without evaluations",
    "unknown reporter", "a reporter of results as a tracker",
    "reporter of a broken plugin", "languages of a dataset's pairs", "a column of a dataset's pairs",
    "existing result", "overwrite of a file mtbench did not write", "output is a directory", "output is the corpus",
    "output is the validation file",
    "output is the initial weights", "output is the config file", "output names a new directory",
    "a clipping norm without clipping", "a dataset beside a corpus", "a validation size beside a validation file",
    "a test size beside a test file",
    "output empty", "a model family with an empty path", "output of blanks", "no report beside a report",
    "earlier hypotheses beside the output",
    "output under a file",
    "compile mode of an eager step", "compile mode on jax", "block too short", "empty block", "stride past the block",
    "token batch under a block",
    "negative profile",
    "seed out of range", "earlier run's checkpoints", "earlier run's saved model", "output where no file can be made",
    "resume a missing directory", "resume a directory that is not a run", "resume a finished run",
    "resume a run without checkpoints", "resume with other options", "config file missing", "config file not toml",
    "config key unknown", "config value of the wrong kind", "config value the flag refuses",
    "config value the run refuses", "config values the run refuses together",
    "config value the command line replaces", "run file beside other options",
    "run file of another format",
    "run file with an unknown key", "run file with a value of the wrong kind", "run file with extras as a name",
    "run file with a null cache folder", "empty initial weights"]


def snapshot(directory):
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    files[path] = f.read()
    return files


@pytest.fixture(scope="module")
def forked_cli(tmp_path_factory):
    """run_cli's `python -m mtbench ARGS`, forked (`forked_mtbench`; the refusals here end before keras is
    imported): returns the CompletedProcess. Its output files are in a folder of their own, outside the folder whose
    files a case must leave as they were."""
    forking = ForkingMtbench(str(tmp_path_factory.mktemp("forked-cli")), cli_environment())
    yield lambda *args, env=None, timeout=600: forking.run(*args, env=cli_environment(env), timeout=timeout)
    forking.close()


# The cases refused once keras is imported, where the device (a TPU) or the data batched (the steps an epoch takes)
# is known: each in a process started afresh, as `forked_cli` takes only what ends before the import.
AFTER_KERAS = {"extra unavailable here", "validation past the last step of the epochs"}


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_fails_with_one_clear_line(tmp_path, cache_dir, plugin_path, forked_cli, case):
    args, expected, env = cases(tmp_path, plugin_path)[case]
    before = snapshot(tmp_path)
    whole = "--resume" in args or "--run-file" in args  # the run's configuration comes from there alone
    common = [] if whole else ["--preset", "tiny", "--cache-dir", cache_dir]
    out_args = [] if "--out" in args or whole else ["--out", str(tmp_path / "result.json")]
    proc = (run_cli if case in AFTER_KERAS else forked_cli)("train", *common, *out_args, *args, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("Warning: ")]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "" not in proc.stdout.splitlines(), "an empty line on stdout before the error"
    assert snapshot(tmp_path) == before, "a failed run changed or removed a file that was already there"


def test_the_table_covers_every_case(tmp_path, plugin_path):
    assert sorted(cases(tmp_path, plugin_path)) == sorted(CASE_NAMES)


def other_commands_cases(t):
    """name -> (a command line of a command other than train, the error line must contain)."""
    out = ["--preset", "tiny", "--out", str(t / "c.json")]
    return {
        # it ran on without a word, and would print nothing until its last token
        "endless continuation": (["generate", str(t / "no-model.json"), "--prompt", "And", "--max-new-tokens",
                                  str(10 ** 20)], "Invalid value for '--max-new-tokens': 100000000000000000000 is not "
                                                  "in the range 1<=x<=100000"),
        # nothing read or wrote the folder: dropped without a word
        "a cache folder without calibration": (["env", "--cache-dir", str(t / "cache")], "--cache-dir is where "
                                               "--calibrate caches the peaks it measures; give --calibrate"),
        # read as the text '5', a run: "unknown backend '5'"
        "a config file's matrix of a number": (["compare", "--config", write(t / "number.toml", "matrix = 5\n"), *out],
                                               "number.toml: matrix must be a string or a list of strings, got an "
                                               "integer 5"),
        "a config file's backends of true": (["compare", "--config", write(t / "true.toml", "backends = true\n"),
                                              *out], "true.toml: backends must be a string or a list of strings, "
                                                     "got true/false True"),
    }


OTHER_CASE_NAMES = ["endless continuation", "a cache folder without calibration", "a config file's matrix of a number",
                    "a config file's backends of true"]


@pytest.mark.parametrize("case", OTHER_CASE_NAMES)
def test_bad_input_of_the_other_commands_fails_with_one_clear_line(tmp_path, forked_cli, case):
    args, expected = other_commands_cases(tmp_path)[case]
    before = snapshot(tmp_path)
    assert_refused_in_one_line(forked_cli(*args), expected)
    assert snapshot(tmp_path) == before


def test_the_other_commands_table_covers_every_case(tmp_path):
    assert sorted(other_commands_cases(tmp_path)) == sorted(OTHER_CASE_NAMES)


def test_compare_and_init_weights_refuse_to_write_over_what_they_read(tmp_path, cache_dir, forked_cli):
    """As train refuses, --overwrite or not: the corpus, and compare's --config file; nor does --overwrite
    replace a file of another kind than the command writes."""
    from conftest import assert_refused_in_one_line
    corpus = write(tmp_path / "pairs.tsv", GOOD_TSV)
    config = write(tmp_path / "run.toml", "steps = 3\n")
    before = snapshot(tmp_path)
    for command, options, out in [("compare", ["--config", config], corpus), ("compare", ["--config", config], config),
                                  ("init-weights", [], corpus)]:
        proc = forked_cli(command, *options, "--preset", "tiny", "--data", corpus, "--cache-dir", cache_dir,
                          "--out", out, "--overwrite")
        assert_refused_in_one_line(proc, f"{out}: is the file this command reads")
    # nor weights over a result
    result = write(tmp_path / "result.json", '{"status": "completed"}\n')
    proc = forked_cli("init-weights", "--preset", "tiny", "--data", corpus, "--cache-dir", cache_dir, "--out", result,
                      "--overwrite")
    assert_refused_in_one_line(proc, "result.json: is no .npz file, as mtbench writes")
    assert snapshot(tmp_path) == {**before, result: b'{"status": "completed"}\n'}


def test_debug_shows_the_traceback(tmp_path, cache_dir, forked_cli):
    proc = forked_cli("train", "--backend", "nonesuch", "--debug", "--cache-dir", cache_dir)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "unknown backend 'nonesuch'" in proc.stderr


def test_a_failure_of_mtbench_itself_says_where_debug_goes():
    """`mtbench --debug report` is refused (No such option): the hint names the command whose option it is."""
    import click
    from click.testing import CliRunner

    from mtbench.cli import handle_errors

    @click.command("report")
    @handle_errors
    def failing():
        raise ValueError("a bug")
    result = CliRunner().invoke(failing, [])
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr == "Error: ValueError: a bug (rerun with `mtbench report ... --debug` for the traceback)\n"
    assert "Traceback" in CliRunner().invoke(failing, ["--debug"]).stderr


def test_a_second_run_on_the_result_path_of_one_training_is_refused(tmp_path, cache_dir):
    """Two runs on one --out (two terminals, two jobs, a resume of a run still training) wrote over each other's
    checkpoints and result, the last to end passing for both; and --overwrite emptied the first's run folder."""
    from mtbench.runner.results.output import holding_result_path
    out = tmp_path / "r.json"
    out.write_text('{"an": "earlier result"}\n')
    with holding_result_path(str(out)):  # as a run training there holds it
        assert (tmp_path / "r.json.lock").read_text() == f"{os.getpid()}\n"
        proc = run_cli("train", "--backend", "jax", "--preset", "tiny", "--steps", "2", "--cache-dir", cache_dir,
                       "--out", str(out), "--overwrite")
        with pytest.raises(MtbenchError, match=r"another mtbench run \(process \d+\) is writing it"):
            with holding_result_path(str(out)):
                pass
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"Error: {out}: another mtbench run (process {os.getpid()}) is writing it; wait for it to end, or give "
        f"another --out"]
    assert out.read_text() == '{"an": "earlier result"}\n' and not (tmp_path / "r.run").exists()
    assert sorted(os.listdir(tmp_path)) == ["r.json"]  # the lock goes with the run that held it
    with holding_result_path(str(out)):  # and is taken again
        pass


def test_unreadable_file_names_the_file_and_the_reason(tmp_path, monkeypatch):
    """Root reads a chmod 000 file anyway, so the refusal comes from a patched open."""
    from mtbench.runner.data import formats
    path = write(tmp_path / "locked.tsv", GOOD_TSV)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(formats, "open", refuse, raising=False)
    with pytest.raises(MtbenchError, match=r"locked.tsv: cannot read: Permission denied"):
        formats.read_tsv(path)


def test_read_only_output_directory_is_refused_before_training(tmp_path, monkeypatch):
    from mtbench.runner.results.output import check_output_path
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(MtbenchError, match=r"r.json: cannot write into .*: permission denied or read-only"):
        check_output_path(str(tmp_path / "r.json"), overwrite=False)


def test_full_disk_is_a_clear_failure_and_keeps_the_earlier_file(tmp_path, monkeypatch):
    from mtbench.runner import files
    path = tmp_path / "result.json"
    files.write_json_atomic(str(path), {"earlier": True})

    def disk_full(fd):  # where a full disk often shows: the data cannot be flushed to it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(RunFailure, match=r"result.json: cannot write: No space left on device"):
        files.write_json_atomic(str(path), {"later": True})
    assert json.loads(path.read_text()) == {"earlier": True}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
