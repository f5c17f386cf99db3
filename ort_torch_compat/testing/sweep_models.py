"""The architecture sweep's model list (scripts/architecture_sweep.py): architectures the
project did not design, from torchvision factories and Hugging Face transformers classes,
shrunk through their own configs (tiny widths, 1-2 layers, 32-64 px images, 8-token texts)
with random weights: nothing is downloaded.

Every entry builds ``Case(model, inputs, classes)``: ``model(*inputs)`` returns logits of
shape (N, classes), the class-last layout ORT's CrossEntropyLoss block takes (token logits
are flattened to (batch*seq, vocab)); dropout and stochastic depth are off, so ORT, ours and
the float64 eager referee compute the same function.  Models that need a package which is
not installed are skipped by the caller (``ImportError``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple

VOCAB = 64
TEXT = (2, 8)  # batch, sequence


@dataclasses.dataclass
class Case:
    model: "object"  # torch.nn.Module
    inputs: List[Tuple[str, "object"]]  # (name, example tensor)
    classes: int
    source: str = ""


def _zero_dropout(model):
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for attribute in ("p", "drop_prob", "stochastic_depth_prob"):
            if attribute != "p" and isinstance(getattr(module, attribute, None), float):
                setattr(module, attribute, 0.0)
        if type(module).__name__ == "StochasticDepth":
            module.p = 0.0
    return model


def _images(batch: int = 4, hw: int = 64, channels: int = 3):
    import torch

    return torch.randn(batch, channels, hw, hw)


def _tokens():
    import torch

    return torch.randint(0, VOCAB, TEXT)


# ---------------------------------------------------------------- torchvision
def _tv(factory: str, hw: int = 64, batch: int = 4, **kwargs) -> Callable[[], Case]:
    def build() -> Case:
        import torchvision

        model = getattr(torchvision.models, factory)(num_classes=5, **kwargs)
        return Case(_zero_dropout(model), [("x", _images(batch, hw))], 5, f"torchvision.models.{factory}")

    return build


def _tv_class(path: str, hw: int = 64, batch: int = 4, **kwargs) -> Callable[[], Case]:
    """A torchvision model class with a shrunk configuration (the factory's sizes are too big)."""

    def build() -> Case:
        import importlib

        module_name, class_name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module_name), class_name)
        resolved = {k: (v() if callable(v) else v) for k, v in kwargs.items()}
        model = cls(num_classes=5, **resolved)
        return Case(_zero_dropout(model), [("x", _images(batch, hw))], 5, f"{path} (shrunk config)")

    return build


def _convnext_blocks():
    from torchvision.models.convnext import CNBlockConfig

    return [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]


def _resnet_small():
    from torchvision.models.resnet import BasicBlock

    return BasicBlock


def _effv2_blocks():
    from torchvision.models.efficientnet import FusedMBConvConfig, MBConvConfig

    return [FusedMBConvConfig(1, 3, 1, 8, 8, 1), FusedMBConvConfig(4, 3, 2, 8, 16, 1), MBConvConfig(4, 3, 2, 16, 24, 1)]


# ---------------------------------------------------------------- transformers
def _zero_config_dropout(config):
    for key, value in list(config.to_dict().items()):
        if isinstance(value, float) and (
            "dropout" in key
            or "pdrop" in key
            or key.endswith("drop_rate")
            or key == "drop_path_rate"
            or key.endswith("_drop")
        ):
            setattr(config, key, 0.0)
    return config


class _Logits:
    """Wraps a Hugging Face model: positional inputs -> logits (flattened over tokens)."""

    @staticmethod
    def make(model, keys: Sequence[str], flatten: bool, pool_head: int = 0, hidden: int = 0, output: str = "logits"):
        import torch

        class HFLogits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model
                self.head = torch.nn.Linear(hidden, pool_head) if pool_head else None

            def forward(self, *args):
                out = self.model(**dict(zip(keys, args)))
                if self.head is not None:
                    hidden_states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
                    if hidden_states.dim() == 4:  # (N, C, H, W) feature maps
                        return self.head(hidden_states.mean(dim=(2, 3)))
                    return self.head(hidden_states.mean(dim=1))
                logits = getattr(out, output)
                return logits.reshape(-1, logits.shape[-1]) if flatten else logits

        return HFLogits()


def _hf(
    config_name: str,
    model_name: str,
    kind: str,
    classes: int = 5,
    pool: bool = False,
    hidden: int = 32,
    keys: Sequence[str] = (),
    attn_eager: bool = True,
    **config_kwargs,
) -> Callable[[], Case]:
    """kind: ``lm`` (causal/masked LM, token logits over VOCAB), ``seq`` (sequence classifier),
    ``image`` (image classifier, 32 px), ``audio`` (raw waveform), ``features`` (mel features)."""

    def build() -> Case:
        import torch
        import transformers

        config_cls = getattr(transformers, config_name)
        if attn_eager:
            config_kwargs.setdefault("attn_implementation", "eager")
        if kind in ("seq", "image", "audio", "features") and not pool:
            config_kwargs.setdefault("num_labels", classes)
        config = _zero_config_dropout(config_cls(**config_kwargs))
        model = getattr(transformers, model_name)(config)
        model = _zero_dropout(model)
        if kind in ("lm", "seq"):
            ids = _tokens()
            names = list(keys) or ["input_ids"]
            inputs = [("input_ids", ids)] + [(n, torch.ones_like(ids)) for n in names[1:]]
        elif kind == "image":
            names = list(keys) or ["pixel_values"]
            inputs = [
                ("pixel_values", _images(2, config_kwargs.get("image_size", 32), config_kwargs.get("num_channels", 3)))
            ]
        elif kind == "audio":
            names = list(keys) or ["input_values"]
            inputs = [("input_values", torch.randn(2, 400))]
        elif kind == "features":
            names = list(keys) or ["input_features"]
            inputs = [
                (
                    "input_features",
                    torch.randn(2, config_kwargs["num_mel_bins"], 2 * config_kwargs["max_source_positions"]),
                )
            ]
        else:
            raise ValueError(kind)
        flatten = kind == "lm" and not pool
        wrapped = _Logits.make(model, names, flatten, classes if pool else 0, hidden)
        out_classes = VOCAB if kind == "lm" and not pool else classes
        return Case(wrapped, inputs, out_classes, f"transformers.{model_name}")

    return build


_BERTLIKE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
_VISION = dict(
    image_size=32,
    patch_size=8,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
)


ARCHS: Dict[str, Callable[[], Case]] = {
    # ---- torchvision factories (5 classes, 64 px, batch 4): the last BatchNorms of stride-32 nets see
    # 16 values a channel; at 32 px they see 4, and float32 rounding alone then moves the 3-step
    # losses of resnet34/50 by 10-40% (measured), which leaves nothing to compare
    "tv_resnet18": _tv("resnet18"),
    "tv_resnet34": _tv("resnet34"),
    "tv_resnet50": _tv("resnet50"),
    "tv_resnext50_32x4d": _tv("resnext50_32x4d"),
    "tv_mobilenet_v2": _tv("mobilenet_v2"),
    "tv_mobilenet_v3_small": _tv("mobilenet_v3_small"),
    "tv_mobilenet_v3_large": _tv("mobilenet_v3_large"),
    "tv_squeezenet1_0": _tv("squeezenet1_0"),
    "tv_squeezenet1_1": _tv("squeezenet1_1"),
    "tv_shufflenet_v2_x0_5": _tv("shufflenet_v2_x0_5"),
    "tv_efficientnet_b0": _tv("efficientnet_b0"),
    "tv_regnet_y_400mf": _tv("regnet_y_400mf"),
    "tv_regnet_x_400mf": _tv("regnet_x_400mf"),
    "tv_mnasnet0_5": _tv("mnasnet0_5"),
    "tv_densenet121": _tv("densenet121"),
    "tv_googlenet": _tv("googlenet", aux_logits=False, init_weights=True),
    "tv_alexnet_shrunk": _tv_class("torchvision.models.alexnet.AlexNet", hw=64, batch=2),
    # ---- torchvision classes with shrunk configurations
    "tv_resnet_1111": _tv_class("torchvision.models.resnet.ResNet", block=_resnet_small, layers=[1, 1, 1, 1]),
    "tv_convnext_small_cfg": _tv_class(
        "torchvision.models.convnext.ConvNeXt", block_setting=_convnext_blocks, stochastic_depth_prob=0.0
    ),
    "tv_efficientnet_v2_cfg": _tv_class(
        "torchvision.models.efficientnet.EfficientNet",
        inverted_residual_setting=_effv2_blocks,
        dropout=0.0,
        stochastic_depth_prob=0.0,
        last_channel=64,
    ),
    "tv_vit_cfg": _tv_class(
        "torchvision.models.vision_transformer.VisionTransformer",
        hw=32,
        batch=2,
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
    ),
    "tv_swin_cfg": _tv_class(
        "torchvision.models.swin_transformer.SwinTransformer",
        patch_size=[4, 4],
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 2],
        window_size=[4, 4],
        stochastic_depth_prob=0.0,
    ),
    "tv_maxvit_cfg": _tv_class(
        "torchvision.models.maxvit.MaxVit",
        hw=32,
        input_size=(32, 32),
        stem_channels=8,
        partition_size=2,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.0,
    ),
    # ---- transformers: encoders (sequence classification, 8 tokens)
    "hf_bert": _hf(
        "BertConfig", "BertForSequenceClassification", "seq", keys=["input_ids", "attention_mask"], **_BERTLIKE
    ),
    "hf_distilbert": _hf(
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        "seq",
        keys=["input_ids", "attention_mask"],
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=64,
    ),
    "hf_roberta": _hf(
        "RobertaConfig",
        "RobertaForSequenceClassification",
        "seq",
        keys=["input_ids", "attention_mask"],
        pad_token_id=1,
        **dict(_BERTLIKE, max_position_embeddings=72),
    ),
    "hf_albert": _hf("AlbertConfig", "AlbertForSequenceClassification", "seq", embedding_size=16, **_BERTLIKE),
    "hf_electra": _hf("ElectraConfig", "ElectraForSequenceClassification", "seq", embedding_size=16, **_BERTLIKE),
    "hf_mpnet": _hf("MPNetConfig", "MPNetForSequenceClassification", "seq", attn_eager=False, **_BERTLIKE),
    "hf_deberta_v2": _hf("DebertaV2Config", "DebertaV2ForSequenceClassification", "seq", attn_eager=False, **_BERTLIKE),
    "hf_squeezebert": _hf(
        "SqueezeBertConfig",
        "SqueezeBertForSequenceClassification",
        "seq",
        attn_eager=False,
        embedding_size=32,
        **_BERTLIKE,
    ),
    "hf_mobilebert": _hf(
        "MobileBertConfig",
        "MobileBertForSequenceClassification",
        "seq",
        attn_eager=False,
        embedding_size=16,
        intra_bottleneck_size=16,
        true_hidden_size=16,
        num_feedforward_networks=1,
        **dict(_BERTLIKE, hidden_size=32),
    ),
    "hf_convbert": _hf(
        "ConvBertConfig", "ConvBertForSequenceClassification", "seq", attn_eager=False, embedding_size=32, **_BERTLIKE
    ),
    "hf_roformer": _hf(
        "RoFormerConfig", "RoFormerForSequenceClassification", "seq", attn_eager=False, embedding_size=32, **_BERTLIKE
    ),
    "hf_ernie": _hf("ErnieConfig", "ErnieForSequenceClassification", "seq", **_BERTLIKE),
    "hf_xlm_roberta": _hf(
        "XLMRobertaConfig",
        "XLMRobertaForSequenceClassification",
        "seq",
        pad_token_id=1,
        **dict(_BERTLIKE, max_position_embeddings=72),
    ),
    "hf_megatron_bert": _hf("MegatronBertConfig", "MegatronBertForSequenceClassification", "seq", **_BERTLIKE),
    "hf_funnel": _hf(
        "FunnelConfig",
        "FunnelForSequenceClassification",
        "seq",
        attn_eager=False,
        vocab_size=VOCAB,
        block_sizes=[1, 1],
        d_model=32,
        n_head=2,
        d_head=16,
        d_inner=64,
    ),
    "hf_fnet": _hf(
        "FNetConfig",
        "FNetForSequenceClassification",
        "seq",
        attn_eager=False,
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "hf_nystromformer": _hf(
        "NystromformerConfig",
        "NystromformerForSequenceClassification",
        "seq",
        attn_eager=False,
        num_landmarks=4,
        segment_means_seq_len=8,
        **dict(_BERTLIKE, max_position_embeddings=72),
    ),
    "hf_t5_encoder": _hf(
        "T5Config",
        "T5EncoderModel",
        "seq",
        pool=True,
        vocab_size=VOCAB,
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
    ),
    "hf_bart_encoder": _hf(
        "BartConfig",
        "BartModel",
        "seq",
        pool=True,
        keys=["input_ids"],
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    ),
    "hf_clip_text": _hf(
        "CLIPTextConfig", "CLIPTextModel", "seq", pool=True, **dict(_BERTLIKE, max_position_embeddings=16)
    ),
    # ---- transformers: decoders (causal LM, token logits over the 64-word vocabulary)
    "hf_gpt2": _hf(
        "GPT2Config", "GPT2LMHeadModel", "lm", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64
    ),
    "hf_gpt_neo": _hf(
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        "lm",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        max_position_embeddings=64,
        window_size=4,
    ),
    "hf_gpt_neox": _hf(
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        "lm",
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "hf_gptj": _hf(
        "GPTJConfig",
        "GPTJForCausalLM",
        "lm",
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        rotary_dim=8,
        n_positions=64,
    ),
    "hf_gpt_bigcode": _hf(
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        "lm",
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
    ),
    "hf_codegen": _hf(
        "CodeGenConfig",
        "CodeGenForCausalLM",
        "lm",
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=2,
        rotary_dim=8,
        n_positions=64,
        n_ctx=64,
    ),
    "hf_opt": _hf(
        "OPTConfig",
        "OPTForCausalLM",
        "lm",
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=64,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    ),
    "hf_bloom": _hf("BloomConfig", "BloomForCausalLM", "lm", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2),
    "hf_llama": _hf("LlamaConfig", "LlamaForCausalLM", "lm", **_DECODER),
    "hf_mistral": _hf("MistralConfig", "MistralForCausalLM", "lm", **_DECODER),
    "hf_qwen2": _hf("Qwen2Config", "Qwen2ForCausalLM", "lm", **_DECODER),
    "hf_qwen3": _hf("Qwen3Config", "Qwen3ForCausalLM", "lm", head_dim=8, **_DECODER),
    "hf_phi": _hf("PhiConfig", "PhiForCausalLM", "lm", **_DECODER),
    "hf_phi3": _hf("Phi3Config", "Phi3ForCausalLM", "lm", pad_token_id=0, **_DECODER),
    "hf_gemma": _hf("GemmaConfig", "GemmaForCausalLM", "lm", head_dim=8, **_DECODER),
    "hf_gemma2": _hf("Gemma2Config", "Gemma2ForCausalLM", "lm", head_dim=8, **_DECODER),
    "hf_stablelm": _hf("StableLmConfig", "StableLmForCausalLM", "lm", **_DECODER),
    "hf_falcon": _hf(
        "FalconConfig",
        "FalconForCausalLM",
        "lm",
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        new_decoder_architecture=False,
        multi_query=True,
    ),
    "hf_olmo": _hf("OlmoConfig", "OlmoForCausalLM", "lm", **_DECODER),
    "hf_granite": _hf("GraniteConfig", "GraniteForCausalLM", "lm", **_DECODER),
    # ---- transformers: vision (32 px, 5 classes)
    "hf_vit": _hf("ViTConfig", "ViTForImageClassification", "image", **_VISION),
    "hf_deit": _hf("DeiTConfig", "DeiTForImageClassification", "image", **_VISION),
    "hf_beit": _hf("BeitConfig", "BeitForImageClassification", "image", use_mean_pooling=True, **_VISION),
    "hf_dinov2": _hf("Dinov2Config", "Dinov2ForImageClassification", "image", **_VISION),
    "hf_swin": _hf(
        "SwinConfig",
        "SwinForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    "hf_convnext": _hf(
        "ConvNextConfig",
        "ConvNextForImageClassification",
        "image",
        attn_eager=False,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_stages=2,
        image_size=32,
    ),
    "hf_convnextv2": _hf(
        "ConvNextV2Config",
        "ConvNextV2ForImageClassification",
        "image",
        attn_eager=False,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_stages=2,
        image_size=32,
    ),
    "hf_resnet": _hf(
        "ResNetConfig",
        "ResNetForImageClassification",
        "image",
        attn_eager=False,
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        image_size=32,
    ),
    "hf_regnet": _hf(
        "RegNetConfig",
        "RegNetForImageClassification",
        "image",
        attn_eager=False,
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        groups_width=8,
        image_size=32,
    ),
    "hf_mobilevit": _hf(
        "MobileViTConfig",
        "MobileViTForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
    ),
    "hf_mobilenet_v2": _hf(
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        depth_multiplier=0.35,
    ),
    "hf_segformer": _hf(
        "SegformerConfig",
        "SegformerForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
    ),
    "hf_poolformer": _hf(
        "PoolFormerConfig",
        "PoolFormerForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        depths=[1, 1],
        hidden_sizes=[16, 32],
        num_encoder_blocks=2,
        patch_sizes=[7, 3],
        strides=[4, 2],
        padding=[2, 1],
        mlp_ratio=2.0,
    ),
    "hf_levit": _hf(
        "LevitConfig",
        "LevitForImageClassification",
        "image",
        attn_eager=False,
        image_size=32,
        hidden_sizes=[32, 48],
        num_attention_heads=[2, 3],
        depths=[1, 1],
        key_dim=[8, 8],
        mlp_ratio=[2, 2],
        attention_ratio=[2, 2],
        down_ops=[["Subsample", 8, 32 // 8, 4, 2, 2]],
    ),
    "hf_clip_vision": _hf("CLIPVisionConfig", "CLIPVisionModel", "image", pool=True, **_VISION),
    "hf_siglip_vision": _hf("SiglipVisionConfig", "SiglipVisionModel", "image", pool=True, **_VISION),
    # ---- transformers: audio
    "hf_wav2vec2": _hf(
        "Wav2Vec2Config",
        "Wav2Vec2ForSequenceClassification",
        "audio",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=16,
        mask_time_prob=0.0,
    ),
    "hf_hubert": _hf(
        "HubertConfig",
        "HubertForSequenceClassification",
        "audio",
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=16,
        mask_time_prob=0.0,
    ),
    "hf_whisper_encoder": _hf(
        "WhisperConfig",
        "WhisperForAudioClassification",
        "features",
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=8,
        max_source_positions=16,
        classifier_proj_size=16,
    ),
}
