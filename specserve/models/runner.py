"""ModelRunner: where a worker's sequences sit (a pool slot, a growing cache, the llama.cpp engine's cache),
when they move, and the passes over many of them. Both roles' workers run their model through it; a lone
sequence's own prefill/feed/truncate are the sequence's (models/pending.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specserve.models.batching import feed_padded, paddable
from specserve.models.llama_cpp import LlamaCppModel, LlamaCppSequence
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence, check_prompt
from specserve.models.slot_cache import SlotCacheConfig, SlotPool, SlotSequence
from specserve.models.step_graphs import StepGraphs

ModelSequence = CachedSequence | SlotSequence | LlamaCppSequence


@dataclass(frozen=True, slots=True)
class DraftStep:
    """One draft step's outputs, row i for the i-th sequence stepped. `greedy[i]`: the argmax id and its
    probability where the step chose them (a slot's row, on the device; rows of a batched growing pass, all
    at once), else None."""

    greedy: list[tuple[int, float] | None]
    rows: list[tuple[torch.Tensor, int] | None]
    """(tensor, index) of each row's logits: indexed only when read, so a greedy row costs no tensor op."""

    def logits(self, i: int) -> torch.Tensor:
        """[vocab] (padded, for a row outside the pool); on CUDA a slot's row is valid until the next step."""
        row = self.rows[i]
        assert row is not None
        return row[0][row[1]]


class ModelRunner:
    """The model of one worker, its slot pool (if any) and the draft's graphed steps over it."""

    def __init__(self, loaded: LoadedModel, slot_cache: SlotCacheConfig | None = None) -> None:
        """slot_cache: a preallocated pool where it is active on the model's device and the lean pass can fill
        it (models/slot_cache.py); None: every sequence keeps a growing cache, or the llama.cpp engine's."""
        self.loaded = loaded
        self.pool: SlotPool | None = None
        self._cuda_graphs = slot_cache is not None and slot_cache.cuda_graphs
        self._steps: StepGraphs | None = None  # built on the first draft step: a target never takes one
        if slot_cache is not None and slot_cache.active_on(loaded.device) and loaded.decoder is not None:
            assert isinstance(loaded.model, PreTrainedModel)
            self.pool = SlotPool(loaded.model, slot_cache)

    def max_sessions(self, wanted: int) -> int:
        """`wanted`, or fewer where the model holds fewer sequences at once (the llama.cpp engine): one is
        kept free, since a session prefilled again holds its old sequence until the new one is stored."""
        model = self.loaded.model
        if isinstance(model, LlamaCppModel):
            return max(1, min(wanted, model.options.max_sequences - 1))
        return wanted

    def new_sequence(self, token_ids: list[int]) -> ModelSequence:
        """A sequence with nothing cached yet: in a free slot if the prompt fits one, else a growing cache (the
        llama.cpp engine's cache on that engine). Raises ValueError for a prompt the model cannot take."""
        check_prompt(token_ids, self.loaded)
        model, decoder = self.loaded.model, self.loaded.decoder
        if isinstance(model, LlamaCppModel):
            return LlamaCppSequence(model, token_ids)
        if self.pool is not None and decoder is not None and len(token_ids) < self.pool.tokens_per_slot:
            if (slot := self.pool.acquire()) is not None:
                return SlotSequence(model, token_ids, decoder, self.pool, slot)
        return CachedSequence(model, token_ids, decoder)

    def make_room(self, sequence: ModelSequence, num_tokens: int) -> ModelSequence:
        """`sequence`, or, where `num_tokens` more would overflow its slot, the same sequence moved to a
        growing cache (its slot freed). The caller keeps the one returned."""
        if isinstance(sequence, SlotSequence) and not sequence.fits(len(sequence.token_ids) + num_tokens):
            return sequence.to_growing()
        return sequence

    def release(self, sequence: ModelSequence) -> None:
        """Free the sequence's slot or llama.cpp KV entries now: a dropped one frees them only when collected."""
        if isinstance(sequence, (SlotSequence, LlamaCppSequence)):
            sequence.release()

    @torch.inference_mode()
    def feed(self, sequences: list[ModelSequence], num_logits: list[int]) -> list[torch.Tensor]:
        """Every sequence's pending tokens in one pass; logits [num_logits[i], vocab] per sequence. llama.cpp
        decodes them in one batch, growing caches are padded into one; a lone sequence, or a batch with one
        in a slot or with an empty cache, is fed one at a time, so its numbers are the unbatched pass's."""
        assert len(sequences) == len(num_logits) and sequences
        if isinstance(sequences[0], LlamaCppSequence):  # a model has one engine: so are the others
            return sequences[0].model.feed_batch(sequences, num_logits)  # type: ignore[arg-type]
        if len(sequences) == 1 or not all(paddable(s) for s in sequences):
            return [s.feed(n) for s, n in zip(sequences, num_logits)]
        return feed_padded(sequences, num_logits)  # type: ignore[arg-type]

    def step(self, sequences: list[ModelSequence]) -> DraftStep:
        """The draft's step: feed each sequence's pending tokens (at least one each; older ones are a round's
        catch-up) and return the logits after the last. Sequences in slots take one batched step (a CUDA
        graph on CUDA) that also makes the greedy choice; the others one `feed` pass."""
        greedy: list[tuple[int, float] | None] = [None] * len(sequences)
        rows: list[tuple[torch.Tensor, int] | None] = [None] * len(sequences)
        in_slots = [i for i, s in enumerate(sequences) if isinstance(s, SlotSequence)]
        if in_slots:
            out = self._step_graphs().step([sequences[i] for i in in_slots])  # type: ignore[misc]
            for row, (i, choice) in enumerate(zip(in_slots, zip(out.greedy_ids, out.greedy_probs))):
                greedy[i], rows[i] = choice, (out.logits, row)
        if len(in_slots) < len(sequences):
            growing = [i for i, s in enumerate(sequences) if not isinstance(s, SlotSequence)]
            for i, logits in zip(growing, self.feed([sequences[i] for i in growing], [1] * len(growing))):
                rows[i] = (logits, -1)
            if len(growing) > 1:  # a lone row is chosen by the session: fewer ops than the batched way
                choices = greedy_choice([rows[i][0][-1] for i in growing], self.loaded.vocab_size)  # type: ignore[index]
                for i, choice in zip(growing, choices):
                    greedy[i] = choice
        return DraftStep(greedy, rows)

    def _step_graphs(self) -> StepGraphs:
        if self._steps is None:
            assert self.pool is not None and isinstance(self.loaded.model, PreTrainedModel)
            self._steps = StepGraphs(self.loaded.model, self.pool, self._cuda_graphs, self.loaded.vocab_size)
        return self._steps


def greedy_choice(rows: list[torch.Tensor], vocab_size: int) -> list[tuple[int, float]]:
    """rows: [padded vocab] logits each. Each row's argmax over the tokenizer's ids (the first of tied maxima)
    and the probability it has, as DraftSession.step chooses them, in a few tensor ops for all rows: per row,
    each op's dispatch (and on a shared CPU its OpenMP team) costs more than the arithmetic."""
    if not rows:
        return []
    logits = torch.stack(rows)[:, :vocab_size].float()  # [rows, vocab]
    token_ids = logits.argmax(dim=-1)  # [rows]
    confidences = torch.exp(logits.gather(-1, token_ids[:, None])[:, 0] - torch.logsumexp(logits, dim=-1))
    return list(zip(token_ids.tolist(), confidences.tolist()))
