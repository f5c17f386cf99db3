"""Real architectures, built from torchvision / transformers code and configs with random
weights (nothing is downloaded), for the real-architecture suite and the benchmark.

Each recipe builds a torch model and example inputs at one of two sizes: ``"test"`` (tiny
inputs, so the differential suite stays within the CI budget) and ``"bench"`` (the sizes
the benchmark times).  Everything is seeded, so the same torch version exports the same
ONNX graph; the tests never rebuild models (they replay committed artifacts), only the
fixture and benchmark scripts do.

Usage from a script or test::

    from ort_torch_compat.testing import real_arch_models as zoo
    recipe = zoo.RECIPES["resnet18"]
    built = recipe.build("test")        # Built(model, inputs, input_kinds, frozen, export_training, ...)

Needs torchvision and transformers (``pip install -e ".[zoo]"``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

if TYPE_CHECKING:
    import torch

SIZES = ("test", "bench", "large")
# "large": the compute-bound size of the GPU benchmark, a BERT-base-shaped encoder (hidden 768,
# 12 layers, 12 heads, FFN 3072) at batch 32, sequence 128; Hugging Face recipes only.
_LARGE_TOKENS = (32, 128)


@dataclasses.dataclass
class Built:
    """A model ready for ``torch.onnx.export`` plus what the artifact recipe needs to know.

    ``inputs``: ordered (name, example tensor, kind, high) where kind is the scenario's input
    kind (``normal``, ``int`` with values in ``[0, high)``, ``mask`` = all ones int64).
    ``frozen``: predicate over torch parameter names that go to ``frozen_params``
    (everything else that is a parameter is trainable).
    ``loss``: ``"ce"`` (output is (N, C) logits) or ``"mse"``.
    ``export_training``: export in training mode (BatchNorm with batch statistics).
    """

    model: "torch.nn.Module"
    inputs: List[Tuple[str, "torch.Tensor", str, int]]
    loss: str
    frozen: Callable[[str], bool] = lambda name: False
    export_training: bool = True
    classes: int = 0


@dataclasses.dataclass
class Recipe:
    name: str
    family: str  # "cnn", "transformer", "rnn", "unet"
    build_fn: Callable[[str], Built]
    # ORT 1.19.2 on CPU cannot train it (no kernel for a gradient op): verified against a
    # float64 replay instead of ORT.
    ort_trains: bool = True
    note: str = ""

    def build(self, size: str = "test") -> Built:
        import torch

        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        torch.manual_seed(0)
        return self.build_fn(size)


# ---------------------------------------------------------------- helpers
def _images(size: str, test_hw: int = 64, bench_hw: int = 64, test_batch: int = 4, bench_batch: int = 8):
    """Test size 64x64, batch 4: the last BatchNorms of the stride-32 torchvision CNNs see 16
    values per channel.  At 32x32 with batch 2 they see 2, and float32 results are chaotic
    already in the first loss (README, real architectures)."""
    import torch

    if size == "large":
        raise ValueError("the 'large' size is defined for the Hugging Face recipes only")
    hw, batch = (test_hw, test_batch) if size == "test" else (bench_hw, bench_batch)
    return torch.randn(batch, 3, hw, hw)


def _tokens(size: str, vocab: int, test=(2, 8), bench=(8, 64)):
    import torch

    batch, seq = {"test": test, "bench": bench, "large": _LARGE_TOKENS}[size]
    return torch.randint(0, vocab, (batch, seq))


def _hf_wrapper(model, keys: Sequence[str], flatten_tokens: bool):
    import torch

    class HFLogits(torch.nn.Module):
        """Positional inputs -> logits; token logits (B, S, V) flattened to (B*S, V), the
        class-last layout ORT's CrossEntropyLoss block expects."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            logits = self.model(**dict(zip(keys, args))).logits
            return logits.reshape(-1, logits.shape[-1]) if flatten_tokens else logits

    return HFLogits()


# ---------------------------------------------------------------- torchvision CNNs
def _mobilenet_v2(size: str) -> Built:
    import torchvision

    model = torchvision.models.mobilenet_v2(num_classes=10, dropout=0.0)
    # ORT's own on-device training tutorial: only the classifier trains.
    return Built(
        model,
        [("x", _images(size), "normal", 0)],
        "ce",
        frozen=lambda name: not name.startswith("classifier."),
        classes=10,
    )


def _resnet18(size: str) -> Built:
    import torchvision

    return Built(torchvision.models.resnet18(num_classes=10), [("x", _images(size), "normal", 0)], "ce", classes=10)


def _efficientnet_b0(size: str) -> Built:
    import torchvision

    # stochastic depth and dropout off: their random masks cannot be compared across runtimes
    model = torchvision.models.efficientnet_b0(num_classes=10, dropout=0.0, stochastic_depth_prob=0.0)
    return Built(model, [("x", _images(size), "normal", 0)], "ce", classes=10)


# ---------------------------------------------------------------- Hugging Face transformers
_VOCAB = 128


def _hf_sizes(size: str) -> Dict[str, int]:
    return {
        "test": {"hidden": 32, "layers": 2, "heads": 2, "ffn": 64},
        "bench": {"hidden": 128, "layers": 2, "heads": 4, "ffn": 256},
        "large": {"hidden": 768, "layers": 12, "heads": 12, "ffn": 3072},
    }[size]


def _bert(size: str) -> Built:
    import torch
    import transformers

    s = _hf_sizes(size)
    config = transformers.BertConfig(
        vocab_size=_VOCAB,
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=s["ffn"],
        max_position_embeddings=128,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = _hf_wrapper(transformers.BertForSequenceClassification(config), ["input_ids", "attention_mask"], False)
    ids = _tokens(size, _VOCAB)
    return Built(
        model, [("input_ids", ids, "int", _VOCAB), ("attention_mask", torch.ones_like(ids), "mask", 0)], "ce", classes=3
    )


def _distilbert(size: str) -> Built:
    import torch
    import transformers

    s = _hf_sizes(size)
    config = transformers.DistilBertConfig(
        vocab_size=_VOCAB,
        dim=s["hidden"],
        n_layers=s["layers"],
        n_heads=s["heads"],
        hidden_dim=s["ffn"],
        max_position_embeddings=128,
        num_labels=4,
        dropout=0.0,
        attention_dropout=0.0,
        seq_classif_dropout=0.0,
    )
    model = _hf_wrapper(
        transformers.DistilBertForSequenceClassification(config), ["input_ids", "attention_mask"], False
    )
    ids = _tokens(size, _VOCAB)
    return Built(
        model, [("input_ids", ids, "int", _VOCAB), ("attention_mask", torch.ones_like(ids), "mask", 0)], "ce", classes=4
    )


def _gpt2(size: str) -> Built:
    import transformers

    s = _hf_sizes(size)
    config = transformers.GPT2Config(
        vocab_size=_VOCAB,
        n_embd=s["hidden"],
        n_layer=s["layers"],
        n_head=s["heads"],
        n_positions=128,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = _hf_wrapper(transformers.GPT2LMHeadModel(config), ["input_ids"], True)
    return Built(model, [("input_ids", _tokens(size, _VOCAB), "int", _VOCAB)], "ce", classes=_VOCAB)


def _llama(size: str) -> Built:
    import transformers

    s = _hf_sizes(size)
    config = transformers.LlamaConfig(
        vocab_size=_VOCAB,
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=max(1, s["heads"] // 2),
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = _hf_wrapper(transformers.LlamaForCausalLM(config), ["input_ids"], True)
    return Built(model, [("input_ids", _tokens(size, _VOCAB), "int", _VOCAB)], "ce", classes=_VOCAB)


def _t5_encoder(size: str) -> Built:
    import torch
    import transformers

    s = _hf_sizes(size)
    config = transformers.T5Config(
        vocab_size=_VOCAB,
        d_model=s["hidden"],
        d_kv=s["hidden"] // s["heads"],
        d_ff=s["ffn"],
        num_layers=s["layers"],
        num_heads=s["heads"],
        dropout_rate=0.0,
    )

    class T5Classifier(torch.nn.Module):
        """T5's encoder (RMSNorm, relative position bias) with a mean-pooled classifier head."""

        def __init__(self):
            super().__init__()
            self.encoder = transformers.T5EncoderModel(config)
            self.head = torch.nn.Linear(s["hidden"], 3)

        def forward(self, input_ids, attention_mask):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.head(hidden.mean(dim=1))

    ids = _tokens(size, _VOCAB)
    return Built(
        T5Classifier(),
        [("input_ids", ids, "int", _VOCAB), ("attention_mask", torch.ones_like(ids), "mask", 0)],
        "ce",
        classes=3,
    )


def _vit(size: str) -> Built:
    import transformers

    s = _hf_sizes(size)
    image = 16 if size == "test" else 32
    config = transformers.ViTConfig(
        image_size=image,
        patch_size=4,
        num_channels=3,
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=s["ffn"],
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = _hf_wrapper(transformers.ViTForImageClassification(config), ["pixel_values"], False)
    return Built(model, [("pixel_values", _images(size, image, image), "normal", 0)], "ce", classes=10)


def _lora(size: str) -> Built:
    """A frozen pre-trained-style attention encoder with trainable low-rank adapters on the
    query and value projections (the LoRA recipe): only the adapters and the head train."""
    import torch

    s = _hf_sizes(size)
    d, rank = s["hidden"], 4

    class LoRALinear(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear):
            super().__init__()
            self.base = base
            self.lora_a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
            self.lora_b = torch.nn.Parameter(torch.randn(base.out_features, rank) * 0.1)

        def forward(self, x):
            return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t() * 2.0

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = LoRALinear(torch.nn.Linear(d, d)), torch.nn.Linear(d, d)
            self.v, self.o = LoRALinear(torch.nn.Linear(d, d)), torch.nn.Linear(d, d)
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.ff = torch.nn.Sequential(torch.nn.Linear(d, s["ffn"]), torch.nn.GELU(), torch.nn.Linear(s["ffn"], d))

        def forward(self, x):
            b, t, _ = x.shape
            heads = s["heads"]

            def split(y):
                return y.reshape(b, t, heads, d // heads).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            attn = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
            x = self.ln1(x + self.o((attn @ v).transpose(1, 2).reshape(b, t, d)))
            return self.ln2(x + self.ff(x))

    class LoRAClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(_VOCAB, d)
            self.blocks = torch.nn.Sequential(Block(), Block())
            self.head = torch.nn.Linear(d, 3)

        def forward(self, ids):
            return self.head(self.blocks(self.embed(ids)).mean(dim=1))

    model = LoRAClassifier()
    return Built(
        model,
        [("input_ids", _tokens(size, _VOCAB), "int", _VOCAB)],
        "ce",
        frozen=lambda name: not (".lora_" in name or name.startswith("head.")),
        classes=3,
    )


# ---------------------------------------------------------------- RNNs and U-Net
def _lstm_classifier(size: str, bidirectional: bool = False) -> Built:
    import torch

    hidden = 32 if size == "test" else 128

    class LSTMClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(_VOCAB, hidden)
            self.lstm = torch.nn.LSTM(hidden, hidden, batch_first=True, bidirectional=bidirectional)
            self.head = torch.nn.Linear(hidden * (2 if bidirectional else 1), 4)

        def forward(self, ids):
            out, _ = self.lstm(self.embed(ids))
            return self.head(out[:, -1, :])

    return Built(LSTMClassifier(), [("input_ids", _tokens(size, _VOCAB), "int", _VOCAB)], "ce", classes=4)


def _unet(size: str) -> Built:
    """Two-level U-Net: Conv/BN/ReLU encoder, ConvTranspose up-sampling, skip concatenation,
    per-pixel regression (MSE)."""
    import torch
    from torch import nn

    width = 8 if size == "test" else 32

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1, self.down2 = block(3, width), block(width, width * 2)
            self.pool = nn.MaxPool2d(2)
            self.mid = block(width * 2, width * 4)
            self.up2 = nn.ConvTranspose2d(width * 4, width * 2, 2, stride=2)
            self.dec2 = block(width * 4, width * 2)
            self.up1 = nn.ConvTranspose2d(width * 2, width, 2, stride=2)
            self.dec1 = block(width * 2, width)
            self.out = nn.Conv2d(width, 1, 1)

        def forward(self, x):
            d1 = self.down1(x)
            d2 = self.down2(self.pool(d1))
            m = self.mid(self.pool(d2))
            u2 = self.dec2(torch.cat([self.up2(m), d2], dim=1))
            u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
            return self.out(u1)

    return Built(UNet(), [("x", _images(size, 16, 64), "normal", 0)], "mse")


RECIPES: Dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("mobilenet_v2", "cnn", _mobilenet_v2, note="torchvision; frozen backbone (ORT's tutorial recipe)"),
        Recipe("resnet18", "cnn", _resnet18, note="torchvision"),
        Recipe("efficientnet_b0", "cnn", _efficientnet_b0, note="torchvision; SiLU, squeeze-excitation"),
        Recipe("bert", "transformer", _bert, note="transformers BertForSequenceClassification, attention mask"),
        Recipe("distilbert", "transformer", _distilbert, note="transformers DistilBertForSequenceClassification"),
        Recipe("gpt2", "transformer", _gpt2, note="transformers GPT2LMHeadModel, causal LM"),
        Recipe("llama", "transformer", _llama, note="transformers LlamaForCausalLM: RMSNorm, rotary, GQA"),
        Recipe(
            "t5_encoder",
            "transformer",
            _t5_encoder,
            ort_trains=False,
            note="transformers T5EncoderModel: RMSNorm, relative bias; ORT 1.19.2's gradient graph for the "
            "broadcast position bias fails its own shape inference (Unsqueeze_Grad/Squeeze)",
        ),
        Recipe("vit", "transformer", _vit, note="transformers ViTForImageClassification"),
        Recipe("lora", "transformer", _lora, note="frozen attention encoder, trainable LoRA adapters"),
        Recipe("lstm", "rnn", _lstm_classifier, note="Embedding + LSTM text classifier"),
        Recipe(
            "bilstm",
            "rnn",
            lambda size: _lstm_classifier(size, bidirectional=True),
            ort_trains=False,
            note="bidirectional LSTM: ORT 1.19.2 CPU has no bidirectional LSTMGrad",
        ),
        Recipe(
            "unet",
            "unet",
            _unet,
            ort_trains=False,
            note="ConvTranspose: ORT 1.19.2 CPU has no ConvTransposeGrad kernel",
        ),
    ]
}
