"""The batched one-token draft step over a SlotPool, with fixed shapes per (batch, length) bucket, replayed
as a CUDA graph on CUDA: one launch per step instead of one per kernel, and one host wait per step (the
chosen tokens) instead of two per session.

Rows are padded up to a power of two with the pool's scratch slot; attention reads each row's slot up to
a power-of-two length, masked at the row's position (stale entries past a rollback included).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specserve.models.lean import rms_norm, rotate_half
from specserve.models.pass_clock import model_pass
from specserve.models.slot_cache import SlotPool, SlotSequence

logger = logging.getLogger(__name__)

MIN_LENGTH_BUCKET = 256


@dataclass(frozen=True, slots=True)
class StepOutput:
    logits: torch.Tensor  # [rows, vocab]; on CUDA a graph's buffer, valid until the next step
    greedy_ids: list[int]  # argmax per row
    greedy_probs: list[float]  # the probability the draft gave it


class StepGraphs:
    """`step(sequences)` feeds each sequence's pending tokens one position at a time, all sequences
    together, and returns the logits after the last one."""

    def __init__(
        self, model: PreTrainedModel, pool: SlotPool, cuda_graphs: bool, vocab_size: int | None = None
    ) -> None:
        """vocab_size: the tokenizer's ids; logit rows past them are padding, cut off before the argmax."""
        self.model, self.pool = model, pool
        self.vocab_size = vocab_size
        self.device = model.device
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        rotary = model.model.rotary_emb
        positions = torch.arange(pool.tokens_per_slot, device=self.device, dtype=torch.float)
        freqs = positions[:, None] * rotary.inv_freq.float()[None]
        emb = torch.cat((freqs, freqs), dim=-1)  # the lean decoder's table: [tokens_per_slot, head_dim]
        self.cos = (emb.cos() * rotary.attention_scaling).to(model.dtype)
        self.sin = (emb.sin() * rotary.attention_scaling).to(model.dtype)
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._mempool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    def step(self, sequences: list[SlotSequence]) -> StepOutput:
        """Each sequence has at least one pending token; every one is fed and the sequence fully cached."""
        assert all(s.num_pending >= 1 for s in sequences)
        while lagging := [s for s in sequences if s.num_pending > 1]:  # a round's catch-up: its older tokens
            self._run(lagging)
        return self._run(sequences)

    def _run(self, sequences: list[SlotSequence]) -> StepOutput:
        rows = len(sequences)
        batch = 1 << (rows - 1).bit_length()
        end = max(s.num_cached for s in sequences) + 1
        length = min(max(MIN_LENGTH_BUCKET, 1 << (end - 1).bit_length()), self.pool.tokens_per_slot)
        inputs = torch.tensor(
            [[s.token_ids[s.num_cached] for s in sequences] + [0] * (batch - rows),
             [s.slot for s in sequences] + [self.pool.scratch] * (batch - rows),
             [s.num_cached for s in sequences] + [0] * (batch - rows)],
            dtype=torch.long,
        )  # fmt: skip
        graph = self._graph(batch, length) if self.use_graphs else None
        with model_pass():
            out = graph.replay(inputs) if graph is not None else self._forward(*inputs.to(self.device), length)
            logits, choice = out
            ids, probs = choice[:, :rows].tolist()  # the one wait for the device
        for s in sequences:
            s.num_cached += 1
        return StepOutput(logits[:rows], [int(i) for i in ids], probs)

    def _graph(self, batch: int, length: int) -> _Graph | None:
        """The bucket's graph, captured on first use; None (and eager steps from then on) if capture fails."""
        graph = self._graphs.get((batch, length))
        if graph is None:
            try:
                graph = self._graphs[batch, length] = _Graph(self, batch, length)
            except RuntimeError:
                logger.exception("capturing the draft step as a CUDA graph failed; draft steps run eagerly")
                self.use_graphs = False
                return None
            logger.info("draft step captured as a CUDA graph: batch %d, length %d", batch, length)
        return graph

    @torch.inference_mode()
    def _forward(
        self, input_ids: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, slots, positions: [B]. Returns logits [B, vocab] and [2, B]: argmax id and its probability."""
        model, batch = self.model, input_ids.shape[0]
        hidden = model.model.embed_tokens(input_ids)[:, None]  # [B, 1, hidden]
        cos, sin = self.cos[positions][:, None, None], self.sin[positions][:, None, None]  # [B, 1, 1, head_dim]
        mask = (torch.arange(length, device=self.device) <= positions[:, None])[:, None, None]  # [B, 1, 1, L]
        for layer_idx, layer in enumerate(model.model.layers):
            attention = layer.self_attn
            shape = (batch, -1, attention.head_dim)
            normed = rms_norm(layer.input_layernorm, hidden)
            query = attention.q_proj(normed).view(shape)[:, :, None]  # [B, heads, 1, head_dim]
            key = attention.k_proj(normed).view(shape)[:, :, None]  # [B, kv_heads, 1, head_dim]
            value = attention.v_proj(normed).view(shape)
            query, key = query * cos + rotate_half(query) * sin, key * cos + rotate_half(key) * sin
            keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
            keys[slots, positions] = key[:, :, 0]
            values[slots, positions] = value
            keys = keys[:, :length].index_select(0, slots).transpose(1, 2)  # [B, kv_heads, L, head_dim]
            values = values[:, :length].index_select(0, slots).transpose(1, 2)
            # the query heads that share a key/value head as that head's queries: each is read once
            packed = query.reshape(batch, keys.shape[1], -1, attention.head_dim)  # [B, kv_heads, groups, head_dim]
            out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=attention.scaling)
            hidden = hidden + attention.o_proj(out.reshape(batch, 1, -1))
            mlp = layer.mlp
            normed = rms_norm(layer.post_attention_layernorm, hidden)
            hidden = hidden + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))
        logits = model.lm_head(rms_norm(model.model.norm, hidden))[:, 0, : self.vocab_size]  # [B, vocab]
        scores = logits.float()
        best = scores.argmax(dim=-1)
        prob = torch.exp(scores.gather(1, best[:, None])[:, 0] - torch.logsumexp(scores, dim=-1))
        return logits, torch.stack((best.double(), prob.double()))


class _Graph:
    """One captured step: static inputs [3, batch] (ids, slots, positions) and outputs."""

    def __init__(self, steps: StepGraphs, batch: int, length: int) -> None:
        self.inputs = torch.zeros(3, batch, dtype=torch.long, device=steps.device)
        self.inputs[1] = steps.pool.scratch  # the warm-up and capture passes write the scratch slot only
        self._staging = torch.empty(3, batch, dtype=torch.long, pin_memory=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # allocator and kernel choices settle before capture
                steps._forward(*self.inputs, length)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=steps._mempool):
            self.outputs = steps._forward(*self.inputs, length)

    def replay(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._staging.copy_(inputs)  # the previous step's outputs were read, so its copy is done
        self.inputs.copy_(self._staging, non_blocking=True)
        self.graph.replay()
        return self.outputs
