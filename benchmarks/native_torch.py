"""mtbench's Transformer written in plain PyTorch, layer for layer: an `nn.Module`, `torch.optim.AdamW` with a
`LambdaLR` schedule, and an eager train step; optionally under `torch.autocast(bfloat16)` and optionally compiled
with `torch.compile`. Nothing from Keras: what it costs against mtbench's step is what Keras adds. It keeps mtbench's
layout, so it is not the best a PyTorch user writes (benchmarks/best_gpt_torch.py is): the query, key and value
weights stay three Linears, joined for one product at every step as mtbench's model joins them.

It trains on the device Keras-torch would put mtbench's variables on (`default_device`), or on the one it is
given: model, optimizer state and batches live there, autocast is that device's, and `block()` waits for CUDA.
A baseline left on the CPU while mtbench trains on a GPU would make every ratio against it meaningless.

Same architecture as `mtbench.keras_models.transformer` and the same optimizer (AdamW, warm-up and cosine decay,
each gradient clipped on its own as Keras's `clipnorm` does). Module names follow the Keras layer names, so
mtbench's initial weights load by path.
"""

import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# The same accuracy formulation and batch copies as mtbench's step.
from mtbench.plugins.backends.torch_eager_step import correct_tokens, to_device

PAD_ID = 0
LAYER_NORM_EPSILON = 1e-6


def default_device():
    """The device Keras 3 on torch puts its variables on, chosen the way Keras chooses it (KERAS_TORCH_DEVICE,
    then MPS, CUDA, XPU, else the CPU), without importing Keras."""
    if "KERAS_TORCH_DEVICE" in os.environ:
        return torch.device(os.environ["KERAS_TORCH_DEVICE"])
    if torch.backends.mps.is_available():
        return torch.device("mps")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    return torch.device("cpu")


class Attention(nn.Module):
    def __init__(self, d_model, num_heads, is_causal=False, dropout=0.0):
        super().__init__()
        self.num_heads, self.is_causal, self.dropout = num_heads, is_causal, dropout
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)

    def _heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, -1).transpose(1, 2)

    def forward(self, x, memory, key_mask=None):
        # The projections of one input in one product, their weights side by side, as mtbench's model computes them
        # (`Attention.fused_projections`); the weights stay in the three Linears, so mtbench's load by path.
        together = (self.query, self.key, self.value) if memory is x else (self.key, self.value)
        weights = torch.cat([projection.weight for projection in together])
        biases = torch.cat([projection.bias for projection in together])
        projected = F.linear(memory, weights, biases).chunk(len(together), dim=-1)
        query = projected[0] if memory is x else self.query(x)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        attended = F.scaled_dot_product_attention(self._heads(query), self._heads(projected[-2]),
                                                  self._heads(projected[-1]), attn_mask=mask,
                                                  dropout_p=self.dropout if self.training else 0.0,
                                                  is_causal=self.is_causal)
        return self.output(attended.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, d_model, ff_dim, dropout):
        super().__init__()
        self.hidden = nn.Linear(d_model, ff_dim)
        self.out = nn.Linear(ff_dim, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.out(self.dropout(F.relu(self.hidden(x))))


def in_compute_dtype(x):
    """`x` in autocast's dtype where autocast is on. Keras's mixed policy computes every layer in bfloat16, the sum
    of the embeddings and so the residual stream between blocks too; autocast alone would keep the stream (its adds
    and LayerNorms' outputs) in float32, moving twice the bytes of mtbench's model and the JAX references'."""
    if torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


def layer_norm(d_model):
    return nn.LayerNorm(d_model, eps=LAYER_NORM_EPSILON)


class EncoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, ff_dim, dropout):
        super().__init__()
        self.attention_norm = layer_norm(d_model)
        self.self_attention = Attention(d_model, num_heads)
        self.ff_norm = layer_norm(d_model)
        self.ff = FeedForward(d_model, ff_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, src_mask):
        h = self.attention_norm(x)
        x = x + self.dropout(self.self_attention(h, h, key_mask=src_mask))
        return x + self.dropout(self.ff(self.ff_norm(x)))


class DecoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, ff_dim, dropout):
        super().__init__()
        self.self_attention_norm = layer_norm(d_model)
        self.self_attention = Attention(d_model, num_heads, is_causal=True)
        self.cross_attention_norm = layer_norm(d_model)
        self.cross_attention = Attention(d_model, num_heads)
        self.ff_norm = layer_norm(d_model)
        self.ff = FeedForward(d_model, ff_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, memory, src_mask):
        h = self.self_attention_norm(x)
        x = x + self.dropout(self.self_attention(h, h))
        h = self.cross_attention_norm(x)
        x = x + self.dropout(self.cross_attention(h, memory, key_mask=src_mask))
        return x + self.dropout(self.ff(self.ff_norm(x)))


class Transformer(nn.Module):
    def __init__(self, vocab_size, d_model, num_heads, encoder_layers, decoder_layers, ff_dim, max_len,
                 dropout=0.0):
        super().__init__()
        self.embedding_scale = math.sqrt(d_model)
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.embedding_dropout = nn.Dropout(dropout)
        self.encoder_blocks = nn.ModuleList(EncoderBlock(d_model, num_heads, ff_dim, dropout)
                                            for _ in range(encoder_layers))
        self.decoder_blocks = nn.ModuleList(DecoderBlock(d_model, num_heads, ff_dim, dropout)
                                            for _ in range(decoder_layers))
        self.encoder_norm = layer_norm(d_model)
        self.decoder_norm = layer_norm(d_model)

    def _embed(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) * self.embedding_scale + self.position_embedding(positions)[None]
        return self.embedding_dropout(in_compute_dtype(x))

    def forward(self, source_ids, target_input_ids):
        src_mask = source_ids != PAD_ID
        memory = self._embed(source_ids)
        for block in self.encoder_blocks:
            memory = block(memory, src_mask)
        memory = self.encoder_norm(memory)
        x = self._embed(target_input_ids)
        for block in self.decoder_blocks:
            x = block(x, memory, src_mask)
        # Tied output layer, logits in float32 for a stable softmax.
        return F.linear(self.decoder_norm(x), self.token_embedding.weight).float()


def build_model(shape):
    """`shape`: an mtbench `ModelPreset` (any object with its fields)."""
    return Transformer(shape.vocab_size, shape.d_model, shape.num_heads, shape.encoder_layers,
                       shape.decoder_layers, shape.ff_dim, shape.max_len, shape.dropout)


# The `nn.ModuleList` holding the Keras layers `KIND_N` (the translation model's `encoder_0`, the GPT's `block_0`).
BLOCK_LISTS = {"encoder": "encoder_blocks", "decoder": "decoder_blocks", "block": "blocks"}


def torch_name(keras_path):
    """The state-dict name of a Keras variable path (e.g. `transformer/encoder_0/ff/hidden/kernel`), and whether
    the tensor is the transpose of Keras's (`nn.Linear.weight` is (out, in), a Keras Dense kernel (in, out)):
    module names are Keras's layer names, block lists aside."""
    *scopes, leaf = keras_path.split("/")[1:]  # drop the model's own name
    for i, scope in enumerate(scopes):
        kind, _, index = scope.partition("_")
        if kind in BLOCK_LISTS and index.isdigit():
            scopes[i] = f"{BLOCK_LISTS[kind]}.{index}"
    return ".".join(scopes + ["bias" if leaf in ("bias", "beta") else "weight"]), leaf == "kernel"


def state_dict_from_keras_paths(weights):
    """A state dict from {Keras variable path: array}."""
    state = {}
    for path, value in weights.items():
        name, transposed = torch_name(path)
        tensor = torch.from_numpy(np.array(value, np.float32))
        state[name] = tensor.T.contiguous() if transposed else tensor
    return state


def weights_by_keras_path(model, paths):
    """The module's current weights as {Keras variable path: numpy array in Keras's layout}."""
    state = model.state_dict()
    weights = {}
    for path in paths:
        name, transposed = torch_name(path)
        tensor = state[name].detach().float().cpu()
        weights[path] = (tensor.T if transposed else tensor).numpy()
    return weights


def learning_rate_factor(settings):
    """The multiplier of `settings.learning_rate` at each optimizer step (for `LambdaLR`)."""

    def factor(step):
        step = min(step, settings.warmup_steps + settings.decay_steps)
        if step < settings.warmup_steps:
            return step / settings.warmup_steps
        progress = (step - settings.warmup_steps) / settings.decay_steps
        return (1 - settings.alpha) * 0.5 * (1 + math.cos(math.pi * progress)) + settings.alpha

    return factor


def fastest_adamw_implementation(device):
    """`fused=True` where this torch build has a fused AdamW kernel for tensors on `device`, else `foreach`."""
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
        return {"fused": True}
    except (RuntimeError, TypeError):
        return {"foreach": True}


class AdamWLikeKeras:
    """`torch.optim.AdamW` (fused where the build has it) stepped by a `LambdaLR` schedule, each gradient clipped
    on its own (Keras's `clipnorm`; `clip_grad_norm_` would clip them together), and epsilon placed where Keras
    places it: Keras adds it to sqrt(v) before v's bias correction, torch after, so at step t torch gets Keras's
    epsilon divided by sqrt(1 - beta_2**t). Without that, the rows of tokens a batch hardly touches (sqrt(v) of
    epsilon's order) would move differently."""

    def __init__(self, parameters, settings):
        self.parameters = list(parameters)
        self.settings = settings
        # Decayed or not as Keras decays the variable (a torch Linear's weight is its kernel transposed: the same
        # number of dimensions).
        groups = [{"params": [p for p in self.parameters if settings.decays(p.shape) == decayed],
                   "weight_decay": settings.weight_decay if decayed else 0.0} for decayed in (True, False)]
        self.optimizer = torch.optim.AdamW([group for group in groups if group["params"]], lr=settings.learning_rate,
                                           betas=(settings.beta_1, settings.beta_2), eps=settings.epsilon,
                                           weight_decay=settings.weight_decay,
                                           **fastest_adamw_implementation(self.parameters[0].device))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, learning_rate_factor(settings))
        self.steps_taken = 0

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)

    def _clip_each_gradient(self):
        grads = [p.grad for p in self.parameters if p.grad is not None]
        clipnorm = self.settings.clipnorm
        scales = torch._foreach_clamp_min(torch._foreach_norm(grads), clipnorm)
        torch._foreach_reciprocal_(scales)
        torch._foreach_mul_(scales, clipnorm)
        torch._foreach_mul_(grads, scales)

    def _clip_together(self):
        """Keras's `clip_by_global_norm`, on the device."""
        grads = [p.grad for p in self.parameters if p.grad is not None]
        norm = torch.stack(torch._foreach_norm(grads)).square().sum().sqrt()
        torch._foreach_mul_(grads, self.settings.clipnorm * torch.clamp(1.0 / norm, max=1.0 / self.settings.clipnorm))

    def step(self):
        """Updates the parameters from their `.grad`."""
        if self.settings.clip == "per-variable":
            self._clip_each_gradient()
        elif self.settings.clip == "global":
            self._clip_together()
        self.steps_taken += 1
        settings = self.settings
        for group in self.optimizer.param_groups:
            group["eps"] = settings.epsilon / math.sqrt(1 - settings.beta_2 ** self.steps_taken)
        self.optimizer.step()
        self.scheduler.step()


class TorchTrainStep:
    """One eager step: forward (under autocast for mixed bfloat16), token-weighted mean cross-entropy,
    backward, `AdamWLikeKeras`. With `compile`, the forward and loss are one `torch.compile`d function, the way a
    PyTorch user compiles a train step. The step runs where the model's parameters are; batches must be there
    too (`batch_tensors(batch, step.device)`). It is called as mtbench's steps are, on the model's inputs (the
    translation model's source and target input, a language model's tokens), then the labels and weights."""

    def __init__(self, model, settings, mixed_bfloat16=False, compile=False):
        self.model = model.train()
        self.device = next(model.parameters()).device
        self.optimizer = AdamWLikeKeras([p for p in model.parameters() if p.requires_grad], settings)
        self.autocast_dtype = torch.bfloat16 if mixed_bfloat16 else None
        self._forward = torch.compile(self._loss_and_correct) if compile else self._loss_and_correct

    def _loss_and_correct(self, *arrays):
        *inputs, target_output, weight = arrays
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16,
                            enabled=self.autocast_dtype is not None):
            logits = self.model(*inputs)
        token_loss = F.cross_entropy(logits.flatten(0, 1), target_output.flatten(), reduction="none")
        tokens = weight.sum()
        loss = (token_loss * weight.flatten()).sum() / tokens
        correct = correct_tokens(target_output, logits, weight)
        return loss, correct / tokens

    def __call__(self, *arrays):
        """`arrays`: the model's inputs, the labels, the weights. Returns the batch's {'loss', 'accuracy'} as
        tensors."""
        self.optimizer.zero_grad()
        loss, accuracy = self._forward(*arrays)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.detach(), "accuracy": accuracy.detach()}

    def block(self):
        """Returns once the device has finished every step queued so far (CUDA runs them asynchronously)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def weights_by_keras_path(self, paths):
        return weights_by_keras_path(self.model, paths)


def train_step_from_keras_weights(shape, weights, settings, mixed_bfloat16=False, compile=False, device=None,
                                  build=build_model):
    """The native step of the model `build(shape)` makes (default: the translation Transformer), starting from
    mtbench's initial weights ({Keras path: numpy array}), on `device` (default: `default_device()`, where
    Keras-torch puts its variables)."""
    model = build(shape)
    model.load_state_dict(state_dict_from_keras_paths(weights))
    model.to(default_device() if device is None else device)
    return TorchTrainStep(model, settings, mixed_bfloat16=mixed_bfloat16, compile=compile)


def batch_tensors(batch, device=None):
    """An mtbench `Batch` as the step's tensors on `device` (default: `default_device()`): the model's inputs
    (`batch.inputs`), the labels, the weights. On CUDA each goes through pinned host memory, then a non-blocking
    copy, as nanoGPT's `get_batch` does: a copy from pageable memory would wait for the device's queue first, so
    the host could not queue the next step while this one runs (mtbench's step copies them so too: `to_device`)."""
    device = default_device() if device is None else device
    arrays = (*(ids.astype(np.int64) for ids in batch.inputs), batch.target_output.astype(np.int64),
              np.asarray(batch.weight, np.float32))
    return tuple(to_device(array, device) for array in arrays)
