"""Deterministic random-weight Qwen2 models and a byte-level tokenizer, built in seconds for tests."""

from __future__ import annotations

import threading

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specserve.models.registry import TinySpec

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
NUM_BYTES = 256
_BUILD_LOCK = threading.Lock()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0..255 are bytes, then the special tokens. No merges."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=_byte_of))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})  # ids 256, 257, 258
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _byte_of(char: str) -> int:
    return _BYTE_OF_CHAR[char]


def _bytes_to_unicode() -> dict[str, int]:
    # GPT-2's byte <-> printable unicode table, which ByteLevel uses.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF_CHAR = _bytes_to_unicode()


def build_model(spec: TinySpec, base: Qwen2ForCausalLM | None = None) -> Qwen2ForCausalLM:
    """Random weights from `spec.seed`; with `base`, copy its matching weights and add seeded noise."""
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=NUM_BYTES + SPECIAL_TOKENS.index("<|im_end|>"),
        pad_token_id=NUM_BYTES,
        dtype="float32",
    )
    # the global RNG, seeded, under a lock and restored after: servers build models in threads at once
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() > 1:  # sharper than the default init, so greedy text is not one token repeated
                    param.normal_(0.0, 0.2 if param.shape[-1] == spec.hidden_size else 0.1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # later layers write little to the residual stream, so a draft made of the first layer agrees often
            if not name.startswith("model.layers.0.") and name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(spec.later_layer_scale)
        if base is not None:
            base_params = dict(base.named_parameters())
            generator = torch.Generator().manual_seed(spec.seed)
            for name, param in model.named_parameters():
                if name in base_params and base_params[name].shape[1:] == param.shape[1:]:
                    rows = min(len(param), len(base_params[name]))  # the embedding and head may differ in padding
                    source, target = base_params[name][:rows], param[:rows]
                    noise = torch.randn(target.shape, generator=generator) * source.std().clamp_min(1e-3) * spec.noise
                    target.copy_(source + noise if param.dim() > 1 else source)
        if spec.loud_padding:
            _make_padding_loud(model.lm_head.weight)
    return model.eval()


NUM_TOKEN_IDS = NUM_BYTES + len(SPECIAL_TOKENS)
LOUD_PADDING_SCALE = 4.0


def _make_padding_loud(head: torch.Tensor) -> None:
    """head: [padded vocab, hidden]. Padding row 259 + j = 4 x token row j (cycling): wherever the best token's
    logit is positive, a padding id's is four times it. Needs padding rows for every token row."""
    num_padding = len(head) - NUM_TOKEN_IDS
    if num_padding < NUM_TOKEN_IDS:
        raise ValueError(f"loud_padding needs vocab_size >= {2 * NUM_TOKEN_IDS}, got {len(head)}")
    copies = head[:NUM_TOKEN_IDS].repeat(num_padding // NUM_TOKEN_IDS + 1, 1)[:num_padding]
    head[NUM_TOKEN_IDS:] = LOUD_PADDING_SCALE * copies
