"""The GPT language model as a skilled PyTorch user writes it by hand: nanoGPT's recipe, held to mtbench's arithmetic.

Where benchmarks/native_gpt_torch.py copies mtbench's model layer for layer, this is what its best users would
benchmark against: one fused QKV projection per block, `F.scaled_dot_product_attention(is_causal=True)` with no
mask and every SDPA kernel enabled, whatever the process holds mtbench's runs to (so that CUDA may take its flash
kernel), `torch.autocast(bfloat16)` for mixed precision (the residual stream cast to bfloat16 after the
embeddings, as Keras's mixed policy computes it and the JAX reference casts it), the forward and loss one
`torch.compile`d function (by default on CUDA), the fused AdamW kernel, gradients freed with `set_to_none`, and no
host synchronisation inside a step (the loss comes back as a device tensor).

The model is still mtbench's `--model gpt` (pre-LayerNorm blocks, LayerNorm eps 1e-5, exact GELU, learned
positions, the output layer tied to the token embedding, float32 logits) and the optimizer does mtbench's
arithmetic (`native_torch.AdamWLikeKeras`: Keras's epsilon placement, its schedule, each Keras variable's
gradient clipped on its own, the thirds of the fused QKV's too), so that from mtbench's initial weights the losses
are mtbench's. Module names follow the Keras layer names,
the fused `qkv` aside: it loads from, and splits back into, the Keras `query`, `key` and `value` layers.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import native_gpt_torch, native_torch
from benchmarks.native_gpt_torch import MLP
from benchmarks.native_torch import AdamWLikeKeras, batch_tensors, default_device  # noqa: F401 (this module's API)
from mtbench.plugins.backends.torch_backend import FUSED_KERNEL_NAMES

LAYER_NORM_EPSILON = 1e-5
QKV = ("query", "key", "value")  # the Keras layers fused into one `qkv` Linear, in this order
# SDPA's kernels as a process that sets none leaves them: every one enabled, its dispatcher choosing. The process
# that times this reference beside mtbench's step holds SDPA to the kernels mtbench's run asked for (its math kernel
# under unfused attention, on a CPU or in float32), which would slow the reference below its best.
SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, dropout):
        super().__init__()
        self.num_heads, self.dropout = num_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)  # one matmul instead of three
        self.output = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch, length, d_model = x.shape
        q, k, v = (t.view(batch, length, self.num_heads, -1).transpose(1, 2)
                   for t in self.qkv(x).split(d_model, dim=2))
        # is_causal and no attn_mask: the form the flash kernel accepts.
        with sdpa_kernel(SDPA_KERNELS):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=True)
        return self.output(y.transpose(1, 2).reshape(batch, length, d_model))


class Block(nn.Module):
    def __init__(self, d_model, num_heads, ff_dim, dropout):
        super().__init__()
        self.attention_norm = nn.LayerNorm(d_model, eps=LAYER_NORM_EPSILON)
        self.self_attention = CausalSelfAttention(d_model, num_heads, dropout)
        self.mlp_norm = nn.LayerNorm(d_model, eps=LAYER_NORM_EPSILON)
        self.mlp = MLP(d_model, ff_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.dropout(self.self_attention(self.attention_norm(x)))
        return x + self.mlp(self.mlp_norm(x))


def build_model(shape):
    """`shape`: an mtbench `ModelPreset` (`decoder_layers` blocks, `max_len` positions). The embeddings, final norm
    and tied output layer are the native model's; the blocks are this module's."""
    return native_gpt_torch.GPT(shape.vocab_size, shape.d_model, shape.num_heads, shape.decoder_layers, shape.ff_dim,
                                shape.max_len, shape.dropout, block=Block)


def fused_path(keras_path):
    """The Keras-style path of the fused tensor holding `keras_path` and the part it is (0, 1, 2 for query, key,
    value), or (keras_path, None) for a variable that is not fused."""
    *scopes, layer, leaf = keras_path.split("/")
    if layer not in QKV:
        return keras_path, None
    return "/".join(scopes + ["qkv", leaf]), QKV.index(layer)


def state_dict_from_keras_weights(weights):
    """A state dict from mtbench's {Keras variable path: array}: query, key and value kernels (in, out) and biases
    concatenated along their output axis into `qkv`, then loaded by path as native_torch loads them."""
    fused = {}
    for path, value in weights.items():
        name, part = fused_path(path)
        if part is None:
            fused[name] = value
        else:
            fused.setdefault(name, [None] * len(QKV))[part] = np.asarray(value, np.float32)
    return native_torch.state_dict_from_keras_paths(
        {name: np.concatenate(value, axis=-1) if isinstance(value, list) else value for name, value in fused.items()})


def sdpa_kernel_chosen(model, mixed_bfloat16):
    """The SDPA kernel torch's dispatcher picks for `model`'s causal attention as `CausalSelfAttention` calls it
    (every kernel enabled, no mask, its dropout while training), asked of the dispatcher itself
    (`torch._fused_sdp_choice`) on inputs of the model's heads, head size, block and compute dtype on its device,
    with gradients: 'flash (fused)', 'memory-efficient (fused)', 'cudnn (fused)' or 'math (unfused)'. In float32
    a GPU's dispatcher takes the memory-efficient kernel (flash and cuDNN's take 16 bits only), where mtbench's
    float32 rows and the JAX reference attend unfused."""
    attention = next(module for module in model.modules() if isinstance(module, CausalSelfAttention))
    device = next(model.parameters()).device
    if device.type not in ("cpu", "cuda"):  # the dispatcher's query has no kernel for another device (MPS)
        return f"SDPA's choice on {device.type} (not asked)"
    head_size = attention.qkv.in_features // attention.num_heads
    probe = torch.zeros(1, attention.num_heads, model.position_embedding.num_embeddings, head_size,
                        dtype=torch.bfloat16 if mixed_bfloat16 else torch.float32, device=device, requires_grad=True)
    with sdpa_kernel(SDPA_KERNELS):
        choice = SDPBackend(torch._fused_sdp_choice(probe, probe, probe, None, attention.dropout, True))
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "mem_efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn"}
    return FUSED_KERNEL_NAMES[names[choice]] if choice in names else "math (unfused)"


class AdamWLikeKerasFusedQKV(AdamWLikeKeras):
    """native_torch's AdamW with mtbench's arithmetic, its clipping aware of the fused QKV: Keras clips the query,
    key and value gradients each on its own, so each third of a `qkv` gradient is clipped on its own (clipping
    the fused gradient as one would take a different step). The rest of AdamW is elementwise, fused or not."""

    def __init__(self, model, settings):
        super().__init__(model.parameters(), settings)
        fused = {p for module in model.modules() if isinstance(module, CausalSelfAttention)
                 for p in module.qkv.parameters()}
        self.parts = [len(QKV) if p in fused else 1 for p in self.parameters]

    def _clip_each_gradient(self):
        # `qkv`'s weight (3 d, d) and bias (3 d) hold query, key and value along their first axis; chunks are views,
        # so scaling them in place scales the gradient.
        grads = [part for p, parts in zip(self.parameters, self.parts) if p.grad is not None
                 for part in p.grad.chunk(parts)]
        clipnorm = self.settings.clipnorm
        scales = torch._foreach_clamp_min(torch._foreach_norm(grads), clipnorm)
        torch._foreach_reciprocal_(scales)
        torch._foreach_mul_(scales, clipnorm)
        torch._foreach_mul_(grads, scales)


class TrainStep:
    """Forward (under autocast for mixed bfloat16), token-weighted mean cross-entropy, backward, AdamW. With
    `compile`, the forward and loss are one `torch.compile`d function (`compile_mode`: torch.compile's mode;
    reduce-overhead runs its forward and backward as CUDA graphs); the optimizer is the fused kernel's."""

    def __init__(self, model, settings, mixed_bfloat16=False, compile=False, compile_mode=None):
        self.model = model.train()
        self.device = next(model.parameters()).device
        self.optimizer = AdamWLikeKerasFusedQKV(model, settings)
        self.mixed_bfloat16 = mixed_bfloat16
        self.compile_mode = compile_mode if compile else None
        self._loss = torch.compile(self.loss, mode=compile_mode) if compile else self.loss
        self.name = "best-by-hand torch"
        adamw = "fused" if self.optimizer.optimizer.defaults.get("fused") else "foreach"
        self.compile = compile
        self.traced = None  # (graphs, graph breaks) dynamo made of the loss at its first call, where compiled
        # What the dispatcher runs, recorded beside the figures as mtbench's runs record theirs (`model.attention`).
        self.attention = {"causal": sdpa_kernel_chosen(model, mixed_bfloat16)}
        self._recipe = (f"nanoGPT's recipe: fused QKV, SDPA is_causal ({self.attention['causal']}), {adamw} AdamW"
                        + (", torch.compile{traced}" if compile else "")
                        + (", bf16 autocast, bf16 residual stream" if mixed_bfloat16 else ""))

    @property
    def description(self):
        """The recipe, with the graphs dynamo made of the compiled loss and its graph breaks as counted at its first
        call (what was compiled, not what was asked), and for CUDA graphs whether every compiled graph ran as one
        (inductor counts those it skipped)."""
        graphs, breaks = self.traced or (None, None)
        traced = "" if self.traced is None else (f" ({graphs} graph{'s' * (graphs != 1)}, {breaks} graph "
                                                 f"break{'s' * (breaks != 1)})")
        recipe = self._recipe.format(traced=traced)
        if self.compile_mode != "reduce-overhead":
            return recipe
        from torch._dynamo.utils import counters
        skipped = int(counters["inductor"]["cudagraph_skips"])
        return recipe + (f", CUDA graphs skipped for {skipped} graph(s)" if skipped else
                         ", CUDA graphs (mode reduce-overhead)")

    def _first_loss(self, tokens, next_tokens, weights):
        """The loss's first call, which compiles it: dynamo's counters, read around it, say what it made."""
        from torch._dynamo.utils import counters
        before = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()))
        loss = self._loss(tokens, next_tokens, weights)
        after = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()))
        self.traced = (after[0] - before[0], after[1] - before[1])
        return loss

    def loss(self, tokens, next_tokens, weights):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.mixed_bfloat16):
            logits = self.model(tokens)
        losses = F.cross_entropy(logits.flatten(0, 1), next_tokens.flatten(), reduction="none")
        # A language model's weights are all ones; kept so that the mean is over the tokens that count.
        return (losses * weights.flatten()).sum() / weights.sum()

    def __call__(self, tokens, next_tokens, weights):
        """Tensors on `self.device` (`batch_tensors(batch, step.device)`). Returns {'loss': a device tensor}."""
        self.optimizer.zero_grad()  # set_to_none: no memset, and the backward writes the gradients afresh
        first = self.compile and self.traced is None
        loss = (self._first_loss if first else self._loss)(tokens, next_tokens, weights)
        loss.backward()
        self.optimizer.step()
        # A CUDA graph's next replay writes over its outputs: the loss read at the window's end is a copy.
        return {"loss": loss.detach().clone() if self.compile_mode == "reduce-overhead" else loss.detach()}

    def validation_loss(self, batches):
        """The token-weighted mean loss of `batches` (`batch_tensors` each), without dropout or gradients."""
        total = tokens = 0.0
        self.model.eval()
        with torch.no_grad():
            for batch in batches:
                weights = batch[2]
                total += float(self.loss(*batch)) * float(weights.sum())
                tokens += float(weights.sum())
        self.model.train()
        return total / tokens

    def block(self):
        """Returns once the device has finished every step queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def weights_by_keras_path(self, paths):
        """The current weights as {Keras variable path: numpy array in Keras's layout}, `qkv` split back."""
        fused = native_torch.weights_by_keras_path(self.model, {fused_path(path)[0] for path in paths})
        weights = {}
        for path in paths:
            name, part = fused_path(path)
            weights[path] = fused[name] if part is None else np.split(fused[name], len(QKV), axis=-1)[part]
        return weights


def train_step_from_keras_weights(shape, weights, settings, mixed_bfloat16=False, compile=None, device=None,
                                  compile_mode=None):
    """The step starting from mtbench's initial weights ({Keras path: numpy array}) on `device` (default:
    `default_device()`, where Keras-torch puts its variables); `compile` defaults to True on CUDA (on the CPU
    Inductor's compile takes longer than a short run saves); `compile_mode` 'reduce-overhead' (CUDA graphs) needs
    a CUDA device."""
    device = default_device() if device is None else torch.device(device)
    if compile_mode == "reduce-overhead" and device.type != "cuda":
        from mtbench.errors import MtbenchError
        raise MtbenchError(f"--compile-mode reduce-overhead: CUDA graphs need a CUDA device; torch runs on the "
                           f"{device.type} here")
    model = build_model(shape)
    model.load_state_dict(state_dict_from_keras_weights(weights))
    model.to(device)
    compile = device.type == "cuda" if compile is None else compile
    return TrainStep(model, settings, mixed_bfloat16=mixed_bfloat16, compile=compile or bool(compile_mode),
                     compile_mode=compile_mode)
