"""`flce`: the vocabulary head and its cross-entropy fused, so [tokens x vocab] logits are never held whole.

With a 50k vocabulary the logits (and their fp32 copy, softmax and gradient) are often the largest
activations of a step. Liger's `LigerFusedLinearCrossEntropyLoss` (CUDA, Triton) avoids them; where it
is not installed or not usable (CPU) `ChunkedLinearCrossEntropy` does the same in PyTorch: per chunk of
rows it computes the logits, the loss and, at once, the gradients of the hidden states, weight and bias
(softmax - one-hot), so backward only scales them. Peak extra memory: one chunk's logits.

The model keeps its interface (`module(**batch).loss`): a mixin replaces the *ForCausalLM /
*ForMaskedLM forward when labels are given, and gives the same loss as the dense head (HF's shift for
causal LMs, the mean over labelled positions, logits upcast to fp32), incl. the sparse-prediction path.
"""

from __future__ import annotations

import functools
import math
import sys

import torch

IGNORE_INDEX = -100


MIN_CHUNK_ROWS = 128  # below this the per-chunk overhead (a Python loop) outweighs the memory saved


def chunk_rows(rows: int, hidden: int, vocab: int) -> int:
    """Rows per chunk: a chunk's logits about as large as the hidden states (Liger's choice), at least
    MIN_CHUNK_ROWS (a narrow model with a wide vocabulary would otherwise get one row per chunk)."""
    liger = 2 ** math.ceil(math.log2(max(1, math.ceil(rows / math.ceil(vocab / hidden)))))
    return max(1, min(rows, max(liger, MIN_CHUNK_ROWS)))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """mean CE(x @ weight.T + bias, target) over targets != -100, gradients computed in forward per chunk."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, chunk: int, compute_dtype: torch.dtype):
        with torch.autocast(x.device.type, enabled=False):
            n = x.shape[0]
            valid = target != IGNORE_INDEX
            count = valid.sum().clamp(min=1).to(torch.float32)
            w = weight.to(compute_dtype)
            b = bias.to(compute_dtype) if bias is not None else None
            needs_grad = ctx.needs_input_grad
            grad_x = torch.empty_like(x) if needs_grad[0] else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if needs_grad[1] else None
            grad_b = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and needs_grad[2] else None
            loss = torch.zeros((), dtype=torch.float32, device=x.device)
            for start in range(0, n, chunk):
                stop = min(start + chunk, n)
                xc = x[start:stop].to(compute_dtype)
                logits = torch.nn.functional.linear(xc, w, b).float()
                tc, vc = target[start:stop], valid[start:stop]
                safe = torch.where(vc, tc, torch.zeros_like(tc))
                lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, safe[:, None]).squeeze(1)
                loss += torch.where(vc, lse - picked, torch.zeros_like(lse)).sum()
                if grad_x is None and grad_w is None and grad_b is None:
                    continue
                # d(sum of losses)/d(logits) = softmax - one_hot, zero on ignored rows; reuses the logits' memory
                g = logits.sub_(lse[:, None]).exp_()
                g[torch.arange(stop - start, device=x.device), safe] -= 1.0
                g.mul_(vc[:, None])
                g = g.to(compute_dtype)
                if grad_x is not None:
                    grad_x[start:stop] = (g @ w).to(x.dtype)
                if grad_w is not None:
                    grad_w.add_((g.t() @ xc).float())
                if grad_b is not None:
                    grad_b.add_(g.float().sum(0))
            ctx.save_for_backward(
                *(t / count if t is not None else None for t in (grad_x, grad_w, grad_b)),
            )
            ctx.dtypes = (weight.dtype, bias.dtype if bias is not None else None)
            return loss / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_x, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        scale = grad_out.float()
        return (
            (grad_x * scale.to(grad_x.dtype)) if grad_x is not None else None,
            (grad_w * scale).to(w_dtype) if grad_w is not None else None,
            (grad_b * scale).to(b_dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


@torch.compiler.disable  # a Python loop over chunks: eager, so a compiled model does not unroll it
def fused_linear_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, impl: str = "chunked"
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T + bias` (x: [N, H], target: [N], -100 ignored), never holding [N, V]."""
    if impl == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX)(weight, x, target, bias)
    chunk = chunk_rows(x.shape[0], x.shape[1], weight.shape[0])
    return ChunkedLinearCrossEntropy.apply(x, weight, bias, target, chunk, _compute_dtype(x, weight))


class FusedCausalLMMixin:
    """A *ForCausalLM whose loss comes from the fused head (labels shifted as HF's ForCausalLMLoss does)."""

    fused_ce_impl = "chunked"

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        if labels is None:
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = self.base_model(input_ids, attention_mask=attention_mask, **kwargs)[0]
        head = self.get_output_embeddings()
        x = hidden[:, :-1].reshape(-1, hidden.size(-1))
        target = labels[:, 1:].reshape(-1).to(hidden.device)
        loss = fused_linear_cross_entropy(x, head.weight, head.bias, target, self.fused_ce_impl)
        return CausalLMOutputWithPast(loss=loss, logits=None)


def _mlm_transform(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.nn.Linear]:
    """The MLM head up to its vocabulary projection (BERT: predictions.transform; RoBERTa: dense, gelu, LN)."""
    if hasattr(head, "predictions"):
        return head.predictions.transform(hidden), head.predictions.decoder
    gelu = sys.modules[type(head).__module__].gelu  # the activation RobertaLMHead.forward uses
    return head.layer_norm(gelu(head.dense(hidden))), head.decoder


class FusedMaskedLMMixin:
    """A *ForMaskedLM whose loss comes from the fused head; with sparse prediction, only masked rows."""

    fused_ce_impl = "chunked"
    sparse_rows = False

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import MaskedLMOutput

        if labels is None:
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = self.base_model(input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)[0]
        hidden = hidden.reshape(-1, hidden.size(-1))
        target = labels.reshape(-1).to(hidden.device)
        if self.sparse_rows:
            rows = torch.nonzero(target != IGNORE_INDEX).squeeze(1)
            hidden, target = hidden.index_select(0, rows), target.index_select(0, rows)
        head = getattr(self, "lm_head", None)
        x, decoder = _mlm_transform(head if head is not None else self.cls, hidden)
        loss = fused_linear_cross_entropy(x, decoder.weight, decoder.bias, target, self.fused_ce_impl)
        return MaskedLMOutput(loss=loss, logits=None)


@functools.cache
def fused_head_class(model_cls: type, masked_lm: bool, sparse: bool) -> type:
    """`model_cls` with the fused head (one class per base class and flavour)."""
    if masked_lm:
        return type(f"{model_cls.__name__}WithFusedCE", (FusedMaskedLMMixin, model_cls), {"sparse_rows": sparse})
    return type(f"{model_cls.__name__}WithFusedCE", (FusedCausalLMMixin, model_cls), {})
