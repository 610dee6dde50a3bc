"""A language model's continuation of a prompt, one token at a time, as `mtbench generate` and the
--sample-prompt of training draw it."""

import numpy as np

# nanoGPT's sample.py: what a person sees of a model while it trains.
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 200


def numpy_logits(model, compile_inference):
    """x -> the model's logits as numpy, through the backend's compiled inference (`Backend.compile_inference`,
    bound to the model as `Task.evaluator` receives it): the `forward` a continuation reads."""
    from keras import ops
    compiled = compile_inference(lambda x: model(x, training=False))
    return lambda x: ops.convert_to_numpy(compiled(x))


def continuation(forward, ids, block, new_tokens, temperature, top_k, rng, text_ids=None, unknown=None):
    """The `new_tokens` token ids after `ids`: each from the logits `forward` (a compiled call on one row of
    `block` token ids, returning numpy logits: `numpy_logits`) gives at the last position of the last `block` tokens,
    greedily (`temperature` 0) or drawn by `rng` from the softmax of logits / `temperature`, restricted to the
    `top_k` most likely tokens; `text_ids`: how many ids, from 0, stand for text (`drawable_ids`), the rows past
    them (a padded vocabulary's) never taken; `unknown`: the id unknown text is read as (`unknown_id`), never taken
    either."""
    generated = []
    for _ in range(new_tokens):
        window = (list(ids) + generated)[-block:]
        x = np.zeros((1, block), np.int32)  # one shape: compiled once; causality keeps the padding after unseen
        x[0, :len(window)] = window
        logits = np.asarray(forward(x))[0, len(window) - 1].astype(np.float64)
        if text_ids is not None:
            logits = logits[:text_ids]
        if unknown is not None:
            logits[unknown] = -np.inf
        generated.append(next_token(logits, temperature, top_k, rng))
    return generated


def drawable_ids(tokenizer):
    """How many ids of `tokenizer`, from 0, stand for text (its `text_ids()`: a byte vocabulary padded to GPT-2's
    50,304 rows has 256), or None: every id."""
    text_ids = getattr(tokenizer, "text_ids", None)
    return text_ids() if callable(text_ids) else None


def unknown_id(tokenizer):
    """The id `tokenizer` reads text it does not know as (a character tokenizer's <unk>, which nanoGPT's vocabulary
    has not), or None: no training text is it and it decodes to a replacement character, so no sample draws it."""
    return getattr(tokenizer, "unknown_id", None)


def continued_text(tokenizer, ids, generated):
    """The text that `generated` adds to the prompt's `ids`: decoded with them, less the prompt's own text, so that a
    piece that begins a word after the prompt (sentencepiece's '▁', a space only inside a text) keeps its space; the
    continuation decoded alone where the prompt's text is not how the whole begins."""
    prompt, whole = tokenizer.decode_text(list(ids)), tokenizer.decode_text(list(ids) + list(generated))
    return whole[len(prompt):] if whole.startswith(prompt) else tokenizer.decode_text(list(generated))


def next_token(logits, temperature, top_k, rng):
    """The next token of `logits` (the vocabulary's, float64): the largest at temperature 0, else drawn."""
    if temperature == 0:
        return int(np.argmax(logits))
    # Less the largest first: divided by a tiny temperature, the logits themselves would overflow to infinity. The
    # others may still go to minus infinity, which is what they mean there: never drawn.
    with np.errstate(over="ignore"):
        logits = (logits - logits.max()) / temperature
    if top_k:
        kth = np.sort(logits)[-min(top_k, len(logits))]
        logits = np.where(logits < kth, -np.inf, logits)
    probabilities = np.exp(logits - logits.max())
    return int(rng.choice(len(logits), p=probabilities / probabilities.sum()))


# C0 and C1 control characters (DEL too) but the line break and the tab, which a text's layout needs.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) not in "\n\t"}


def printable(text):
    """`text` as a terminal or a log can show it: its control characters written as Python escapes (`\\x08`), line
    breaks and tabs kept. A byte-level model draws any byte: a backspace ate the character before it on the console,
    and a NUL made grep take the log for a binary file. What a result records keeps the text as drawn."""
    return text.translate(_CONTROLS)


def unknown_prompt_tokens(tokenizer, prompt):
    """How many of `prompt`'s tokens `tokenizer` has no id for (read as <unk>: a character tokenizer's characters
    not in its training text); 0 for a tokenizer that reads any text or makes no stream of one."""
    stream = getattr(tokenizer, "stream", None)
    return int(stream(prompt.encode("utf-8")).unknown) if callable(stream) else 0


def unknown_prompt_warning(unknown, tokens, whose="the prompt's"):
    """What a continuation of a prompt that the model cannot wholly read means, in a line (None where it reads it);
    `whose`: the prompt's name, possessive."""
    if not unknown:
        return None
    return (f"{unknown:,} of {whose} {tokens:,} token{'s' * (tokens != 1)} {'are' if unknown != 1 else 'is'} unknown "
            f"to the model's tokenizer (read as <unk>): the model continues a text it cannot read")
