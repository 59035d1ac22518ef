"""TargetWorker: the target model and its sessions; verification runs here, next to the logits."""

from __future__ import annotations

from specserve.core.types import Proposal, SamplingParams, Verdict
from specserve.core.verify import TARGET_STREAM, greedy_verify, logits_to_probs, make_generator, rejection_sample
from specserve.models.loading import LoadedModel
from specserve.models.sequence import CachedSequence


class TargetWorker:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded

    def open_session(self, prompt_token_ids: list[int], seed: int | None = None) -> TargetSession:
        return TargetSession(self.loaded, prompt_token_ids, seed)


class TargetSession:
    """Implements core.Verifier for one request. The last context token is always pending."""

    def __init__(self, loaded: LoadedModel, prompt_token_ids: list[int], seed: int | None) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        self.sequence = CachedSequence(loaded.model, prompt_token_ids)
        self.generator = make_generator(seed, TARGET_STREAM)

    def prefill(self) -> None:
        if self.sequence.num_pending > 1:
            self.sequence.feed(1, upto=len(self.sequence.token_ids) - 1)

    def verify(self, proposal: Proposal, sampling: SamplingParams) -> Verdict:
        sequence = self.sequence
        k = len(proposal.token_ids)
        num_context = len(sequence.token_ids)
        sequence.token_ids.extend(proposal.token_ids)
        target_logits = sequence.feed(k + 1)  # [k + 1, vocab]: the last context token + k proposals, one pass
        if sampling.greedy:
            verdict = greedy_verify(proposal.token_ids, target_logits)
        else:
            if k and proposal.probs is None:
                raise ValueError("sampled verification needs the draft probabilities")
            target_probs = logits_to_probs(target_logits, sampling)  # [k + 1, vocab]
            draft_probs = proposal.probs if k else target_probs[:0]  # [k, vocab]
            verdict = rejection_sample(proposal.token_ids, draft_probs, target_probs, self.generator)
        sequence.truncate(num_context + verdict.num_accepted)
        sequence.token_ids.append(verdict.token_ids[-1])
        return verdict
