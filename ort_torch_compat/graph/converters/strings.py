"""String ops (eval and inference graphs).  Strings are numpy arrays here: torch has no
string tensors, so these ops run on the host and cannot be part of a training graph (the
Module refuses them there, naming them; see graph.builder)."""

from __future__ import annotations

import re

import numpy as np
import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result

STRING_OPS = frozenset({"StringNormalizer", "RegexFullMatch", "StringConcat", "StringSplit"})


class StringNormalizer(OnnxModule):
    def __init__(self, case_action: str, case_sensitive: bool, stopwords):
        super().__init__()
        self.case_action, self.case_sensitive = case_action, case_sensitive
        self.stopwords = set(stopwords) if case_sensitive else {w.lower() for w in stopwords}

    def forward(self, x):
        words = np.asarray(x).astype(np.str_)
        flat = words.reshape(-1)
        keep = [w for w in flat if (w if self.case_sensitive else w.lower()) not in self.stopwords]
        if self.case_action == "LOWER":
            keep = [w.lower() for w in keep]
        elif self.case_action == "UPPER":
            keep = [w.upper() for w in keep]
        out = np.array(keep or [""], dtype=np.str_)
        return out.reshape(1, -1) if words.ndim == 2 else out


@register("StringNormalizer", 10)
def _string_normalizer(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    stopwords = a.get("stopwords", [])
    stopwords = stopwords if isinstance(stopwords, list) else []
    return result(
        StringNormalizer(a.get("case_change_action", "NONE"), bool(a.get("is_case_sensitive", 0)), stopwords), node
    )


class RegexFullMatch(OnnxModule):
    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def forward(self, x) -> torch.Tensor:
        words = np.asarray(x).astype(np.str_)
        matches = np.vectorize(lambda w: self.pattern.fullmatch(w) is not None, otypes=[bool])(words)
        return torch.from_numpy(np.asarray(matches, dtype=bool))


@register("RegexFullMatch", 20)
def _regex(node: OnnxNode, graph: OnnxGraph):
    return result(RegexFullMatch(node.attributes["pattern"]), node)


class StringConcat(OnnxModule):
    def forward(self, x, y):
        return np.char.add(np.asarray(x).astype(np.str_), np.asarray(y).astype(np.str_))


@register("StringConcat", 20)
def _string_concat(node: OnnxNode, graph: OnnxGraph):
    return result(StringConcat(), node)


class StringSplit(OnnxModule):
    def __init__(self, delimiter, maxsplit, outputs: int):
        super().__init__()
        self.delimiter, self.outputs = delimiter or None, outputs  # None: split on whitespace runs
        self.maxsplit = -1 if maxsplit is None else maxsplit

    def forward(self, x):
        words = np.asarray(x).astype(np.str_)
        parts = [w.split(self.delimiter, self.maxsplit) for w in words.reshape(-1)]
        width = max((len(p) for p in parts), default=0)
        table = np.full((len(parts), width), "", dtype=object)
        for row, pieces in enumerate(parts):
            table[row, : len(pieces)] = pieces
        out = table.astype(np.str_).reshape(*words.shape, width)
        counts = torch.tensor([len(p) for p in parts], dtype=torch.int64).reshape(words.shape)
        return (out, counts) if self.outputs > 1 else out


@register("StringSplit", 20)
def _string_split(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(StringSplit(a.get("delimiter", ""), a.get("maxsplit"), len(node.output_values)), node)


class TfIdfVectorizer(OnnxModule):
    """Counts the pool's n-grams (with up to max_skip_count skipped elements between their
    items) in each row of int or string tokens; TF, IDF (presence x weight) or TFIDF."""

    def __init__(self, attributes):
        super().__init__()
        a = attributes
        pool = list(a.get("pool_int64s", None) or a.get("pool_strings", None) or [])
        counts = list(a["ngram_counts"]) + [len(pool)]
        self.columns = {}
        ngram_id = 0
        for n, (start, end) in enumerate(zip(counts, counts[1:]), 1):
            for offset in range(start, end, n):
                self.columns[(n, tuple(pool[offset : offset + n]))] = a["ngram_indexes"][ngram_id]
                ngram_id += 1
        self.size = max(a["ngram_indexes"]) + 1
        self.weights = list(a.get("weights", []) or [1.0] * self.size)
        self.mode, self.min_n, self.max_n = a["mode"], int(a["min_gram_length"]), int(a["max_gram_length"])
        self.max_skip = int(a["max_skip_count"])

    def forward(self, x) -> torch.Tensor:
        tokens = x.tolist() if isinstance(x, torch.Tensor) else np.asarray(x).astype(np.str_).tolist()
        rows = tokens if tokens and isinstance(tokens[0], list) else [tokens]
        counts = np.zeros((len(rows), self.size), dtype=np.float32)
        for r, row in enumerate(rows):
            for n in range(self.min_n, self.max_n + 1):
                for skip in range(1 if n == 1 else self.max_skip + 1):  # a unigram has no gaps to skip
                    step = skip + 1
                    for start in range(len(row) - (n - 1) * step):
                        column = self.columns.get((n, tuple(row[start : start + (n - 1) * step + 1 : step])))
                        if column is not None:
                            counts[r, column] += 1
        if self.mode == "IDF":
            counts = (counts > 0) * np.asarray(self.weights, dtype=np.float32)
        elif self.mode == "TFIDF":
            counts = counts * np.asarray(self.weights, dtype=np.float32)
        out = torch.from_numpy(counts)
        return out if tokens and isinstance(tokens[0], list) else out[0]


@register("TfIdfVectorizer", 9)
def _tfidf(node: OnnxNode, graph: OnnxGraph):
    return result(TfIdfVectorizer(node.attributes), node)
