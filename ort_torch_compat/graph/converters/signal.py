"""Signal processing: window functions, DFT, STFT and MelWeightMatrix (opset 17+)."""

from __future__ import annotations

import math

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .casting import torch_dtype


class Window(OnnxModule):
    """Hann/Hamming/Blackman windows as ONNX defines them (Hamming with 25/46 and 21/46)."""

    def __init__(self, kind: str, periodic: bool, dtype: torch.dtype):
        super().__init__()
        self.kind, self.periodic, self.dtype = kind, periodic, dtype

    def forward(self, size: torch.Tensor) -> torch.Tensor:
        n = int(size.reshape(-1)[0])
        denominator = n if self.periodic else n - 1
        k = torch.arange(n, dtype=torch.float64)
        angle = 2 * math.pi * k / denominator
        if self.kind == "hann":
            w = 0.5 - 0.5 * torch.cos(angle)
        elif self.kind == "hamming":
            w = 25 / 46 - 21 / 46 * torch.cos(angle)
        else:
            w = 0.42 - 0.5 * torch.cos(angle) + 0.08 * torch.cos(2 * angle)
        return w.to(self.dtype)


def _window(kind: str):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        return result(Window(kind, bool(a.get("periodic", 1)), torch_dtype(int(a.get("output_datatype", 1)))), node)

    return convert


register("HannWindow", 17)(_window("hann"))
register("HammingWindow", 17)(_window("hamming"))
register("BlackmanWindow", 17)(_window("blackman"))


def _complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] (real, imaginary) -> complex tensor without the last axis."""
    if x.shape[-1] == 1:
        return torch.complex(x[..., 0], torch.zeros_like(x[..., 0]))
    return torch.complex(x[..., 0], x[..., 1])


def _pairs(z: torch.Tensor) -> torch.Tensor:
    return torch.stack([z.real, z.imag], dim=-1)


class DFT(OnnxModule):
    def __init__(self, axis, inverse: bool, onesided: bool):
        super().__init__()
        self.axis, self.inverse, self.onesided = axis, inverse, onesided

    def forward(self, x: torch.Tensor, dft_length: torch.Tensor = None, axis: torch.Tensor = None) -> torch.Tensor:
        signal_axis = int(axis.reshape(-1)[0]) if axis is not None else self.axis
        signal_axis = signal_axis % x.dim()
        z = _complex(x)
        length = None if dft_length is None else int(dft_length.reshape(-1)[0])
        out = (
            torch.fft.ifft(z, n=length, dim=signal_axis)
            if self.inverse
            else torch.fft.fft(z, n=length, dim=signal_axis)
        )
        if self.onesided:
            out = out.narrow(signal_axis, 0, out.shape[signal_axis] // 2 + 1)
        return _pairs(out).to(x.dtype)


@register("DFT", 17)
def _dft17(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(DFT(int(a.get("axis", 1)), bool(a.get("inverse", 0)), bool(a.get("onesided", 0))), node)


@register("DFT", 20)
def _dft20(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(DFT(-2, bool(a.get("inverse", 0)), bool(a.get("onesided", 0))), node)


class STFT(OnnxModule):
    def __init__(self, onesided: bool):
        super().__init__()
        self.onesided = onesided

    def forward(
        self,
        signal: torch.Tensor,
        frame_step: torch.Tensor,
        window: torch.Tensor = None,
        frame_length: torch.Tensor = None,
    ) -> torch.Tensor:
        step = int(frame_step.reshape(-1)[0])
        length = int(frame_length.reshape(-1)[0]) if frame_length is not None else window.shape[0]
        z = _complex(signal)  # [batch, samples]
        frames = z.unfold(1, length, step)  # [batch, frames, length]
        if window is not None:
            frames = frames * window.to(frames.dtype)
        out = torch.fft.fft(frames, dim=-1)
        if self.onesided:
            out = out[..., : length // 2 + 1]
        return _pairs(out).to(signal.dtype)


@register("STFT", 17)
def _stft(node: OnnxNode, graph: OnnxGraph):
    return result(STFT(bool(node.attributes.get("onesided", 1))), node)


class MelWeightMatrix(OnnxModule):
    """Triangular mel filters over integer DFT bins, as the ONNX reference computes them."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, mel_bins, dft_length, sample_rate, lower_hz, upper_hz) -> torch.Tensor:
        bins, length, rate = int(mel_bins), int(dft_length), int(sample_rate)
        low = 2595 * math.log10(1 + float(lower_hz) / 700)
        high = 2595 * math.log10(1 + float(upper_hz) / 700)
        step = (high - low) / (bins + 2)
        edges = []
        for k in range(bins + 2):
            hertz = 700 * (10 ** ((k * step + low) / 2595) - 1)
            edges.append(int(((length + 1) * hertz) // rate))
        out = torch.zeros(length // 2 + 1, bins, dtype=torch.float64)
        for i in range(bins):
            left, center, right = edges[i], edges[i + 1], edges[i + 2]
            if center == left:
                out[center, i] = 1
            else:
                for j in range(left, center + 1):
                    out[j, i] = (j - left) / (center - left)
            for j in range(center, right):
                out[j, i] = (right - j) / (right - center)
        return out.to(self.dtype)


@register("MelWeightMatrix", 17)
def _mel(node: OnnxNode, graph: OnnxGraph):
    return result(MelWeightMatrix(torch_dtype(int(node.attributes.get("output_datatype", 1)))), node)
