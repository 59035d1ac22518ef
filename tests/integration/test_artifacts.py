"""Model artifacts: converted weights are sha256-verified before loading (a tampered file is refused and
rebuilt from the pinned source), weights never go through pickle, and remote code runs only when asked."""

from __future__ import annotations

import builtins
import hashlib
import json
import pickle
from pathlib import Path

import pytest

from specserve.models import loading, tiny
from specserve.models.loading import MANIFEST, WEIGHTS, ModelConfig, load_model
from specserve.models.registry import PRESETS, SplitGGUF, get_preset

SPEC = SplitGGUF("specserve-testpart-", 1, "0.1.0", "fake.gguf", 10, "ab" * 32)


def converted(tmp_path: Path, content: bytes = b"weights" * 1000) -> Path:
    """A converted-preset folder as ensure_converted leaves it."""
    directory = tmp_path / "models" / "fake"
    directory.mkdir(parents=True)
    (directory / WEIGHTS).write_bytes(content)
    entry = {"sha256": hashlib.sha256(content).hexdigest(), **loading._stamp(directory / WEIGHTS)}
    manifest = {"source": SPEC.filename, "source_sha256": SPEC.sha256, "files": {WEIGHTS: entry}}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_an_unchanged_file_is_trusted_without_rehashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = converted(tmp_path)

    def no_hash(*args: object, **kwargs: object) -> str:
        raise AssertionError("an unchanged file must not be hashed again")

    monkeypatch.setattr(loading, "sha256_file", no_hash)
    assert loading._manifest_ok(directory, SPEC)


def test_a_tampered_file_of_the_same_size_is_refused(tmp_path: Path) -> None:
    directory = converted(tmp_path)
    data = bytearray((directory / WEIGHTS).read_bytes())
    data[100] ^= 0xFF  # same size: only the hash can tell
    (directory / WEIGHTS).write_bytes(bytes(data))
    assert not loading._manifest_ok(directory, SPEC)


def test_a_rewritten_but_identical_file_is_rehashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = converted(tmp_path)
    (directory / WEIGHTS).write_bytes((directory / WEIGHTS).read_bytes())  # new ctime, same content
    calls = []
    real = loading.sha256_file
    monkeypatch.setattr(loading, "sha256_file", lambda path: calls.append(path) or real(path))
    assert loading._manifest_ok(directory, SPEC) and loading._manifest_ok(directory, SPEC)
    assert len(calls) == 1, "the verification is recorded, so the second load does not hash again"


def test_a_tampered_conversion_is_rebuilt_from_the_verified_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ensure_converted never returns refused weights: it converts again from the pinned GGUF."""
    directory = converted(tmp_path)
    (directory / WEIGHTS).write_bytes(b"x" * len((directory / WEIGHTS).read_bytes()))
    rebuilt = []

    def ensure_gguf(spec: SplitGGUF, where: Path, progress: bool = True) -> Path:
        rebuilt.append(spec)
        raise RuntimeError("stop here: the refused weights were not used")

    monkeypatch.setattr(loading, "ensure_gguf", ensure_gguf)
    preset = PRESETS["qwen2.5-coder-0.5b"]
    fake = type(preset)("fake", "test", SPEC)
    with pytest.raises(RuntimeError, match="refused weights"):
        loading.ensure_converted(fake, tmp_path)
    assert rebuilt == [SPEC]


def _tiny_dir(directory: Path) -> Path:
    preset = get_preset("tiny")
    assert preset is not None
    model = tiny.build_model(preset.source)  # type: ignore[arg-type]
    model.config.save_pretrained(directory)
    tiny.build_tokenizer().save_pretrained(directory)
    return directory


class _Payload:
    """Unpickling this creates `marker`: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return builtins.open, (str(self.marker), "w")


def test_pickle_checkpoints_are_refused_unread(tmp_path: Path) -> None:
    directory = _tiny_dir(tmp_path / "pickled")
    marker = tmp_path / "unpickled"
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed_tokens.weight": _Payload(marker)}))
    with pytest.raises(OSError, match="safetensors"):
        load_model(ModelConfig(str(directory), device="cpu", dtype="float32"), progress=False)
    assert not marker.exists(), "the pickle was unpickled"


def test_the_same_model_as_safetensors_loads(tmp_path: Path) -> None:
    """The control: the refusal above is about the format, not the folder."""
    directory = _tiny_dir(tmp_path / "safe")
    preset = get_preset("tiny")
    tiny.build_model(preset.source).save_pretrained(directory)  # type: ignore[union-attr, arg-type]
    assert (directory / "model.safetensors").is_file()
    loaded = load_model(ModelConfig(str(directory), device="cpu", dtype="float32"), progress=False)
    assert (loaded.vocab_size, loaded.padded_vocab_size) == (259, 260)  # the tokenizer's ids, the logits width


def test_remote_code_is_not_run_unless_asked(tmp_path: Path) -> None:
    directory = _tiny_dir(tmp_path / "remote")
    preset = get_preset("tiny")
    tiny.build_model(preset.source).save_pretrained(directory)  # type: ignore[union-attr, arg-type]
    marker = tmp_path / "ran"
    (directory / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (directory / "config.json").write_text(json.dumps(config))
    assert ModelConfig("x").trust_remote_code is False
    # a known architecture: transformers' own code loads it, the shipped code is ignored
    loaded = load_model(ModelConfig(str(directory), device="cpu", dtype="float32"), progress=False)
    assert type(loaded.model).__module__.startswith("transformers.models.qwen2")
    # an architecture only the shipped code knows: refused
    config["model_type"] = "evil"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises((ValueError, KeyError)):
        load_model(ModelConfig(str(directory), device="cpu", dtype="float32"), progress=False)
    assert not marker.exists(), "code shipped with the model ran"


def test_trust_remote_code_is_off_in_every_entry_point() -> None:
    from deploy.config import load_config
    from specserve.cli import _deploy_config, _engine_config, build_parser

    parser = build_parser()
    assert _engine_config(parser.parse_args(["generate", "x"])).target.trust_remote_code is False
    config = _deploy_config(parser.parse_args(["serve"]))
    assert config.target.model.trust_remote_code is False and config.draft is not None
    assert config.draft.model.trust_remote_code is False
    assert load_config(None).target.model.trust_remote_code is False


def test_no_shipped_module_unpickles() -> None:
    root = Path(__file__).resolve().parents[2]
    for package in ("specserve", "protos", "draft_service", "target_service", "orchestrator", "deploy"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            for needle in ("import pickle", "torch.load(", "pickle.load", "weights_only=False"):
                assert needle not in text, f"{path.relative_to(root)} uses {needle}"
