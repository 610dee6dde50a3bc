"""Reading parallel corpora in the formats users have: TSV, Moses pairs and Hugging Face JSONL (each may be
gzip-compressed, told by a `.gz` suffix), and sacrebleu's test sets from its local cache.

Readers return every pair, empty sides included: dropping and counting them is the corpus report's job. Every
problem is one `MtbenchError` naming the file, the line and what is wrong.
"""

import difflib
import gzip
import json
import os
import re
import stat
import zlib
from dataclasses import dataclass

from mtbench.errors import MtbenchError

SACREBLEU_PREFIX = "sacrebleu:"
# A sentence is one line of the files a run writes it to (the references beside a result, which sacrebleu and other
# tools read line by line; a dataset's cache): one holding a line break would be read back as two, the lines of the
# references and hypotheses no longer matching.
LINE_BREAKS = (("\n", "a line break"), ("\r", "a carriage return"))
# The suffix of a Moses file: a language code as corpora name their sides (en, fr, pt_br, sr-Latn).
LANGUAGE_SUFFIX = re.compile(r"[A-Za-z]{2,3}(?:[_-][A-Za-z0-9]{2,8})?")
# Suffixes of that shape that name what a file holds, not a language.
KIND_SUFFIXES = {"txt", "tsv", "csv", "xml", "sgm", "json", "log", "out", "bin", "dat", "npz", "zip", "tar", "bz2",
                 "xz", "md", "toml", "yml", "py", "sh"}


@dataclass(frozen=True)
class ReadOptions:
    """How to read a corpus: TSV columns (1-based, as `cut -f` counts) and language codes (JSONL keys, Moses
    file suffixes, sacrebleu language pair)."""
    src_col: int = 1
    tgt_col: int = 2
    src_lang: str = None
    tgt_lang: str = None

    def __post_init__(self):
        for flag, column in (("--src-col", self.src_col), ("--tgt-col", self.tgt_col)):
            if column < 1:  # a column 0 would read the last one, as Python counts from the end
                raise MtbenchError(f"{flag} must be at least 1, got {column}")
        if self.src_col == self.tgt_col:
            raise MtbenchError(f"--src-col and --tgt-col are both {self.src_col}; they must differ")
        if bool(self.src_lang) != bool(self.tgt_lang):
            raise MtbenchError("give both --src-lang and --tgt-lang, or neither")
        if self.src_lang and self.src_lang == self.tgt_lang:
            raise MtbenchError(f"--src-lang and --tgt-lang are both '{self.src_lang}'; they must differ")

    @property
    def languages(self):
        return (self.src_lang, self.tgt_lang) if self.src_lang and self.tgt_lang else None


def _strip_gz(path):
    return path[:-3] if path.endswith(".gz") else path


def _existing_variant(path):
    """`path`, or `path.gz` when only the compressed file exists."""
    if not os.path.lexists(path) and os.path.lexists(path + ".gz"):
        return path + ".gz"
    return path


def moses_files(prefix, options):
    return tuple(_existing_variant(f"{prefix}.{lang}") for lang in options.languages)


def detect_format(spec, options):
    """The format of a corpus argument: `sacrebleu:NAME`, a `.tsv` or `.jsonl` file (optionally `.gz`), a Moses
    prefix (with --src-lang/--tgt-lang, a path that is not itself a file: PREFIX.SRC and PREFIX.TGT are read),
    and any other file is read as TSV."""
    if spec.startswith(SACREBLEU_PREFIX):
        return "sacrebleu"
    name = _strip_gz(spec)
    if name.endswith(".tsv"):
        return "tsv"
    if name.endswith(".jsonl"):
        return "jsonl"
    if options.languages and not os.path.lexists(spec):
        return "moses"  # a missing side is reported by its file name when reading
    return "tsv"


def describe(spec, options):
    """Where the pairs come from, in words (for the result JSON)."""
    kind = detect_format(spec, options)
    if kind == "sacrebleu":
        return f"sacrebleu test set {spec[len(SACREBLEU_PREFIX):]} {'-'.join(options.languages or ())}"
    if kind == "moses":
        return "Moses pair " + " + ".join(os.path.abspath(f) for f in moses_files(spec, options))
    return f"{kind.upper()} file {os.path.abspath(spec)}"


def read_pairs(spec, options):
    """(source, target) pairs of a corpus argument, in file order."""
    kind = detect_format(spec, options)
    if kind == "tsv":
        try:
            return read_tsv(spec, options.src_col, options.tgt_col)
        except MtbenchError as error:
            hint = moses_hint(spec, options)
            if hint:
                raise MtbenchError(f"{error}; {hint}", error.exit_code) from None
            raise
    needs_languages(spec, kind, options)
    if kind == "jsonl":
        return read_jsonl(spec, *options.languages)
    if kind == "moses":
        return read_aligned_files(*moses_files(spec, options))
    return read_sacrebleu(spec[len(SACREBLEU_PREFIX):], *options.languages)


def needs_languages(spec, kind, options):
    if not options.languages:
        what = {"jsonl": "the keys of its translation objects", "sacrebleu": "the language pair",
                "moses": "the file suffixes"}[kind]
        raise MtbenchError(f"{spec}: a {kind} corpus needs --src-lang and --tgt-lang ({what})")


def moses_sides(prefix):
    """{language code: file} of the files PREFIX.CODE (or PREFIX.CODE.gz) beside `prefix`: the sides of a Moses pair
    it may be the prefix of."""
    directory, base = os.path.split(prefix)
    try:
        names = sorted(os.listdir(directory or "."))
    except OSError:
        return {}
    sides = {}
    for name in names:
        stem = _strip_gz(name)
        code = stem[len(base) + 1:] if stem.startswith(base + ".") else ""
        if LANGUAGE_SUFFIX.fullmatch(code) and code.lower() not in KIND_SUFFIXES:
            sides.setdefault(code, os.path.join(directory, name))
    return sides


def moses_hint(spec, options):
    """How to give a Moses pair, where a file read as TSV looks meant as one (PREFIX.en given, PREFIX.fr beside it)
    or a path that does not exist is the prefix of one; else ''."""
    if os.path.lexists(spec):
        prefix, dot, code = _strip_gz(spec).rpartition(".")
        sides = moses_sides(prefix) if dot else {}
        others = [side for side in sides if side != code]
        if code not in sides or not others or (options.languages and not set(options.languages) <= set(sides)):
            return ""
        beside = ", ".join(sides[side] for side in others)
        return (f"{spec} is one side of a Moses pair ({beside} beside it): give their prefix, {prefix}, with "
                f"{_languages_text(options, sides)}")
    sides = moses_sides(spec)
    if len(sides) < 2:
        return ""
    files = list(sides.values())
    return (f"{', '.join(files[:-1])} and {files[-1]} exist: a Moses pair is given as their prefix with "
            f"{_languages_text(options, sides)}")


def _languages_text(options, sides):
    if options.languages:
        return f"--src-lang {options.src_lang} --tgt-lang {options.tgt_lang}"
    return f"--src-lang and --tgt-lang ({'two of ' if len(sides) > 2 else ''}{', '.join(sides)})"


def one_line(sentence, where, side):
    """`sentence`, refused where it holds a line break (`LINE_BREAKS`); `where` is its file and line."""
    found = next((name for character, name in LINE_BREAKS if character in sentence), None)
    if found:
        raise MtbenchError(f"{where}: the {side} sentence holds {found} ({sentence[:40]!r}...): give each sentence on "
                           f"one line")
    return sentence


def check_readable(path, expected="a corpus file"):
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise MtbenchError(f"{path}: no such file") from None
    except NotADirectoryError:
        raise MtbenchError(f"{path}: no such file (a parent of it is a file, not a directory)") from None
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}") from None
    if stat.S_ISDIR(mode):
        raise MtbenchError(f"{path}: is a directory, expected {expected}")
    if not stat.S_ISREG(mode):
        # A FIFO or device would block or never end; a corpus is a regular file.
        raise MtbenchError(f"{path}: not a regular file (a pipe or a device); give a file")


def numbered_lines(path):
    """Yields (line number, text) of a UTF-8 text file, gunzipped when its name ends in `.gz`. Lines are split
    on newlines only (not on the Unicode separators str.splitlines knows), without the line ending."""
    check_readable(path)
    opener = gzip.open if path.endswith(".gz") else open
    number = 0
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    yield number, text_line(raw, number)
                except UnicodeDecodeError as error:
                    raise MtbenchError(f"{path}:{number}: not valid UTF-8 (byte {error.start + 1})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise MtbenchError(f"{path}:{number + 1}: not a valid gzip file ({error})") from None
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}") from None


def text_line(raw, number):
    """Line `number` (from 1) of UTF-8 text read in binary, split on "\\n" alone: without its line ending (a CRLF's
    "\\r" too) and, on the first line, a byte order mark. Raises UnicodeDecodeError."""
    line = raw.rstrip(b"\n").decode("utf-8").rstrip("\r")
    return line.lstrip("\ufeff") if number == 1 else line


def read_tsv(path, src_col=1, tgt_col=2):
    """Tab-separated pairs; every line must have as many columns as the first, so a stray tab inside a sentence
    cannot shift the columns unnoticed. A blank line counts as a pair with empty sides."""
    needed = max(src_col, tgt_col)
    width = None
    pairs = []
    for number, line in numbered_lines(path):
        if not line.strip():
            pairs.append(("", ""))
            continue
        columns = line.split("\t")
        if width is None:
            if len(columns) < needed:
                raise MtbenchError(f"{path}:{number}: expected at least {needed} tab-separated columns "
                                   f"(--src-col {src_col}, --tgt-col {tgt_col}), found {len(columns)}")
            width = len(columns)
        elif len(columns) != width:
            raise MtbenchError(f"{path}:{number}: expected {width} tab-separated columns like the first line, "
                               f"found {len(columns)}")
        pairs.append((one_line(columns[src_col - 1].strip(), f"{path}:{number}", "source"),
                      one_line(columns[tgt_col - 1].strip(), f"{path}:{number}", "target")))
    if not pairs:
        raise MtbenchError(f"{path}: the file is empty")
    return pairs


def read_jsonl(path, src_lang, tgt_lang):
    """Hugging Face's translation layout: one `{"translation": {"en": "...", "fr": "..."}}` object a line."""
    pairs = []
    for number, line in numbered_lines(path):
        if not line.strip():
            pairs.append(("", ""))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise MtbenchError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        translation = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(translation, dict):
            raise MtbenchError(f'{path}:{number}: no "translation" object; expected '
                               f'{{"translation": {{"{src_lang}": ..., "{tgt_lang}": ...}}}}')
        sides = []
        for side, lang in (("source", src_lang), ("target", tgt_lang)):
            if lang not in translation:
                raise MtbenchError(f'{path}:{number}: the translation has no "{lang}" '
                                   f'(it has: {", ".join(map(str, translation)) or "nothing"})')
            if not isinstance(translation[lang], str):
                raise MtbenchError(f'{path}:{number}: "{lang}" is a {type(translation[lang]).__name__}, '
                                   "not a string")
            # An escaped line break ("\n") is a JSON string's own: one line of the file, two of the references.
            sides.append(one_line(translation[lang].strip(), f"{path}:{number}", f'{side} ("{lang}")'))
        pairs.append(tuple(sides))
    if not pairs:
        raise MtbenchError(f"{path}: the file is empty")
    return pairs


def read_aligned_files(source_path, target_path):
    """Line n of one file translates line n of the other (Moses layout, and sacrebleu's cache)."""
    # A lone carriage return, which splitting on "\n" leaves inside a line, is a line break to other readers.
    sources = [one_line(line.strip(), f"{source_path}:{number}", "source")
               for number, line in numbered_lines(source_path)]
    targets = [one_line(line.strip(), f"{target_path}:{number}", "target")
               for number, line in numbered_lines(target_path)]
    for path, lines in ((source_path, sources), (target_path, targets)):
        if not lines:
            raise MtbenchError(f"{path}: the file is empty")
    if len(sources) != len(targets):
        (short, short_lines), (long, long_lines) = sorted(
            ((source_path, sources), (target_path, targets)), key=lambda item: len(item[1]))
        raise MtbenchError(f"{short}:{len(short_lines) + 1}: missing line: {short} has {len(short_lines)} lines "
                           f"but {long} has {len(long_lines)}; line n of one must translate line n of the other")
    return list(zip(sources, targets))


def sacrebleu_files(name, src_lang, tgt_lang):
    """The cached source and first-reference files of a sacrebleu test set, as sacrebleu itself lays them out
    ($SACREBLEU or ~/.sacrebleu). Nothing is downloaded: a set that is not cached is an error saying how to get
    it."""
    from sacrebleu.dataset import DATASETS
    from sacrebleu.utils import SACREBLEU_DIR
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise MtbenchError(f"unknown sacrebleu test set '{name}'{hint}")
    dataset = DATASETS[name]
    langpair = f"{src_lang}-{tgt_lang}"
    if langpair not in dataset.langpairs:
        raise MtbenchError(f"sacrebleu test set '{name}' has no {langpair}; it has {', '.join(dataset.langpairs)}")
    # get_files() would download what is missing; the paths alone come from the same sacrebleu method it uses. The
    # source's path needs no field names, so a set not cached is refused before anything that may download.
    files = [dataset._get_txt_file_path(langpair, "src")]
    if os.path.isfile(files[0]):
        files.append(dataset._get_txt_file_path(langpair, first_reference(dataset, langpair)))
    missing = [path for path in files if not os.path.isfile(path)]
    if missing:
        raise MtbenchError(f"sacrebleu test set {name} {langpair} is not in sacrebleu's cache {SACREBLEU_DIR} "
                           f"({missing[0]} is missing) and mtbench never downloads; fetch it once on a machine "
                           f"with a network: sacrebleu -t {name} -l {langpair} --echo src > /dev/null")
    return files


def first_reference(dataset, langpair):
    """The field of the first reference sacrebleu scores a language pair against (one only: a test pair has one
    target). A set in WMT's XML (wmt21 on) names the references it scores against in its metadata; its fieldnames()
    would parse the raw XML, downloading it first, even where the text files are cached."""
    from sacrebleu.dataset.wmt_xml import WMTXMLDataset
    if isinstance(dataset, WMTXMLDataset):
        return next(iter(dataset._get_langpair_allowed_refs(langpair)), "ref")
    return next(field for field in dataset.fieldnames(langpair) if field.startswith("ref"))


def read_sacrebleu(name, src_lang, tgt_lang):
    return read_aligned_files(*sacrebleu_files(name, src_lang, tgt_lang))
