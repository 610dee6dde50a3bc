"""A MarianMT checkpoint's own tokenization, id for id as transformers' `MarianTokenizer` gives it: each side
has its sentencepiece model (source.spm, target.spm) whose pieces are looked up in vocab.json (Marian's ids are
not sentencepiece's), with target_vocab.json for the target where the two sides have separate vocabularies.

What transformers does around sentencepiece, and this does too: the special tokens (</s>, <unk>, <pad>, any
extra ones the tokenizer config names) written in the text are cut out and kept as themselves; a language code
at the start of a piece of text (`>>fra<<`, which multilingual models read to pick the target language) is kept
as one token instead of going through sentencepiece; a piece vocab.json lacks becomes <unk>. Decoding drops the
special ids and joins the pieces with sentencepiece, as `decode(ids, skip_special_tokens=True)` does."""

import hashlib
import json
import os
import re
import shutil

from mtbench import MtbenchError, SpecialTokens, Tokenizer
from mtbench.plugins.models import marian_checkpoint as checkpoint

SPIECE_UNDERLINE = "\u2581"
DEFAULT_SPECIAL_TOKENS = {"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}
FINGERPRINT_VERSION = "marian-tokenizer-v1"


def _token_text(token):
    """A special token as tokenizer configs write it: a string or an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else token


def split_language_code(text):
    """(code or None, rest) of text that starts with a language code like `>>fra<<`."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return text[:end + 2], text[end + 2:]
    return None, text


def clean_up_tokenization(text):
    """transformers' optional clean-up of spaces before punctuation and English contractions."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


class _Side:
    """One side's sentencepiece model and vocabulary."""

    def __init__(self, spm_path, vocab_path, unk_token):
        import sentencepiece
        self.spm = sentencepiece.SentencePieceProcessor(model_file=spm_path)
        with open(vocab_path, encoding="utf-8") as f:
            self.vocab = json.load(f)
        if unk_token not in self.vocab:
            raise MtbenchError(f"{vocab_path} has no entry for the unknown token {unk_token}")
        self.unk_id = self.vocab[unk_token]


class MarianTokenizer(Tokenizer):
    """The tokenizer of the MarianMT model `directory`; its special ids are those of the model's config.json,
    which both vocabularies must agree with."""

    def __init__(self, directory):
        config = checkpoint.read_config(directory)
        tokenizer_config = checkpoint.read_tokenizer_config(directory)
        self.directory = directory
        self.separate_vocabs = bool(tokenizer_config.get("separate_vocabs", False))
        self.clean_up_spaces = bool(tokenizer_config.get("clean_up_tokenization_spaces", False))
        self.files = checkpoint.tokenizer_files(directory, self.separate_vocabs)
        names = {key: _token_text(tokenizer_config.get(key) or default)
                 for key, default in DEFAULT_SPECIAL_TOKENS.items()}
        self.unk_token = names["unk_token"]
        target_vocab = self.files[checkpoint.TARGET_VOCAB if self.separate_vocabs else checkpoint.VOCAB]
        self.source = _Side(self.files[checkpoint.SOURCE_SPM], self.files[checkpoint.VOCAB], self.unk_token)
        self.target = _Side(self.files[checkpoint.TARGET_SPM], target_vocab, self.unk_token)
        self.special_ids = self._special_ids(tokenizer_config, list(names.values()))
        # transformers leaves out of the decoded text every special id, <unk> included.
        self.skipped_ids = set(self.special_ids.values())
        self._added_tokens = {int(i): _token_text(t) for i, t in
                              (tokenizer_config.get("added_tokens_decoder") or {}).items()}
        # Added tokens are cut out of the text and kept whole, special or not.
        self.added_ids = {**{token: i for i, token in self._added_tokens.items()}, **self.special_ids}
        self._id_to_piece = {i: piece for piece, i in self.target.vocab.items()}
        # transformers joins the pieces of a shared vocabulary with the source side's sentencepiece model.
        self._joiner = self.target.spm if self.separate_vocabs else self.source.spm
        longest_first = sorted(self.added_ids, key=len, reverse=True)
        self._added_pattern = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")

        eos = config.get("eos_token_id", checkpoint.CONFIG_DEFAULTS["eos_token_id"])
        self.special = SpecialTokens(pad=checkpoint.setting(config, "pad_token_id"),
                                     eos=eos[0] if isinstance(eos, list) else eos,
                                     start=checkpoint.setting(config, "decoder_start_token_id"))
        self._check_special_ids(names)
        self.vocab_size = max(self.target.vocab.values()) + 1
        self.fingerprint = self._fingerprint()

    def _special_ids(self, tokenizer_config, tokens):
        """{special token: id}: the ids tokenizer_config.json assigns, else those of vocab.json."""
        extra = tokenizer_config.get("extra_special_tokens") or tokenizer_config.get("additional_special_tokens")
        tokens = tokens + [_token_text(t) for t in (extra.values() if isinstance(extra, dict) else extra or ())]
        assigned = {_token_text(t): int(i) for i, t in (tokenizer_config.get("added_tokens_decoder") or {}).items()}
        ids = {}
        for token in tokens:
            if token in assigned:
                ids[token] = assigned[token]
            elif token in self.source.vocab:
                ids[token] = self.source.vocab[token]
            else:
                raise MtbenchError(f"{self.files[checkpoint.VOCAB]} has no entry for the special token {token}")
        return ids

    def _check_special_ids(self, names):
        """mtbench pads and ends both sides with the config's ids: the vocabularies must agree with them."""
        for key, wanted in (("pad_token", self.special.pad), ("eos_token", self.special.eos)):
            token = names[key]
            sides = [(checkpoint.VOCAB, self.source.vocab)]
            if self.separate_vocabs:
                sides.append((checkpoint.TARGET_VOCAB, self.target.vocab))
            for name, vocab in sides:
                if vocab.get(token) != wanted:
                    raise MtbenchError(f"{os.path.join(self.directory, name)} gives {token} the id "
                                       f"{vocab.get(token)}, its config.json {wanted}: mtbench needs them equal")

    def _fingerprint(self):
        digest = hashlib.sha256(FINGERPRINT_VERSION.encode())
        for name in sorted(self.files):
            with open(self.files[name], "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
        digest.update(json.dumps([self.special.to_dict(), self.special_ids, self.separate_vocabs,
                                  self.clean_up_spaces], sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def _encode(self, text, side):
        ids = []
        for chunk in self._added_pattern.split(text):
            if not chunk:
                continue
            if chunk in self.added_ids:
                ids.append(self.added_ids[chunk])
                continue
            code, rest = split_language_code(chunk)
            pieces = ([code] if code else []) + side.spm.encode(rest, out_type=str)
            ids.extend(side.vocab.get(piece, side.unk_id) for piece in pieces)
        return ids

    def encode_source(self, sentences):
        return [self._encode(sentence, self.source) for sentence in sentences]

    def encode_target(self, sentences):
        return [self._encode(sentence, self.target) for sentence in sentences]

    def _piece(self, index):
        if index in self._added_tokens:
            return self._added_tokens[index]
        if index in self._id_to_piece:
            return self._id_to_piece[index]
        # transformers asks sentencepiece for ids vocab.json lacks.
        if 0 <= index < self._joiner.get_piece_size():
            return self._joiner.id_to_piece(index) or self.unk_token
        return self.unk_token

    def decode(self, ids_batch):
        sentences = []
        for ids in ids_batch:
            pieces = [self._piece(int(i)) for i in ids if int(i) not in self.skipped_ids]
            text = self._joiner.decode_pieces(pieces).replace(SPIECE_UNDERLINE, " ").strip()
            sentences.append(clean_up_tokenization(text) if self.clean_up_spaces else text)
        return sentences

    def save(self, directory):
        """The tokenizer's files and config.json (its special ids), as in the model directory."""
        os.makedirs(directory, exist_ok=True)
        names = [*self.files, checkpoint.CONFIG, checkpoint.TOKENIZER_CONFIG, checkpoint.SPECIAL_TOKENS_MAP]
        for name in names:
            source = os.path.join(self.directory, name)
            target = os.path.join(directory, name)
            if os.path.isfile(source) and not (os.path.exists(target) and os.path.samefile(source, target)):
                shutil.copyfile(source, target)
