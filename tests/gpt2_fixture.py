"""A tiny random GPT-2 checkpoint, written by `transformers` itself, so the tests load exactly what a real model
directory holds (config.json, model.safetensors, vocab.json, merges.txt): its byte-level BPE trained by
`tokenizers` on a text, as GPT-2's was on WebText. The weights are redrawn wider than transformers' 0.02 so that
logits differ clearly between tokens, and GELU's tanh approximation differs measurably from the exact one."""

import os

WIDE_STD = 0.3


def build_checkpoint(directory, lines, vocab_size=400, seed=0):
    """A GPT-2 of 2 blocks, 32 wide, 64 positions, with a BPE of `vocab_size` tokens learnt from `lines`."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel
    os.makedirs(directory)
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"])
    tokenizer.save_model(directory)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, WIDE_STD)
    model.save_pretrained(directory)
    return directory


def transformers_windows_loss(directory, text, block):
    """The mean next-token cross-entropy of transformers' own model and tokenizer over `text`, read in consecutive
    windows of `block` tokens from its start (each token but the first predicted once, from its window's start),
    the number of tokens predicted, and the bytes of the first token, which none predicts: nanoGPT's
    `estimate_loss` over a whole split."""
    import torch
    from transformers import GPT2LMHeadModel, GPT2Tokenizer
    tokenizer = GPT2Tokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
    ids = tokenizer(text)["input_ids"]
    model = GPT2LMHeadModel.from_pretrained(directory).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, block):
            window = torch.tensor([ids[start:start + block + 1]])
            logits = model(window[:, :-1]).logits
            losses = torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
            total, count = total + float(losses), count + window.shape[1] - 1
    return total / count, count, len(tokenizer.decode(ids[:1]).encode("utf-8"))
