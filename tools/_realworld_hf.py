"""Hugging Face transformers models of the real-world suite, each built from its Config class at a small size
(random weights, nothing downloaded) with the model's default attention implementation: text encoders and
decoders fed token ids and a padded attention mask, audio encoders, CLIP, SegFormer and DETR."""

from __future__ import annotations

import transformers as hf
from _realworld_spec import Dynamic, Feed, Outputs, Spec
from torch import nn
from transformers.models.whisper.modeling_whisper import WhisperEncoder

VOCAB = 100
SEQ = 16
TEXT = [Feed("input_ids", (1, SEQ), "ids", VOCAB), Feed("attention_mask", (1, SEQ), "mask")]
# Text and audio: batch and sequence length vary. Exported at the max shape, inputshape2 at a smaller one.
TEXT_DYNAMIC = Dynamic(
    max_shapes=[(2, SEQ), (2, SEQ)],
    inputshape2=[(1, 8), (1, 8)],
    cases=[[(2, SEQ), (2, SEQ)], [(1, 8), (1, 8)], [(2, 11), (2, 11)], [(1, SEQ), (1, SEQ)]],
    what="batch, sequence",
)
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _special_tokens() -> dict[str, int]:
    # The configs' defaults are ids of the full vocabularies; at 100 tokens they must lie inside it.
    return {"bos_token_id": VOCAB - 2, "eos_token_id": VOCAB - 1, "pad_token_id": 0,
            "decoder_start_token_id": VOCAB - 2}


def _text(model: nn.Module, field: str = "last_hidden_state", **call_kwargs) -> nn.Module:
    return Outputs(model.eval(), ["input_ids", "attention_mask"], [field], **call_kwargs)


def bert() -> nn.Module:
    return _text(hf.BertModel(hf.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL),
                              add_pooling_layer=False))


def distilbert() -> nn.Module:
    cfg = hf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                              max_position_embeddings=64)
    return _text(hf.DistilBertModel(cfg))


def roberta() -> nn.Module:
    # Position ids come from the token ids (cumsum over the non-padding tokens), not from a buffer.
    return _text(hf.RobertaModel(hf.RobertaConfig(vocab_size=VOCAB, max_position_embeddings=64, **SMALL),
                                 add_pooling_layer=False))


def albert() -> nn.Module:
    # One set of layer weights shared by every layer, and a factorised embedding (16 -> 32).
    cfg = hf.AlbertConfig(vocab_size=VOCAB, embedding_size=16, max_position_embeddings=64, **SMALL)
    return _text(hf.AlbertModel(cfg, add_pooling_layer=False))


def gpt2() -> nn.Module:
    # Conv1D projections (addmm), causal + padding mask, LM head tied to the token embedding.
    cfg = hf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, **_special_tokens())
    return _text(hf.GPT2LMHeadModel(cfg), "logits", use_cache=False)


def llama() -> nn.Module:
    # RMSNorm, rotary position embeddings, grouped-query attention (4 query heads, 2 key/value heads), SwiGLU.
    cfg = hf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return _text(hf.LlamaForCausalLM(cfg), "logits", use_cache=False)


def t5_encoder() -> nn.Module:
    # T5's RMS layer norm, relative position buckets (log-spaced) as an attention bias, no attention scaling.
    cfg = hf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16)
    return _text(hf.T5EncoderModel(cfg))


def clip_text() -> nn.Module:
    # Causal + padding mask, quick-GELU, pooled output gathered at each row's end-of-text token (argmax of ids).
    cfg = hf.CLIPTextConfig(vocab_size=VOCAB, max_position_embeddings=SEQ, **_special_tokens(), **SMALL)
    return Outputs(hf.CLIPTextModel(cfg).eval(), ["input_ids", "attention_mask"],
                   ["last_hidden_state", "pooler_output"])


def clip_vision() -> nn.Module:
    cfg = hf.CLIPVisionConfig(image_size=32, patch_size=8, **SMALL)
    return Outputs(hf.CLIPVisionModel(cfg).eval(), ["pixel_values"], ["last_hidden_state", "pooler_output"])


def whisper_encoder() -> nn.Module:
    # Two conv1d stems (the second strided), sinusoidal positions, pre-norm blocks; 80 mel bins, 64 frames.
    cfg = hf.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                           encoder_ffn_dim=64, num_mel_bins=80, max_source_positions=32, **_special_tokens())
    return Outputs(WhisperEncoder(cfg).eval(), ["input_features"], ["last_hidden_state"])


def wav2vec2() -> nn.Module:
    # Raw audio: a strided conv1d feature extractor with group norm, a grouped conv positional embedding
    # (weight-normed), then post-norm transformer blocks.
    cfg = hf.Wav2Vec2Config(vocab_size=VOCAB, conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group",
                            **SMALL)
    return Outputs(hf.Wav2Vec2Model(cfg).eval(), ["input_values"], ["last_hidden_state"])


def segformer() -> nn.Module:
    # Overlapping patch embeddings, efficient attention with spatial reduction, Mix-FFN (depthwise conv), and an
    # all-MLP decoder that upsamples every stage to the first one's size.
    cfg = hf.SegformerConfig(num_encoder_blocks=4, depths=[1, 1, 1, 1], hidden_sizes=[8, 8, 16, 24],
                             num_attention_heads=[1, 1, 2, 2], sr_ratios=[8, 4, 2, 1], decoder_hidden_size=16,
                             num_labels=5)
    return Outputs(hf.SegformerForSemanticSegmentation(cfg).eval(), ["pixel_values"], ["logits"])


def detr() -> nn.Module:
    # A small ResNet backbone (frozen batch norm), sine position embeddings from the pixel mask, a transformer
    # encoder-decoder with learned object queries, class and box heads.
    backbone = hf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 16, 16], depths=[1, 1, 1, 1],
                               layer_type="basic", out_features=["stage4"])
    cfg = hf.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone,
                        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_queries=10,
                        num_labels=5)
    return Outputs(hf.DetrForObjectDetection(cfg).eval(), ["pixel_values"], ["logits", "pred_boxes"])


def _dyn_one(max_shape: tuple[int, ...], second: tuple[int, ...], cases: list[tuple[int, ...]], what: str) -> Dynamic:
    """The Dynamic of a model with one input."""
    return Dynamic([max_shape], [second], [[c] for c in cases], what)


def _text_spec(name: str, family: str, arch: str, build) -> Spec:
    return Spec(name, family, arch, build, TEXT, dynamic=TEXT_DYNAMIC)


AUDIO_FRAMES = Feed("input_features", (1, 80, 64))
AUDIO_RAW = Feed("input_values", (1, 1600))
PIXELS_32 = Feed("pixel_values", (1, 3, 32, 32))
PIXELS_64 = Feed("pixel_values", (1, 3, 64, 64))

SPECS = [
    _text_spec("bert", "text-encoder", "BERT: hidden 32, 2 layers, 2 heads, 16 tokens with padding", bert),
    _text_spec("distilbert", "text-encoder", "DistilBERT: dim 32, 2 layers, 2 heads", distilbert),
    _text_spec("roberta", "text-encoder", "RoBERTa: hidden 32, 2 layers; positions from the token ids", roberta),
    _text_spec("albert", "text-encoder", "ALBERT: embedding 16 -> hidden 32, 2 layers sharing weights", albert),
    _text_spec("gpt2", "decoder", "GPT-2 LM head: n_embd 32, 2 layers, Conv1D, tied embedding", gpt2),
    _text_spec("llama", "decoder", "LLaMA causal LM: hidden 32, 2 layers, RMSNorm, rotary, GQA 4/2 heads", llama),
    _text_spec("t5_encoder", "text-encoder", "T5 encoder: d_model 32, 2 layers, relative position buckets",
               t5_encoder),
    _text_spec("clip_text", "multimodal", "CLIP text: hidden 32, 2 layers, causal mask, EOS pooling", clip_text),
    Spec("clip_vision", "multimodal", "CLIP vision: 32x32 image, patch 8, hidden 32, 2 layers", clip_vision,
         [PIXELS_32]),
    Spec("whisper_encoder", "audio", "Whisper encoder: 80 mel bins x 64 frames, d_model 32, 2 layers",
         whisper_encoder, [AUDIO_FRAMES],
         # The encoder checks the frame count against its position table, so only the batch varies.
         dynamic=_dyn_one((3, 80, 64), (1, 80, 64), [(3, 80, 64), (1, 80, 64), (2, 80, 64)], "batch")),
    Spec("wav2vec2", "audio", "wav2vec2: 1600 samples, conv feature extractor 16 wide, hidden 32, 2 layers",
         wav2vec2, [AUDIO_RAW],
         dynamic=_dyn_one((2, 2400), (1, 1600), [(2, 2400), (1, 1600), (2, 2000), (1, 2400)],
                          "batch, samples")),
    Spec("segformer", "segmentation", "SegFormer (MiT layout): 64x64, dims 8-24, decoder 16, 5 classes", segformer,
         [PIXELS_64],
         dynamic=_dyn_one((2, 3, 96, 96), (1, 3, 64, 64),
                          [(2, 3, 96, 96), (1, 3, 64, 64), (1, 3, 64, 96), (2, 3, 32, 32)], "batch, image size")),
    Spec("detr", "detection", "DETR: ResNet backbone 8-16, d_model 16, 1+1 layers, 10 queries", detr, [PIXELS_64],
         dynamic=_dyn_one((2, 3, 96, 96), (1, 3, 64, 64),
                          [(2, 3, 96, 96), (1, 3, 64, 64), (1, 3, 64, 96)], "batch, image size")),
]
