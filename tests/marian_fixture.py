"""A tiny random MarianMT checkpoint, written by `transformers` itself, so the tests load exactly what a real
model directory holds (config.json, weights, source.spm/target.spm, vocab.json, tokenizer_config.json).

Like the Helsinki-NLP models, vocab.json is not aligned with the sentencepiece ids (its own order, </s> first and
<pad> last), holds language codes (>>fra<<) that sentencepiece never produces, and leaves out a piece the target
sentencepiece model knows (so some text maps to <unk>). The weights are redrawn wider than transformers' 0.02 so
that logits differ clearly between tokens: greedy decoding then compares choices, not rounding. As in
Helsinki-NLP's checkpoints, generation_config.json forbids generating <pad> (`bad_words_ids`)."""

import io
import json
import os
import tempfile

# English/French pairs built from a small grammar: enough text for two small sentencepiece models.
_SUBJECTS = [("the cat", "le chat"), ("my brother", "mon frère"), ("the old woman", "la vieille femme"),
             ("our teacher", "notre professeur"), ("a child", "un enfant"), ("the king", "le roi"),
             ("her friend", "son amie"), ("the farmer", "le fermier")]
_VERBS = [("sees", "voit"), ("loves", "aime"), ("eats", "mange"), ("finds", "trouve"), ("wants", "veut"),
          ("brings", "apporte"), ("hides", "cache")]
_OBJECTS = [("the bread", "le pain"), ("a red apple", "une pomme rouge"), ("the small house", "la petite maison"),
            ("some water", "de l'eau"), ("the green book", "le livre vert"), ("a black dog", "un chien noir")]
_ENDINGS = [(".", "."), (" today.", " aujourd'hui."), (" in the morning!", " le matin !"), ("?", " ?")]

LANGUAGE_CODES = (">>fra<<", ">>spa<<")
# vocab.json leaves out the longest target piece of this word, so that text containing it yields <unk>.
WORD_WITH_MISSING_PIECE = "aujourd'hui"


def parallel_sentences():
    pairs = []
    for i, (subject, verb, obj) in enumerate((s, v, o) for s in _SUBJECTS for v in _VERBS for o in _OBJECTS):
        if i % 2:  # every other combination: ~170 pairs
            continue
        ending = _ENDINGS[(i // 2) % len(_ENDINGS)]
        english = f"{subject[0]} {verb[0]} {obj[0]}{ending[0]}"
        french = f"{subject[1]} {verb[1]} {obj[1]}{ending[1]}"
        pairs.append((english[0].upper() + english[1:], french[0].upper() + french[1:]))
    return pairs


def _train_sentencepiece(sentences, path, vocab_size):
    """`vocab_size` is an upper bound (the grammar has few words)."""
    import sentencepiece
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                             vocab_size=vocab_size, hard_vocab_limit=False, model_type="unigram",
                                             character_coverage=1.0, minloglevel=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())


def _pieces(spm_path):
    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())
            if not (processor.is_control(i) or processor.is_unknown(i))]


def _encode_pieces(spm_path, text):
    import sentencepiece
    return sentencepiece.SentencePieceProcessor(model_file=spm_path).encode(text, out_type=str)


def _vocabulary(pieces, left_out, codes=(), pad_last=True):
    """Marian's layout: </s> 0, <unk> 1, then the pieces in an order of its own, <pad> last (or third, where
    two vocabularies of different sizes must agree on it)."""
    pieces = sorted(set(pieces) - {left_out}, reverse=True)
    ordered = ["</s>", "<unk>", *codes, *pieces, "<pad>"] if pad_last else ["</s>", "<unk>", "<pad>", *codes, *pieces]
    return {token: index for index, token in enumerate(dict.fromkeys(ordered))}


def _write_json(data, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


def _redraw_weights(model, seed, pad, eos):
    """Weights that make decoding worth comparing: a wide feed-forward part (so the next token depends on the
    previous one and the position, not only the source), a non-zero final_logits_bias in which padding stands
    out (a decoder that failed to forbid it would choose it) and the end of sentence is likely enough that some
    sentences end early."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:  # the fixed sinusoids, which the checkpoint does not hold
                continue
            noise = torch.randn(parameter.shape, generator=generator) * (1.0 if ".fc" in name else 0.3)
            parameter.copy_(1.0 + noise if "layer_norm.weight" in name else noise)
        bias = torch.randn(model.final_logits_bias.shape, generator=generator) * 0.5
        bias[0, pad] += 8.0
        bias[0, eos] += 1.6
        model.final_logits_bias.copy_(bias)


def build_checkpoint(directory, separate_vocabs=False, seed=0, **config_overrides):
    """Writes a tiny random MarianMT model directory with transformers' own `save_pretrained`; returns the torch
    model (eval mode) and transformers' tokenizer, the references the tests compare against. `seed` draws the
    weights.

    `separate_vocabs` gives the source and the target their own vocabulary files and embeddings (as
    Helsinki-NLP's opus-mt-tc models have)."""
    from transformers import MarianTokenizer

    with tempfile.TemporaryDirectory() as work:
        model = _write_checkpoint(directory, work, separate_vocabs, seed, config_overrides)
    return model, MarianTokenizer.from_pretrained(directory)


def copy_with_torch_weights(directory, model, target):
    """A copy of the checkpoint `directory` whose weights are a pytorch_model.bin as transformers 4 wrote it
    (`safe_serialization=False`; transformers 5 writes only safetensors): the whole state dict, tied copies of the
    embeddings and the fixed position tables included."""
    import shutil

    import torch
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(directory):
        if name != "model.safetensors":
            shutil.copyfile(os.path.join(directory, name), os.path.join(target, name))
    torch.save(model.state_dict(), os.path.join(target, "pytorch_model.bin"))
    return target


def _write_checkpoint(directory, work, separate_vocabs, seed, config_overrides):
    """Trains the sentencepiece models and writes the vocabularies into `work`, then the checkpoint into
    `directory`; returns the torch model."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    pairs = parallel_sentences()
    source_spm, target_spm = os.path.join(work, "source.spm"), os.path.join(work, "target.spm")
    _train_sentencepiece([english for english, _ in pairs], source_spm, 90)
    _train_sentencepiece([french for _, french in pairs], target_spm, 100)
    source_pieces, target_pieces = _pieces(source_spm), _pieces(target_spm)
    left_out = max(_encode_pieces(target_spm, WORD_WITH_MISSING_PIECE), key=len)
    tokenizer_files = {"source_spm": source_spm, "target_spm": target_spm}
    if separate_vocabs:
        # One <pad> id for both sides: the config has one pad_token_id, for the source mask and the decoder start.
        source_vocab = _vocabulary(source_pieces, left_out, pad_last=False)
        target_vocab = _vocabulary(target_pieces, left_out, LANGUAGE_CODES, pad_last=False)
        tokenizer_files["vocab"] = os.path.join(work, "vocab.json")
        tokenizer_files["target_vocab_file"] = os.path.join(work, "target_vocab.json")
        _write_json(source_vocab, tokenizer_files["vocab"])
        _write_json(target_vocab, tokenizer_files["target_vocab_file"])
        sizes = {"vocab_size": len(source_vocab), "decoder_vocab_size": len(target_vocab),
                 "share_encoder_decoder_embeddings": False}
        special_vocab = target_vocab
    else:
        vocab = _vocabulary(source_pieces + target_pieces, left_out, LANGUAGE_CODES)
        tokenizer_files["vocab"] = os.path.join(work, "vocab.json")
        _write_json(vocab, tokenizer_files["vocab"])
        sizes = {"vocab_size": len(vocab)}
        special_vocab = vocab
    tokenizer = MarianTokenizer(**tokenizer_files, separate_vocabs=separate_vocabs, source_lang="en",
                                target_lang="fr")

    pad, eos = special_vocab["<pad>"], special_vocab["</s>"]
    settings = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                    decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                    activation_function="swish", scale_embedding=True, dropout=0.1, attention_dropout=0.0,
                    activation_dropout=0.0, pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad,
                    forced_eos_token_id=eos, **sizes)
    settings.update(config_overrides)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**settings))
    _redraw_weights(model, seed=seed, pad=pad, eos=eos)
    # As Helsinki-NLP's checkpoints do: Marian never generates padding, its decoder's start token.
    model.generation_config.bad_words_ids = [[pad]]
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model
