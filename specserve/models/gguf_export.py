"""Write a transformers Qwen2 model as a float32 GGUF file without a vocabulary, so the llama.cpp engine can
run the tiny test models (whose byte tokenizer llama.cpp need not know: it sees token ids only)."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
from transformers import Qwen2ForCausalLM

_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                   "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name for a transformers Qwen2 parameter name."""
    if hf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[hf_name]
    prefix, layer, rest = hf_name.split(".", 3)[1:]
    if prefix != "layers" or rest not in _LAYER_TENSORS:
        raise ValueError(f"no GGUF name for {hf_name}")
    return f"blk.{layer}.{_LAYER_TENSORS[rest]}"


def write_qwen2_gguf(model: Qwen2ForCausalLM, path: Path) -> None:
    """Write `model` in float32 to `path` (atomically: a reader never sees a partial file)."""
    config = model.config
    staging = path.with_name(path.name + f".{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(staging, "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, tensor in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        writer.add_tensor(gguf_name(name), tensor.detach().float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(staging, path)
