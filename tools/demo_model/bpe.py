"""Builds the demo model's CLIP-format BPE vocabulary from the captions' word set.

The files follow CLIP's layout exactly (what transformers' CLIPTokenizer and src/tokenizers read):
  vocab.json: the 256 byte symbols (GPT-2's bytes_to_unicode order), the same 256 with "</w>", one token per
              merge (in merge order), then <|startoftext|> and <|endoftext|>;
  merges.txt: "#version: 0.2" then one "left right" pair per line, best rank first.
Merges are learnt by plain BPE over the caption words (each word weighted once): repeatedly merge the most
frequent adjacent pair (ties: the pair that sorts first) until every word is one symbol, so each caption
word is exactly one token and any other text still tokenizes into byte symbols.

CLI: python3 bpe.py OUT_DIR    writes vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json
"""
import json
import os
import sys
from collections import Counter

import shapes

BOS, EOS, EOW = "<|startoftext|>", "<|endoftext|>", "</w>"
MAX_LENGTH = 77


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table, in its canonical order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def _symbols(word, table):
    syms = [table[b] for b in word.encode("utf-8")]
    syms[-1] += EOW
    return syms


def learn_merges(words):
    table = bytes_to_unicode()
    segs = [_symbols(w, table) for w in words]
    merges = []
    while True:
        pairs = Counter()
        for s in segs:
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += 1
        if not pairs:
            return merges
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for i, s in enumerate(segs):
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == best:
                    out.append(s[j] + s[j + 1])
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            segs[i] = out


def build_vocab(merges):
    table = bytes_to_unicode()
    tokens = list(table.values()) + [c + EOW for c in table.values()] + [a + b for a, b in merges] + [BOS, EOS]
    return {t: i for i, t in enumerate(tokens)}


def apply_bpe(word, merges):
    """CLIP's BPE of one lowercase word (merge by rank); used to check the learnt merges."""
    rank = {m: i for i, m in enumerate(merges)}
    s = _symbols(word, bytes_to_unicode())
    while len(s) > 1:
        cands = [(rank[(a, b)], i) for i, (a, b) in enumerate(zip(s, s[1:])) if (a, b) in rank]
        if not cands:
            break
        _, i = min(cands)
        s = s[:i] + [s[i] + s[i + 1]] + s[i + 2:]
    return s


class CaptionTokenizer:
    """Tokenizes captions (lowercase words separated by single spaces) as CLIPTokenizer does with this vocab."""

    def __init__(self, vocab_dir):
        self.vocab = json.load(open(os.path.join(vocab_dir, "vocab.json")))
        self.bos, self.eos = self.vocab[BOS], self.vocab[EOS]

    def __call__(self, caption):
        ids = [self.bos] + [self.vocab[w + EOW] for w in caption.split()] + [self.eos]
        return ids + [self.eos] * (MAX_LENGTH - len(ids))


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    words = shapes.caption_words()
    merges = learn_merges(words)
    for w in words:  # every caption word must come out as one token
        assert apply_bpe(w, merges) == [w + EOW], (w, apply_bpe(w, merges))
    vocab = build_vocab(merges)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges))
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": EOS, "pad_token": EOS}
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(dict(special, tokenizer_class="CLIPTokenizer", model_max_length=MAX_LENGTH,
                       do_lower_case=True, clean_up_tokenization_spaces=False), f, indent=2)
    return len(vocab)


if __name__ == "__main__":
    print("vocabulary size", write(sys.argv[1] if len(sys.argv) > 1 else "tokenizer"))
